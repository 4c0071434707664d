"""Mamba-1 (selective state space) language models: prefill.onnx (three scan lowerings) +
step.onnx with explicit conv/SSM state. The declaration the registry reads (torch-free)."""

import click

from seqexport.families.base import Family
from seqexport.families.recurrent import GRAPHS

LOWERINGS = ("loop", "unrolled", "parallel")  # the scan lowerings of families/mamba/scan.py
HF_MODEL_TYPES = ("mamba", "falcon_mamba")  # transformers' Mamba-1 layouts (layouts.py reads both)


def _detect(config: dict) -> bool:
    """The public Mamba-1 layouts: transformers' model_type (Mamba or Falcon-Mamba), or the
    state-spaces config whose layer is Mamba-1 (its default; `ssm_cfg.layer: Mamba2` is the
    mamba2 family's)."""
    if "model_type" in config:
        return config["model_type"] in HF_MODEL_TYPES
    ssm_cfg = config.get("ssm_cfg")
    layer = ssm_cfg.get("layer", "Mamba1") if isinstance(ssm_cfg, dict) else "Mamba1"
    return layer == "Mamba1" and ("ssm_cfg" in config or {"d_model", "n_layer"} <= set(config))


FAMILY = Family(
    name="mamba",
    package=__name__,
    graphs=GRAPHS,
    presets={
        "tiny": dict(d_model=64, n_layer=2, d_state=16, vocab_size=100),
        # the mamba-130m shape
        "130m": dict(d_model=768, n_layer=24, d_state=16, vocab_size=50280),
    },
    config_fields=dict(vocab_size=1, d_model=1, n_layer=1, d_state=1, d_conv=1, expand=1),
    bundled="mamba-dates",
    int8_keep_float=("*.mixer.x_proj", "*.mixer.dt_proj"),  # they make Δ, B and C of the scan
    detect=_detect,
    public_layouts="transformers' model_type 'mamba' or 'falcon_mamba', or a state-spaces Mamba-1 config",
    export_options=(
        click.option("--scan", type=click.Choice(LOWERINGS), default="loop", show_default=True,
                     help="Lowering of the selective scan in the prefill graph."),
        click.option("--seq-len", type=click.IntRange(min=1), help="Fixed prefill length (--scan unrolled only)."),
    ),
    out_suffix=lambda options: f"-{options.get('scan') or 'loop'}",
    summary="Export a Mamba LM: prefill.onnx + step.onnx with explicit conv/SSM state.",
)
