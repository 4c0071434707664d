"""`seqexport export transformer|mamba` click commands (thin: the work is in the export modules)."""

import click

from seqexport.export import DEFAULT_OPSET

_common = [
    click.option("--checkpoint", type=click.Path(), help="Checkpoint folder (config.json + weights)."),
    click.option("--out", type=click.Path(file_okay=False), help="Output folder [exported/<name>]."),
    click.option("--opset", type=click.IntRange(17, 23), default=DEFAULT_OPSET, show_default=True,
                 help="ONNX opset."),
    click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
                 help="Weights and activations dtype of the graphs."),
    click.option("--overwrite", is_flag=True, help="Replace an existing output folder."),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of a preset's random weights."),
]


def _with_common(f):
    for opt in reversed(_common):
        f = opt(f)
    return f


def default_name(family, ckpt, preset):
    """exported/<name>: the preset's or the checkpoint folder's name, led by the family."""
    name = preset if preset else ckpt.path.name
    return name if name.startswith(family) else f"{family}-{name}"


def _default_out(family, ckpt, preset):
    return f"exported/{default_name(family, ckpt, preset)}"


def register(group: click.Group) -> None:
    @group.command()
    @_with_common
    @click.option("--preset", type=click.Choice(["tiny", "base"]), help="Random weights of a named shape.")
    def transformer(checkpoint, out, opset, dtype, overwrite, seed, preset):
        """Export an encoder-decoder Transformer: encoder.onnx + decoder.onnx (explicit KV cache).

        Without --checkpoint or --preset, the bundled trained model (else the tiny preset).
        """
        from seqexport.checkpoints.io import checkpoint_extra
        from seqexport.checkpoints.presets import resolve_model
        from seqexport.families.transformer.export import export_transformer

        ckpt, preset = resolve_model("transformer", checkpoint, preset, seed)
        export_transformer(ckpt, preset, out or _default_out("transformer", ckpt, preset), opset=opset,
                           dtype=dtype, overwrite=overwrite, tokenizer=checkpoint_extra(ckpt, "tokenizer"))

    @group.command()
    @_with_common
    @click.option("--preset", type=click.Choice(["tiny", "130m"]), help="Random weights of a named shape.")
    @click.option("--scan", type=click.Choice(["loop", "unrolled", "parallel"]), default="loop",
                  show_default=True, help="Lowering of the selective scan in the prefill graph.")
    @click.option("--seq-len", type=click.IntRange(min=1), help="Fixed prefill length (--scan unrolled only).")
    def mamba(checkpoint, out, opset, dtype, overwrite, seed, preset, scan, seq_len):
        """Export a Mamba LM: prefill.onnx + step.onnx with explicit conv/SSM state.

        Without --checkpoint or --preset, the bundled trained model (else the tiny preset).
        """
        from seqexport.checkpoints.io import checkpoint_extra
        from seqexport.checkpoints.presets import resolve_model
        from seqexport.families.mamba.export import export_mamba

        ckpt, preset = resolve_model("mamba", checkpoint, preset, seed)
        export_mamba(ckpt, preset, out or _default_out("mamba", ckpt, preset) + f"-{scan}", scan=scan,
                     seq_len=seq_len, opset=opset, dtype=dtype, overwrite=overwrite,
                     tokenizer=checkpoint_extra(ckpt, "tokenizer"))
