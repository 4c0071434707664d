"""`seqexport export <family>`: one command per registered family (thin: the work is in each
family's export module)."""

import click

from seqexport import families
from seqexport.cli.group import export
from seqexport.export import DEFAULT_OPSET
from seqexport.export.naming import default_out, vocab_limit

_common = [
    click.option("--checkpoint", type=click.Path(),
                 help="Checkpoint folder (config.json + weights), or a bare weights file a family reads."),
    click.option("--out", type=click.Path(file_okay=False), help="Output folder [exported/<name>]."),
    click.option("--opset", type=click.IntRange(17, 23), default=DEFAULT_OPSET, show_default=True,
                 help="ONNX opset."),
    click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
                 help="Weights and activations dtype of the graphs."),
    click.option("--overwrite", is_flag=True, help="Replace an existing output folder."),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of a preset's random weights."),
]


def _command(family: families.Family) -> click.Command:
    def run(checkpoint, out, opset, dtype, overwrite, seed, preset, **options):
        from seqexport.checkpoints import resolve_model
        from seqexport.checkpoints.tokenizers import checkpoint_tokenizer

        ckpt, preset = resolve_model(family.name, checkpoint, preset, seed)
        tokenizer = checkpoint_tokenizer(ckpt, vocab_limit(ckpt.config.to_dict()))
        family.export.export(ckpt, preset, out or default_out(family, ckpt, preset, options), opset=opset,
                             dtype=dtype, overwrite=overwrite, tokenizer=tokenizer, **options)

    run.__doc__ = (f"{family.summary}\n\n"
                   "Without --checkpoint or --preset, the bundled trained model (else the tiny preset).")
    options = [*_common,
               click.option("--preset", type=click.Choice(list(family.presets)),
                            help="Random weights of a named shape."),
               *family.export_options]
    for opt in reversed(options):
        run = opt(run)
    return click.command(family.name)(run)


for _family in families.REGISTRY.values():
    export.add_command(_command(_family))
