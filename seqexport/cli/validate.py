"""`seqexport validate`: parity of an exported folder with its eager model."""

import json
import sys

import click

from seqexport.cli.group import check_output_path, cli
from seqexport.runtime.runners import RUNTIMES


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--checkpoint", type=click.Path(), help="Eager checkpoint to compare with [the manifest's].")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--runtime", type=click.Choice(RUNTIMES), default=RUNTIMES[0], show_default=True,
              help="What runs the graphs: ONNX Runtime, or OpenVINO's CPU (the openvino extra).")
@click.option("--atol", type=click.FloatRange(min=0), help="Absolute tolerance [by dtype: 1e-4 for float32].")
@click.option("--rtol", type=click.FloatRange(min=0), help="Relative tolerance [by dtype: 1e-3 for float32].")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Decode steps.")
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True, help="Batch of the decodes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option("--min-top1", type=click.FloatRange(0, 1), help="int8 exports: teacher-forced top-1 agreement [0.95].")
@click.option("--min-tokens", type=click.FloatRange(0, 1),
              help="int8 exports: share of the free-running picks that are eager's argmax on the same prefix [0.75].")
@click.option("--reference", type=click.Path(file_okay=False),
              help="A folder another tool exported (no manifest.json of ours): the transformers checkpoint "
                   "to judge it against (docs/validate-other-tools.md).")
@click.option("--io-map", "io_map", type=click.Path(dir_okay=False),
              help="With --reference: a JSON file naming the graphs' roles, for a folder no adapter recognises.")
def validate(folder, checkpoint, provider, runtime, atol, rtol, steps, batch, seed, report_path, min_top1,
             min_tokens, reference, io_map):
    """Prove parity of an exported FOLDER with its eager model; exit 1 if any check fails.

    Checks every graph at several shapes, a teacher-forced decode against the eager
    full forward, and a free-running greedy decode; names the first diverging module.
    A FOLDER another tool made (Optimum, transformers.js-style, --io-map) is judged
    against --reference, transformers' model, by the two decodes.
    """
    from seqexport.foreign.route import foreign_folder
    from seqexport.parity.validate import validate as run_validate

    check_output_path(report_path, "--report")
    log = lambda msg: click.echo(msg, err=True)  # noqa: E731
    if foreign_folder(folder, reference, io_map, checkpoint):
        from seqexport.foreign.validate import validate_foreign

        report = validate_foreign(folder, reference, io_map, runtime=runtime, provider=provider, atol=atol, rtol=rtol,
                                  steps=steps, batch=batch, seed=seed, log=log, min_top1=min_top1, min_tokens=min_tokens)
    else:
        report = run_validate(folder, checkpoint=checkpoint, provider=provider, atol=atol, rtol=rtol,
                              steps=steps, batch=batch, seed=seed, log=log, min_top1=min_top1, min_tokens=min_tokens,
                              runtime=runtime)
    click.echo(report.table())
    if report_path:
        with open(report_path, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    sys.exit(0 if report.passed else 1)
