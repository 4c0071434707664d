"""`seqexport inspect`: what an exported folder holds."""

import json

import click

from seqexport.cli.group import cli


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print manifest.json itself (for machines).")
def inspect(folder, as_json):
    """Describe an exported FOLDER: source, tokenizer, graphs with I/O names and dims, last parity."""
    from seqexport.manifest import describe, read_manifest

    m = read_manifest(folder, verify=False)
    click.echo(json.dumps(m, indent=2) if as_json else describe(folder, m))
