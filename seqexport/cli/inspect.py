"""`seqexport inspect`: what an exported folder holds."""

import json
import os

import click

from seqexport.cli.group import cli


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print manifest.json itself (for machines).")
@click.option("--io-map", "io_map", type=click.Path(dir_okay=False),
              help="For a folder another tool made: the JSON map of its graphs' roles (as validate takes it).")
def inspect(folder, as_json, io_map):
    """Describe an exported FOLDER: source, tokenizer, graphs with I/O names and dims, last parity.

    A folder another tool made: the adapter chosen and its map of roles, state kinds and layouts."""
    from seqexport.manifest import MANIFEST, describe, read_manifest

    if io_map is not None or (os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, MANIFEST))):
        from seqexport.foreign.adapters import choose

        found = choose(folder, io_map)
        click.echo(json.dumps(found.to_dict(), indent=2) if as_json else found.describe())
        return
    m = read_manifest(folder, verify=False)
    click.echo(json.dumps(m, indent=2) if as_json else describe(folder, m))
