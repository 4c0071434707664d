"""The README's main job: export the default models and check them."""

from pathlib import Path

import click


def run_demo(out: str = "exported") -> None:
    from seqexport.export.transformer import export_transformer
    from seqexport.presets import resolve_model

    ckpt, preset = resolve_model("transformer", None, None)
    folder = Path(out) / "transformer-default"
    export_transformer(ckpt, preset, folder, overwrite=True)
    click.echo(f"exported {folder}")
