"""Hybrid attention + Mamba-2, Mamba-1, short-convolution or Gated DeltaNet language models (IBM
Granite-4.0-H and Bamba, NVIDIA Nemotron-H, TII Falcon-H1, Liquid AI LFM2, LFM2-MoE and LFM3, AI21 Jamba,
Qwen3.5, Qwen3-Next, AI2 OLMo-hybrid, Zyphra Zamba2): prefill.onnx +
step.onnx over one state of two kinds — an appended KV cache in the attention layers and
replaced conv/SSM tensors in the others. The declaration the registry reads
(torch-free)."""

import click

from seqexport.families.attention import ATTENTIONS
from seqexport.families.base import Family
from seqexport.families.hybrid.presets import PRESETS
from seqexport.families.recurrent import GRAPHS

EXPERT_FORMS = ("kernel", "dense")  # families/hybrid/experts.py (torch-free here)
MODEL_TYPES = ("bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "lfm2", "lfm2_moe", "jamba", "qwen3_5",
               "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next",
               "olmo_hybrid", "lfm3", "zamba2", "kimi_linear", "bailing_hybrid")  # transformers' layouts read here


def _keep_float(config: dict) -> tuple[str, ...]:
    """A Mamba-2 mixer's in_proj makes Δ, B and C of the scan beside z and x: quantising it moves
    the state. A short conv's in_proj (LFM2) is quantised: its window of a few tokens forgets the
    error, as an attention layer's projections do."""
    mamba2 = tuple(f"*layers.{i}.mixer.in_proj" for i, kind in enumerate(config["layer_types"])
                   if kind in ("mamba2", "parallel", "zamba"))
    # a Mamba-1 mixer's x_proj and dt_proj make Δ, B and C (Mamba's own rule)
    mamba1 = tuple(f"*layers.{i}.mixer.{p}" for i, kind in enumerate(config["layer_types"]) if kind == "mamba"
                   for p in ("x_proj", "dt_proj"))
    # a Gated DeltaNet's in_proj makes the delta rule's keys and queries (its B and C: where the
    # state is written, erased and read), a_proj and b_proj its decay and write strength
    deltanet = tuple(f"*layers.{i}.mixer.{p}" for i, kind in enumerate(config["layer_types"]) if kind == "deltanet"
                     for p in ("in_proj", "a_proj", "b_proj"))
    # a KDA's the same, its decay's input a low-rank pair (f_a_proj, f_b_proj)
    kda = tuple(f"*layers.{i}.mixer.{p}" for i, kind in enumerate(config["layer_types"]) if kind == "kda"
                for p in (("in_proj", "f_a_proj", "f_b_proj", "b_proj") if config.get("kda_low_rank_gates", True)
                          else ("in_proj", "f_proj", "b_proj")))
    # a router picks which experts a token takes, a discrete choice a small error flips (and then
    # the layer's output is another expert's); the shared expert's gate scales its whole output.
    # Both are (E, d) and (1, d): nothing to save (llama.cpp keeps its routers float32 too)
    routing = ("*.experts.router", *(("*.shared_gate",) if config.get("gated_shared_expert") else ())) \
        if config.get("n_experts") else ()
    return mamba2 + mamba1 + deltanet + kda + routing


def _detect(config: dict) -> bool:
    return config.get("model_type") in MODEL_TYPES


FAMILY = Family(
    name="hybrid",
    package=__name__,
    graphs=GRAPHS,
    presets=PRESETS,  # tiny, and Bamba-9B's published shape (presets.py says where its numbers come from)
    config_fields=dict(vocab_size=1, d_model=1, n_kv_heads=1, head_dim=1, mamba_nheads=1, headdim=1, ngroups=1,
                       d_state=1, d_conv=1),
    bundled="hybrid-dates",
    export_options=(
        click.option("--attention", type=click.Choice(ATTENTIONS), default="matmul", show_default=True,
                     help="The attention layers': MatMul + Softmax nodes, or ONNX's fused Attention "
                          "(opset 23; a lower --opset is raised to 23)."),
        click.option("--experts", type=click.Choice(["auto", *EXPERT_FORMS]), default="auto", show_default=True,
                     help="A mixture of experts' form: ONNX Runtime's MoE kernel (gated SiLU experts: "
                          "Granite-4.0-H, Qwen3.5-MoE, Kimi-Linear, Ling 3, ...), or standard ONNX that runs "
                          "every expert (other runtimes; Nemotron-H's experts); auto: the kernel where it runs "
                          "the model's experts (clipped ones dense)."),
    ),
    int8_keep_float=_keep_float,
    detect=_detect,
    public_layouts=f"transformers' model_type {' / '.join(repr(t) for t in MODEL_TYPES)}",
    summary="Export a hybrid attention + Mamba-2 LM: prefill.onnx + step.onnx with an appended KV cache "
            "and conv/SSM state.",
)
