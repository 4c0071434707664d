"""Mamba scan lowerings at L = 1024: export time, node count, ORT prefill vs the eager reference.

    python scripts/study_lowerings.py --preset tiny --preset 130m --json docs/lowerings.json
"""

import json

import click

from seqexport.bench.lowering_study import format_rows, study


@click.command()
@click.option("--preset", "presets", multiple=True, default=["tiny"], help="Mamba preset(s): tiny, 130m.")
@click.option("--lowering", "lowerings", multiple=True, default=["loop", "unrolled", "parallel"],
              help="Lowering(s) to study.")
@click.option("--length", type=int, default=1024, show_default=True, help="Prefill length.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed repeats (median).")
@click.option("--threads", type=int, default=2, show_default=True, help="Threads for torch and ORT.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the rows here.")
def main(presets, lowerings, length, repeats, threads, json_path):
    rows = []
    for preset in presets:
        rows += study(preset, length, lowerings, repeats, threads)
        click.echo(format_rows(rows))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
