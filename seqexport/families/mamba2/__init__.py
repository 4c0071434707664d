"""Mamba-2 (SSD, state space duality) language models: prefill.onnx (the chunked SSD as plain
matrix ops, no per-token loop) + step.onnx with explicit conv/SSM state. The declaration the
registry reads (torch-free)."""

import click

from seqexport.families.base import Family
from seqexport.families.recurrent import GRAPHS


def is_mamba2_config(config: dict) -> bool:
    """The public Mamba-2 layouts: transformers' `model_type: mamba2`, or a state-spaces config
    whose `ssm_cfg` names the `Mamba2` layer (a Mamba-1 config of either layout is not)."""
    ssm_cfg = config.get("ssm_cfg")
    return config.get("model_type") == "mamba2" or (isinstance(ssm_cfg, dict) and ssm_cfg.get("layer") == "Mamba2")


FAMILY = Family(
    name="mamba2",
    package=__name__,
    graphs=GRAPHS,
    presets={
        "tiny": dict(d_model=64, n_layer=2, d_state=16, headdim=16, vocab_size=100),
        # the state-spaces/mamba2-130m shape: 50277 tokens padded to a multiple of 16
        "130m": dict(d_model=768, n_layer=24, d_state=128, headdim=64, expand=2, ngroups=1, d_conv=4,
                     vocab_size=50277, pad_vocab_size_multiple=16),
    },
    config_fields=dict(vocab_size=1, d_model=1, n_layer=1, d_state=1, d_conv=1, expand=1, headdim=1, ngroups=1),
    bundled="mamba2-dates",
    # in_proj makes Δ, B and C of the scan beside z and x: quantising it moves the state
    int8_keep_float=("*.mixer.in_proj",),
    detect=is_mamba2_config,
    public_layouts="transformers' model_type 'mamba2', or a state-spaces config with ssm_cfg.layer 'Mamba2'",
    export_options=(
        click.option("--chunk-size", type=click.IntRange(min=1), default=None,
                     help="SSD chunk length of the prefill graph [64: measured fastest on CPU]."),
        click.option("--ssd", type=click.Choice(["matmul", "linear-attention", "mixed"]), default=None,
                     help="How the SSD and the conv are written: plain ONNX ops (the chunked SSD as MatMuls), "
                          "ONNX Runtime's com.microsoft LinearAttention + CausalConvWithState kernels in both graphs, "
                          "or mixed: those kernels in the prefill, a lean plain-op step [linear-attention]."),
    ),
    summary="Export a Mamba-2 LM: prefill.onnx (chunked SSD) + step.onnx with explicit conv/SSM state.",
)
