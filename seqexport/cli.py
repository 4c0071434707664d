"""`seqexport` command line: export, validate, generate, bench, inspect, demo.

Each command is a short function over the public Python API. Errors a user can
cause (seqexport.errors) print one line on stderr and exit 2; `--debug` shows
the traceback instead.
"""

import json
import sys

import click

from seqexport.errors import SeqexportError


class _Group(click.Group):
    """Turns our typed errors into one line + exit 2 for every subcommand."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SeqexportError as e:
            if ctx.params.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.version_option(package_name="seqexport")
def cli(debug):
    """Export PyTorch sequence models to ONNX, prove parity, decode without torch."""


@cli.group(cls=_Group)
def export():
    """Export a model to an ONNX artifact folder (graphs + manifest.json)."""


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
def inspect(folder):
    """Print the manifest of an exported FOLDER: graphs, I/O names and dims."""
    from seqexport.manifest import read_manifest

    m = read_manifest(folder, verify=False)
    click.echo(f"{folder}: {m['family']} · opset {m['opset']} · {m['dtype']}")
    for name, g in m["graphs"].items():
        click.echo(f"  {name}: {g['file']} ({g['bytes'] / 1e6:.2f} MB)")
        for kind in ("inputs", "outputs"):
            for t in g[kind]:
                click.echo(f"    {kind[:-1]:6} {t['name']:40} {t['dtype']:8} {t['dims']}")
    if "parity" in m:
        click.echo("parity: " + json.dumps(m["parity"].get("summary", m["parity"])))


@cli.command()
@click.option("--out", default="exported", show_default=True, type=click.Path(file_okay=False),
              help="Folder that receives the exported models.")
def demo(out):
    """Export the default (bundled) models, validate them, and decode their held-out split."""
    from seqexport.demo import run_demo

    run_demo(out)


def main():
    cli(prog_name="seqexport")


def _register_subcommands():
    # Each command lives next to the code it drives; importing them is cheap
    # (torch is imported inside the commands that need it).
    from seqexport.export import commands as export_commands

    export_commands.register(export)


_register_subcommands()

if __name__ == "__main__":
    sys.exit(main())
