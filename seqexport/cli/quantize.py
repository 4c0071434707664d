"""`seqexport quantize`: an int8 or int4 copy of an exported folder."""

import click

from seqexport.cli.group import cli
from seqexport.errors import UsageError


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder of the quantised copy.")
@click.option("--bits", type=int, default=8, show_default=True,
              help="8: int8 weights and activations; 4: weight-only int4 (MatMulNBits, block-wise).")
@click.option("--mode", type=click.Choice(["dynamic", "static"]), default="dynamic", show_default=True,
              help="int8 only. dynamic: activations quantised on the fly (no calibration data); "
                   "static: activation ranges calibrated on the float32 model's own decodes (QDQ).")
@click.option("--calibration", type=click.Path(dir_okay=False, exists=True), default=None,
              help="static int8: a text file of prompts, one a line [seeded random token ids].")
@click.option("--per-channel", is_flag=True, help="int8: one scale per output channel of each weight.")
@click.option("--block-size", type=int, help="int4: weights per scale along the input dim (16-256, a power of 2) [32].")
@click.option("--accuracy-level", type=int,
              help="int4: MatMulNBits compute type of the activations, 4 int8, 1 float32 (0-4) [4].")
@click.option("--exclude", multiple=True, metavar="PATTERN",
              help="Keep float32 the weight MatMuls whose module path or node name matches (glob; repeat).")
@click.option("--include-head/--float-head", default=None,
              help="Quantise the output head at --bits too, or keep it float32 [int8: float32; int4: 8-bit].")
@click.option("--dense-experts", type=click.Choice(["float32", "int8"]), default="float32", show_default=True,
              help="The expert stacks of a dense-form export (Nemotron-H's, or --experts dense): float32, or int8 "
                   "dequantised as read (about 3x smaller, slower: docs/quantization.md).")
@click.option("--quantize-sensitive", is_flag=True,
              help="Quantise the family's sensitive projections too (Mamba's x_proj/dt_proj, a Mamba-2 mixer's or "
                   "Gated DeltaNet's in_proj, RWKV-7's decay LoRA): faster, less precise; validate's state drift "
                   "judges it.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder.")
def quantize(folder, out, bits, mode, calibration, per_channel, block_size, accuracy_level, exclude, include_head,
             dense_experts, quantize_sensitive, overwrite):
    """Write an int8 or int4 copy of an exported FOLDER (ONNX Runtime's quantisation tools).

    Norms, softmax, embeddings, the scans and their state and the family's sensitive
    projections stay float32 (int8: the output head too; int4 makes it 8-bit). `seqexport
    validate` judges the copy by top-1 agreement with the float32 eager model and, for
    Mamba / RWKV-7, by the drift of every state tensor over 256 steps.
    """
    from seqexport.export.quantize import check_options
    from seqexport.export.quantize import quantize as run_quantize

    # the options' mix first: a file an option does not use is refused as that, not judged
    check_options(bits, mode, per_channel, calibration, block_size, accuracy_level)
    texts = _calibration_texts(calibration) if calibration else None
    run_quantize(folder, out, bits=bits, mode=mode, per_channel=per_channel, block_size=block_size,
                 accuracy_level=accuracy_level, exclude=exclude, include_head=include_head, overwrite=overwrite,
                 calibration=texts, dense_experts=dense_experts, keep_sensitive=not quantize_sensitive,
                 log=lambda msg: click.echo(msg, err=True))


def _calibration_texts(path: str) -> list[str]:
    """The prompts of a --calibration file, one a line; UsageError for a file that holds none."""
    try:
        with open(path, encoding="utf-8") as f:
            texts = [line.rstrip("\n") for line in f if line.strip()]
    except UnicodeDecodeError as e:
        raise UsageError(f"--calibration {path}: not UTF-8 text (byte {e.start}); expected prompts, one a line") from None
    except OSError as e:
        raise UsageError(f"--calibration {path}: cannot read it: {e.strerror}") from None
    if not texts:
        raise UsageError(f"--calibration {path}: no prompts (every line is empty); expected prompts, one a line")
    return texts
