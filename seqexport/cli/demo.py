"""`seqexport demo`: the README's main job on the bundled models."""

import sys

import click

from seqexport.cli.group import cli


@cli.command()
@click.option("--out", default="exported", show_default=True, type=click.Path(file_okay=False),
              help="Folder that receives the exported models.")
@click.option("-n", "n", type=click.IntRange(min=1), default=200, show_default=True,
              help="Held-out examples to decode.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Intra-op threads for torch and ONNX Runtime alike.")
def demo(out, n, threads):
    """Export the bundled models, validate them, decode their held-out split eager vs ORT.

    Exits 1 when a parity check fails.
    """
    from seqexport.demo import run_demo

    sys.exit(0 if run_demo(out, n, threads) else 1)
