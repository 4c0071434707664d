"""`seqexport bench`: eager PyTorch vs ONNX Runtime on an exported folder."""

import json

import click

from seqexport.cli.group import check_output_path, cli


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True, help="Batch size (repeat for several) [1].")
@click.option("--context", "contexts", type=click.IntRange(min=1), multiple=True,
              help="Transformer past length / Mamba prefill length (repeat) [16 64 256 1024; --fast: 4 16].")
@click.option("--new-tokens", type=click.IntRange(min=1), help="Tokens generated end to end [32; --fast: 4].")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Intra-op threads of torch and ORT alike.")
@click.option("--repeats", type=click.IntRange(min=1), help="Timed rounds per figure; medians reported [7; --fast: 2].")
@click.option("--fast", is_flag=True, help="Small sizes and few repeats (CI).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write every figure as JSON here.")
@click.option("--baseline", type=click.Path(file_okay=False),
              help="int8/int4 FOLDER: the float32 export to time it beside [its manifest's quantization source].")
def bench(folder, provider, batches, contexts, new_tokens, threads, repeats, fast, json_path, baseline):
    """Time eager PyTorch vs ONNX Runtime on an exported FOLDER: steps, prefill, generation, memory.

    An int8 or int4 FOLDER (`seqexport quantize`) is also timed beside its float32 source."""
    from seqexport.bench.int8 import baseline_of, format_int8_table, run_int8_bench
    from seqexport.bench.run import format_table, run_bench

    check_output_path(json_path, "--json")
    source = baseline_of(folder, baseline)
    result = run_bench(folder, provider=provider, batches=batches or (1,), contexts=contexts or None,
                       new_tokens=new_tokens, threads=threads, repeats=repeats, fast=fast,
                       log=lambda msg: click.echo(msg, err=True))
    click.echo(format_table(result))
    if source is not None:
        sizes = dict(contexts=(4, 16), new_tokens=4, repeats=2, sample_s=0.002) if fast else \
            dict(contexts=contexts or (16, 64), new_tokens=new_tokens or 16, repeats=repeats or 5)
        side = run_int8_bench(folder, source, threads=threads, **sizes, log=lambda msg: click.echo(msg, err=True))
        result[f"{side['weights']}_vs_float32"] = side  # int8_vs_float32 or int4_vs_float32
        click.echo(format_int8_table(side))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
