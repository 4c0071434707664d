"""A hybrid decoder-only language model: Mamba-2, attention and MLP layers in the order the config gives.

The shape of IBM's Bamba and Granite-4.0-H (`mlp_in_layer=True`: every Mamba-2 or attention layer is
followed by its own gated MLP, two pre-norms in a layer), of NVIDIA's Nemotron-H
(`mlp_in_layer=False`: each layer is one pre-norm block, the MLPs are layers of their own) and of
TII's Falcon-H1 ("parallel" layers: attention and a Mamba-2 mixer side by side on one pre-norm,
their outputs summed, then the MLP; μP multipliers on each branch), of Liquid AI's LFM2 and
LFM2-MoE ("conv" layers: a gated short convolution, C * conv(B * x), beside attention layers whose
queries and keys are RMS-normed per head), of AI21's Jamba ("mamba" layers: a Mamba-1 mixer
beside attention without positions) and of Qwen3.5 ("deltanet" layers: a Gated DeltaNet, the
gated delta rule over a (dk, dv) state per value head, beside attention whose output is gated
by a sigmoid of a second half of q_proj), of AI2's OLMo-hybrid (Gated DeltaNets whose writes
may reflect the state, beside post-norm attention normed across its heads) and of Liquid AI's
LFM3 (short convs beside sliding-window and full attention, gated per head, sandwich-normed)
and of Zyphra's Zamba2 ("zamba" layers: a Mamba-2 layer that first calls one of a few shared
transformer blocks on cat(x, embedding), with its own adapters, and adds its output to the
mixer's input) and of Moonshot's Kimi-Linear ("kda" layers: Kimi Delta Attention, the gated delta
rule with a decay per head and key channel; "mla" layers: multi-head latent attention without
positions, whose cache is one latent and one shared key part a position) and of inclusionAI's
Ling 3 (the same kinds, the latent attention's shared key part turned by RoPE).
The Mamba-2 mixer and RMSNorm are those of `models.mamba2`,
the Mamba-1 mixer that of `models.mamba`, reused as they are.

Pieces, smallest first: RoPE helpers -> HybridConfig -> Attention -> MLP -> Experts -> the Mamba-2 mixer
adapter -> ShortConv -> the gated delta rule and GatedDeltaNet -> HybridLayer -> HybridLM, and
`append_kv` (the eager caller's KV bookkeeping).

Dimension letters (reused as ONNX dim names and runtime names):
    b     batch
    l     new tokens in this call (sequence length)
    P     past_len: slots of an attention layer's KV buffer (row r's first past_lengths[r] valid)
    d     d_model, width of the residual stream
    v     vocabulary size (padded to a multiple in the embedding)
    nh    attention query heads                  (n_heads)
    nkv   attention key/value heads, GQA         (n_kv_heads; nh // nkv query heads share one)
    hd    attention head dim                     (head_dim)
    rd    rotary dims at the front of each head  (rotary_dim = head_dim * partial_rotary_factor)
    f     MLP width                              (d_ff)
    E     experts (n_experts); fe an expert's width (d_ff_expert); k experts a token takes
    d_in  Mamba-2 mixer width = h * p            (mamba_d_inner)
    h     Mamba-2 heads; p channels per head; g groups sharing B, C; n state size;
    k     conv width; c = d_in + 2 g n conv channels (see models/mamba2.py)
    ks    a "conv" layer's short conv width (short_conv_kernel); it has d channels
    hk, hv  a "deltanet" layer's query/key and value heads; dk, dv their sizes (delta_*);
          its conv has 2 hk dk + hv dv channels, d_conv wide

State, per layer, a tuple (returned new, never written in place, so every entry point exports):
    "mamba2"     (conv_state (b, c, k), ssm_state (b, h, p, n) float32)   replaced whole each call
    "parallel"   (key, value, conv_state, ssm_state): the attention's then the mixer's
    "zamba"      (key, value, conv_state, ssm_state): its call of the shared block's attention, then
                 its mixer's (as "parallel")
    "conv"       (conv_state (b, d, ks),): the last ks inputs of the short conv     replaced whole each call
    "mamba"      (conv_state (b, d_in1, k), ssm_state (b, d_in1, n) float32): Jamba's Mamba-1 mixer,
                 d_in1 = mamba1_expand * d (see models/mamba.py)                  replaced whole each call
    "deltanet"   (conv_state (b, 2 hk dk + hv dv, d_conv), state (b, hv, dk, dv) float32): Qwen3.5's
                 Gated DeltaNet, the delta rule's state per value head          replaced whole each call
    "kda"        as "deltanet" (hk = hv): Kimi-Linear's Kimi Delta Attention   replaced whole each call
    "mla"        (latent (b, 1, P, r), rope (b, 1, P, rd)): APPENDED as "attention"'s, r = mla_kv_rank,
                 rd = mla_rope_dim: Kimi-Linear's latent attention
    "attention"  (key, value), each (b, nkv, P, hd): an APPENDED buffer. Row r's slots
                 0 .. past_lengths[r] - 1 are valid; the rest are ignored, whatever they hold.
                 Keys are stored after RoPE (as transformers' caches hold them). A call returns
                 only the new positions' (key, value), each (b, nkv, l, hd); the caller writes them
                 at slots past_lengths[r] .. past_lengths[r] + l - 1 (`append_kv` does it eagerly).
                 A sliding-window layer (`sliding_window_layers`): (key, value), each (b, nkv, W, hd),
                 W = sliding_window, its window, replaced whole each call: slot j holds position
                 past_lengths[r] - W + j (right-aligned; a negative position is no token yet).
    "mlp", "moe" ()

Mixture of experts (`n_experts` > 0): a router and E experts of width fe (the MLP's kind: gated
SiLU or squared ReLU); each token takes k = `experts_per_token` of them and gets their weighted
sum. Where it sits: Granite-4.0-H Tiny / Small (`mlp_in_layer`) beside each mamba2/attention
layer's MLP, the layer adding mlp(h) + experts(h); LFM2-MoE and Jamba (`expert_layers`) instead
of the MLP in the layers listed, the others keeping a dense MLP (Qwen3.5-MoE: in every layer, with
a shared expert MLP beside them gated by sigmoid(shared_gate(h)), `gated_shared_expert`);
Nemotron-H ("moe" layers) as a layer of its own, experts(h) + shared(h) with a shared expert MLP
of width `d_ff_shared_expert`. Routing
(`expert_routing`): "softmax" (Granite: the top k of the router's logits, weighted by the
softmax over those k; Jamba, `normalize_expert_weights` false: by the softmax over all E) or "sigmoid" (Nemotron-H, DeepSeek-V3: scores σ(logits) in float32; the
experts chosen by score + a learned bias, the top k within the best `expert_groups_per_token`
of `n_expert_groups` groups, a group scored by its best two; weighted by their scores,
normalised to sum 1 if `normalize_expert_weights`, times `routed_scaling_factor`). No state.

Parameter names (transformers-like, no `backbone.` / `model.` prefix; the checkpoint layouts map
onto them in `seqexport.families.hybrid.layouts`):
    embed_tokens.weight                                   (v, d)
    layers.{i}.norm.weight                                pre-norm of the layer's mixer
    layers.{i}.mixer.{in_proj,conv1d,out_proj}.*, .dt_bias, .A_log, .D, .norm.weight    "mamba2"
    layers.{i}.mixer.{q_proj,k_proj,v_proj,o_proj}.*                                    "attention"
    layers.{i}.mixer.* (as "mamba2"), layers.{i}.attention.{q_proj,...}.*               "parallel"
    layers.{i}.mixer.{q_norm,k_norm}.weight (hd,)                          attention with qk_norm
    layers.{i}.mixer.{in_proj,conv,out_proj}.*                                          "conv"
    layers.{i}.mixer.{in_proj,conv1d,x_proj,dt_proj,out_proj}.*, .A_log, .D,
        .{dt,b,c}_layernorm.weight (mamba1_dt_norm)                                      "mamba"
    layers.{i}.mixer.{in_proj,z_proj,b_proj,a_proj,conv1d,out_proj}.*, .dt_bias, .A_log,
        .norm.weight (dv,)                                                              "deltanet"
    layers.{i}.mixer.{in_proj,f_a_proj,f_b_proj,b_proj,g_a_proj,g_b_proj,conv1d,out_proj}.*, .dt_bias
        (h dk,), .A_log (h,), .norm.weight (dv,)                                            "kda"
    layers.{i}.mixer.{q_proj | q_a_proj,q_a_norm,q_b_proj; kv_a_proj,kv_a_norm,kv_b_proj,o_proj}.*  "mla"
    layers.{i}.mixer.q_proj (nh * 2 hd, d): each head's query rows, then its gate's   attention_output_gate
    layers.{i}.mixer.{gate_proj,up_proj,down_proj}.*                                    "mlp"
    layers.{i}.mlp_norm.weight, layers.{i}.mlp.{gate_proj,up_proj,down_proj}.*   mlp_in_layer only
    layers.{i}.experts.router.weight (E, d), .gate_up_proj (E, 2 fe, d) gate rows then up rows
    (squared ReLU: .up_proj (E, fe, d)), .down_proj (E, d, fe), .router_bias (E,) (sigmoid
    routing)                                      mlp_in_layer with n_experts > 0 ("experts")
    layers.{i}.mixer.* (the same), layers.{i}.shared.{up_proj,down_proj}.*     "moe" layers
    layers.{i}.shared.{gate_proj,up_proj,down_proj}.*, layers.{i}.shared_gate.weight (1, d)
                                                  beside the experts with gated_shared_expert
                                                  (no shared_gate with plain_shared_expert)
    layers.{i}.mixer.* (as "mamba2"), layers.{i}.linear.weight (d, d), layers.{i}.mlp_adapter.{0,1}.weight,
        layers.{i}.adapters.{q,k,v}.{0,1}.weight (LoRA: (r, in), (out, r))                  "zamba"
    shared_blocks.{b}.{norm (2 d,), attention.{q,k,v,o}_proj, mlp_norm, mlp.*}      zamba's blocks
    norm_f.weight, lm_head.weight                         (lm_head tied to embed_tokens if asked)
(`gate_proj` exists only for the gated MLP, `mlp_act="silu_gated"`.)
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from seqexport.models.config import DictConfig
from seqexport.models.mamba import MambaConfig, MambaMixer, selective_scan_ref
from seqexport.models.mamba2 import Mamba2Config, Mamba2Mixer, RMSNorm, RMSNormGated, ssd_sequential
from torch import Tensor, nn

# One layer's state (see the module docstring), and the list of them over layers.
LayerState = tuple[Tensor, ...]
Scan = Callable[..., tuple[Tensor, Tensor]]

LAYER_TYPES = ("mamba2", "attention", "mlp", "moe", "parallel", "conv", "mamba", "deltanet", "zamba", "kda", "mla")
MAMBA_KINDS = ("mamba2", "parallel", "zamba")  # layers with a Mamba-2 mixer (and conv/SSM state)
ATTENTION_KINDS = ("attention", "parallel", "zamba", "mla")  # layers with attention (and a KV cache)
DELTA_KINDS = ("deltanet", "kda")  # layers with the gated delta rule (and conv and delta-rule state)
EXPERT_ROUTINGS = ("softmax", "sigmoid")
MLP_ACTS = ("silu_gated", "relu2", "gelu_gated")


def rotate_half(x: Tensor) -> Tensor:
    """(..., rd) -> (..., rd): [x1, x2] -> [-x2, x1], the halves of the rotary dims (Llama's convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first rd dims of each head by the position's angles; the other hd - rd pass.

    x (b, heads, l, hd); cos, sin (b, 1, l, rd) in x's dtype -> (b, heads, l, hd).
    """
    rd = cos.shape[-1]
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)


@dataclass
class HybridConfig(DictConfig):
    d_model: int = 64  # width of the residual stream (d)
    vocab_size: int = 100  # real vocabulary; logits are sliced to it
    layer_types: list[str] = field(default_factory=lambda: ["mamba2", "attention", "mamba2"])  # per layer:
    # "mamba2" | "attention" | "mlp" | "moe" | "parallel" | "conv" | "mamba"; the number of layers is its length
    mlp_in_layer: bool = True  # True: each mamba2/attention layer ends with its own MLP behind a second
    # pre-norm (Bamba, Granite-4.0-H); False: one block per layer, MLPs are "mlp" layers (Nemotron-H)
    d_ff: int = 128  # MLP width (f)
    mlp_act: str = "silu_gated"  # "silu_gated": down(silu(gate(x)) * up(x)); "relu2": down(relu(up(x))^2)
    mlp_bias: bool = False  # biases in the MLP's linears
    # mixture of experts (see the module docstring); 0 = dense
    n_experts: int = 0  # experts (E)
    experts_per_token: int = 2  # experts each token takes (k), <= n_experts
    d_ff_expert: int = 128  # an expert's width (fe); an expert is an MLP of mlp_act
    expert_routing: str = "softmax"  # "softmax" (Granite) | "sigmoid" (Nemotron-H): see the docstring
    n_expert_groups: int = 1  # sigmoid routing: groups of experts
    expert_groups_per_token: int = 1  # sigmoid routing: the groups a token's experts come from
    # a token's k weights scaled to sum 1 (softmax routing: False = the top k of the softmax over all E, Jamba)
    normalize_expert_weights: bool = True
    routed_scaling_factor: float = 1.0  # sigmoid routing: the weights are then multiplied by it
    d_ff_shared_expert: int = 128  # "moe" layers: the shared expert MLP's width
    # a shared expert MLP (d_ff_shared_expert wide) beside the experts of each layer that has them,
    # its output times sigmoid(shared_gate(h)) (Qwen3.5-MoE, Qwen3-Next); needs mlp_in_layer
    gated_shared_expert: bool = False
    # the same shared expert MLP added as it is, ungated (Kimi-Linear); needs mlp_in_layer and experts
    plain_shared_expert: bool = False
    # where experts sit with mlp_in_layer: None = beside every layer's MLP (Granite); a list of layer
    # indices = instead of the MLP in those layers, the others keeping their MLP (LFM2-MoE: from
    # num_dense_layers on; Jamba: every expert_layer_period-th)
    expert_layers: list[int] | None = None
    expert_weights_eps: float = 1e-20  # sigmoid routing: added to the k weights' sum before normalising
    # per layer, its experts' SwiGLU clipped (Ling 3's late layers): silu(gate) capped at the limit L
    # and up clamped to [-L, L] before their product, down(min(silu(g), L) * clamp(u, -L, L)); 0 = not
    # clipped; None = no layer. Needs gated SiLU experts.
    expert_swiglu_limits: list[float] | None = None
    shared_swiglu_limits: list[float] | None = None  # the same for the shared expert MLP beside them
    # attention
    n_heads: int = 4  # query heads (nh)
    n_kv_heads: int = 2  # key/value heads (nkv), must divide n_heads (grouped-query attention)
    head_dim: int = 16  # per head (hd)
    rope: bool = True  # rotary position embedding; False = no positions at all (NoPE)
    rope_theta: float = 10000.0  # RoPE base
    partial_rotary_factor: float = 1.0  # rotate the first head_dim * this dims of each head (Bamba 0.5)
    # rotate instead the first head_dim * this / 2 dims of each half of the head, pair (j, j + hd / 2)
    # at theta^(-2j / hd): transformers' "proportional" RoPE (LFM3's full-attention layers)
    rope_proportional: bool = False
    # attention layers that see only the last sliding_window positions, their own included (LFM3)
    sliding_window_layers: list[int] = field(default_factory=list)
    sliding_window: int = 4096
    sliding_rope_theta: float | None = None  # their RoPE: the whole head at this theta; None = as the others
    attention_bias: bool = False  # biases in q/k/v/o projections
    attention_multiplier: float | None = None  # softmax scale; None = head_dim ** -0.5 (Granite sets it)
    qk_norm: bool = False  # queries and keys RMS-normed per head (weights (hd,)) before RoPE (LFM2)
    # with qk_norm: one norm across all heads instead (weights (nh * hd,) and (nkv * hd,)) (OLMo-hybrid)
    qk_norm_across_heads: bool = False
    # attention layers norm their branches' outputs, x + norm(attn(x)) and x + mlp_norm(mlp(x)),
    # instead of their inputs (OLMo-hybrid's attention layers; its other layers are pre-norm)
    attention_post_norm: bool = False
    attention_output_gate: bool = False  # q_proj also gives a gate per head: out * sigmoid(gate) (Qwen3.5)
    attention_head_gate: bool = False  # each head's output times sigmoid(g_proj(x)), one scalar a head (LFM3)
    # each branch's output RMS-normed too before the residual add (pre- and post-norms: LFM3)
    sandwich_norm: bool = False
    # multipliers (Granite); neutral by default
    embedding_multiplier: float = 1.0  # the embedding is multiplied by it
    residual_multiplier: float = 1.0  # each branch's output is multiplied by it before the residual add
    logits_scaling: float = 1.0  # logits are DIVIDED by it
    # μP multipliers (Falcon-H1); neutral by default. A branch's input and output are multiplied by
    # its in / out multiplier (attention: attention_in / attention_out; Mamba-2: ssm_in / ssm_out)
    key_multiplier: float = 1.0  # k_proj's output (before RoPE) is multiplied by it
    attention_in_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0
    # the Mamba-2 in_proj's five parts (z, x, B, C, Δ) multiplied by these
    ssm_multipliers: list[float] = field(default_factory=lambda: [1.0] * 5)
    mlp_multipliers: list[float] = field(default_factory=lambda: [1.0, 1.0])  # the MLP's gate, and its output
    # Mamba-2 mixer (sizes as the hybrids give them: heads and head dim, not expand)
    mamba_nheads: int = 8  # SSM heads (h)
    headdim: int = 16  # channels per SSM head (p); mamba_d_inner = mamba_nheads * headdim
    ngroups: int = 1  # groups of heads sharing B and C (g), must divide mamba_nheads
    d_state: int = 16  # SSM state size (n)
    d_conv: int = 4  # conv width (k)
    chunk_size: int = 64  # chunk length of the chunked SSD (prefill)
    mamba_bias: bool = False  # biases in the mixer's in_proj and out_proj
    conv_bias: bool = True  # bias in the mixer's depthwise conv
    dt_min_limit: float = 0.0  # Δ clamped to >= this
    dt_max_limit: float | None = None  # Δ clamped to <= this; None = no upper limit
    mamba_gated_norm: bool = True  # the mixer's output: a gated RMSNorm; False: y * SiLU(z), no norm (Falcon-H1)
    mamba_norm_before_gate: bool = False  # gated norm: False = norm(y * SiLU(z)), True = norm(y) * SiLU(z)
    # "mamba" layers (Jamba's Mamba-1 mixer; d_state, d_conv, conv_bias and mamba_bias as the Mamba-2 mixer's)
    mamba1_expand: int = 2  # its width: mamba1_expand * d_model
    mamba1_dt_rank: int | None = None  # rank of its Δ projection; None: ceil(d_model / 16)
    mamba1_dt_norm: bool = False  # RMSNorms with weights on Δ's low-rank input, B and C (Jamba)
    # "conv" layers (LFM2's gated short convolution)
    short_conv_kernel: int = 3  # the causal depthwise conv's width (ks)
    short_conv_bias: bool = False  # biases in its in_proj, conv and out_proj
    # "deltanet" layers (Qwen3.5's Gated DeltaNet; conv width d_conv, no biases)
    delta_k_heads: int = 2  # query / key heads (hk), must divide delta_v_heads
    delta_v_heads: int = 4  # value heads (hv): one state (dk, dv) each
    delta_k_dim: int = 16  # a query / key head's size (dk)
    delta_v_dim: int = 16  # a value head's size (dv)
    # β = 2 sigmoid(b) in (0, 2): a token's write can reflect the state, an eigenvalue down to -1
    # (OLMo-hybrid's allow_neg_eigval); False: β = sigmoid(b) in (0, 1)
    delta_negative_eigenvalues: bool = False
    delta_norm_eps: float | None = None  # the output's gated RMSNorm epsilon; None = rms_norm_eps (OLMo: 1e-5)
    # "kda" layers (Kimi-Linear's Kimi Delta Attention): the gated delta rule with a decay per head
    # and key channel; delta_v_heads heads (delta_k_heads equal to it), delta_k_dim = delta_v_dim
    # "mla" layers (Kimi-Linear's multi-head latent attention, without positions; Ling 3's with
    # RoPE): n_heads heads read one cached latent of mla_kv_rank (their keys' first mla_nope_dim
    # dims and values of mla_v_dim through kv_b_proj) and one cached key part of mla_rope_dim
    # every head shares
    mla_kv_rank: int = 32  # kv_lora_rank (r)
    mla_q_rank: int | None = None  # q_lora_rank: queries through an RMS-normed bottleneck; None: one q_proj
    mla_nope_dim: int = 16  # qk_nope_head_dim
    mla_rope_dim: int = 8  # qk_rope_head_dim (turned only with rope: Kimi-Linear has no positions)
    mla_v_dim: int = 16  # v_head_dim
    mla_norm_eps: float = 1e-6  # the latent's (and q's bottleneck's) RMSNorm (transformers' default, not rms_norm_eps)
    # with rope: the shared key part and each query's last mla_rope_dim dims turned (DeepSeek's
    # interleaved pairs, head_dim = mla_rope_dim), the key part cached turned (Ling 3); with
    # attention_head_gate each head's output times sigmoid(g_proj(x)) (Ling 3)
    # "kda" layers' gates: True = low-rank (f_a_proj, f_b_proj; g_a_proj, g_b_proj: Kimi-Linear),
    # False = one projection each (f_proj; g_proj: Ling 3)
    kda_low_rank_gates: bool = True
    # the decay's form: None = -exp(A_log) softplus(f + dt_bias) (Kimi-Linear); a bound b < 0 =
    # b sigmoid(exp(A_log) (f + dt_bias)), a log decay in (b, 0) (Ling 3's "safe gate")
    kda_gate_lower_bound: float | None = None
    # "zamba" layers (Zamba2's hybrid layers): a shared transformer block, one of `shared_blocks` in
    # turn, reads cat(x, the embedding) (2 d wide, attention heads of head_dim over it); its output,
    # through the layer's own d x d `linear`, joins the input of the layer's Mamba-2 mixer
    shared_blocks: int = 1
    # each zamba layer's own LoRA of this rank on the block's MLP gate/up (0: none), and on its
    # q/k/v projections with shared_attention_adapters
    shared_adapter_rank: int = 0
    shared_attention_adapters: bool = False
    # shared
    rms_norm_eps: float = 1e-5  # epsilon of every RMSNorm (the mixer's gated one too)
    tie_embeddings: bool = False  # lm_head shares the embedding matrix
    pad_vocab_size_multiple: int = 1  # embedding rows rounded up to this multiple

    def __post_init__(self):
        self._check_types()
        self._check_layers()
        self._check_heads()
        self._check_dt_limits()
        self._check_experts()
        self._check_multipliers()

    def _check_multipliers(self) -> None:
        name = type(self).__name__
        for key, n in (("ssm_multipliers", 5), ("mlp_multipliers", 2)):
            value = getattr(self, key)
            if not isinstance(value, list | tuple) or len(value) != n:
                raise ValueError(f"{name}.{key} must be a list of {n} numbers, got {value!r}")
            setattr(self, key, list(value))
        scalars = ["key_multiplier", "attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
                   "ssm_out_multiplier"]
        values = [(k, getattr(self, k)) for k in scalars] + [
            (f"{key}[{j}]", v) for key in ("ssm_multipliers", "mlp_multipliers") for j, v in enumerate(getattr(self, key))]
        for key, value in values:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name}.{key} must be a finite number, got {value!r}")

    def _check_types(self) -> None:
        """Positive ints, bools, and finite numbers > 0 where the fields need them."""
        name = type(self).__name__
        ints = ("d_model", "vocab_size", "d_ff", "n_heads", "n_kv_heads", "head_dim", "mamba_nheads", "headdim",
                "ngroups", "d_state", "d_conv", "chunk_size", "pad_vocab_size_multiple", "short_conv_kernel",
                "mamba1_expand", "delta_k_heads", "delta_v_heads", "delta_k_dim", "delta_v_dim", "sliding_window",
                "shared_blocks", "mla_kv_rank", "mla_nope_dim", "mla_rope_dim", "mla_v_dim")
        for key in ints:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}.{key} must be a positive int, got {value!r}")
        for key in ("mlp_in_layer", "mlp_bias", "rope", "attention_bias", "mamba_bias", "conv_bias",
                    "tie_embeddings", "mamba_gated_norm", "mamba_norm_before_gate", "qk_norm", "short_conv_bias",
                    "mamba1_dt_norm", "attention_output_gate", "gated_shared_expert", "qk_norm_across_heads",
                    "attention_post_norm", "delta_negative_eigenvalues", "rope_proportional",
                    "attention_head_gate", "sandwich_norm", "shared_attention_adapters", "plain_shared_expert",
                    "kda_low_rank_gates"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{name}.{key} must be a bool, got {getattr(self, key)!r}")
        positive = ["rope_theta", "embedding_multiplier", "residual_multiplier", "logits_scaling", "rms_norm_eps",
                    "mla_norm_eps"]
        positive += [key for key in ("attention_multiplier", "delta_norm_eps", "sliding_rope_theta")
                     if getattr(self, key) is not None]
        for key in positive:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name}.{key} must be a finite number > 0, got {value!r}")

    def _check_layers(self) -> None:
        name = type(self).__name__
        if not isinstance(self.layer_types, list | tuple) or not self.layer_types:
            raise ValueError(f"{name}.layer_types must be a non-empty list of {list(LAYER_TYPES)}, "
                             f"got {self.layer_types!r}")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        if bad:
            raise ValueError(f"{name}.layer_types holds {bad}; expected each one of {list(LAYER_TYPES)}")
        self.layer_types = list(self.layer_types)
        if self.mlp_act not in MLP_ACTS:
            raise ValueError(f"{name}.mlp_act={self.mlp_act!r}; expected one of {list(MLP_ACTS)}")
        rank = self.shared_adapter_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"{name}.shared_adapter_rank must be an int >= 0, got {rank!r}")
        if self.mlp_act == "gelu_gated" and self.n_experts:  # (the experts and their lowerings: SiLU or ReLU²)
            raise ValueError(f"{name}.mlp_act='gelu_gated' has no experts form; expected n_experts=0")
        if "zamba" in self.layer_types and self.mlp_in_layer:
            raise ValueError(f"{name}: 'zamba' layers feed their shared block's MLP, not one of their own; "
                             "expected mlp_in_layer=False")
        where = self.sliding_window_layers
        if not isinstance(where, list | tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layer
                or self.layer_types[i] != "attention" for i in where):
            raise ValueError(f"{name}.sliding_window_layers={where!r}; expected a list of the indices of "
                             "'attention' layers")
        self.sliding_window_layers = sorted(set(where))
        attending = [i for i, t in enumerate(self.layer_types) if t in ATTENTION_KINDS]
        if attending and set(attending) <= set(self.sliding_window_layers):  # (their state is a window)
            raise ValueError(f"{name}.sliding_window_layers={self.sliding_window_layers} holds every attention "
                             "layer; expected at least one full attention layer (the graphs count positions by "
                             "its cache)")

    def _check_heads(self) -> None:
        """GQA groups, the rotary dims, and the SSM heads' groups divide as they must."""
        name = type(self).__name__
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{name}.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        factor = self.partial_rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
            raise ValueError(f"{name}.partial_rotary_factor must be in (0, 1], got {factor!r}")
        if self.rope_proportional and (self.head_dim % 2 or self.rotated_pairs < 1):
            raise ValueError(f"{name}.partial_rotary_factor={factor!r} rotates {self.rotated_pairs} pairs of "
                             f"head_dim={self.head_dim} (rope_proportional); expected an even head_dim and >= 1 pair")
        if self.rope and (self.rotary_dim < 2 or self.rotary_dim % 2):
            raise ValueError(f"{name}.partial_rotary_factor={factor!r} gives rotary_dim={self.rotary_dim} "
                             f"of head_dim={self.head_dim}; expected an even number >= 2")
        r = self.mamba1_dt_rank
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise ValueError(f"{name}.mamba1_dt_rank must be None or a positive int, got {r!r}")
        if self.mamba_nheads % self.ngroups:
            raise ValueError(f"{name}.ngroups={self.ngroups} must divide mamba_nheads={self.mamba_nheads}")
        if self.delta_v_heads % self.delta_k_heads:
            raise ValueError(f"{name}.delta_k_heads={self.delta_k_heads} must divide "
                             f"delta_v_heads={self.delta_v_heads}")
        self._check_kimi()

    def _check_kimi(self) -> None:
        """"kda" layers: one key head per value head, keys and values of one size, a bound < 0;
        "mla" layers with RoPE: it turns exactly their shared key dims."""
        name = type(self).__name__
        if "kda" in self.layer_types and (self.delta_k_heads != self.delta_v_heads
                                          or self.delta_k_dim != self.delta_v_dim):
            raise ValueError(f"{name}: 'kda' layers have as many key heads as value heads, of one size; got "
                             f"delta_k_heads={self.delta_k_heads}, delta_v_heads={self.delta_v_heads}, "
                             f"delta_k_dim={self.delta_k_dim}, delta_v_dim={self.delta_v_dim}")
        if "mla" in self.layer_types and self.rope and self.rotary_dim != self.mla_rope_dim:
            raise ValueError(f"{name}: 'mla' layers turn their mla_rope_dim={self.mla_rope_dim} shared key dims; "
                             f"expected rotary_dim (head_dim * partial_rotary_factor) equal to it, got "
                             f"{self.rotary_dim}")
        bound = self.kda_gate_lower_bound
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int | float)
                                  or not -math.inf < bound < 0):
            raise ValueError(f"{name}.kda_gate_lower_bound must be None or a finite number < 0, got {bound!r}")
        r = self.mla_q_rank
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise ValueError(f"{name}.mla_q_rank must be None or a positive int, got {r!r}")

    def _check_dt_limits(self) -> None:
        name = type(self).__name__
        lo = self.dt_min_limit
        if isinstance(lo, bool) or not isinstance(lo, int | float) or not 0 <= lo < math.inf:
            raise ValueError(f"{name}.dt_min_limit must be a finite number >= 0, got {lo!r}")
        hi = self.dt_max_limit
        if hi is not None and (isinstance(hi, bool) or not isinstance(hi, int | float) or not lo < hi < math.inf):
            raise ValueError(f"{name}.dt_max_limit must be None (no limit) or a finite number > "
                             f"dt_min_limit={lo!r}, got {hi!r}")

    def _check_experts(self) -> None:
        name = type(self).__name__
        for key, least in (("n_experts", 0), ("experts_per_token", 1), ("d_ff_expert", 1), ("n_expert_groups", 1),
                           ("expert_groups_per_token", 1), ("d_ff_shared_expert", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}.{key} must be an int >= {least}, got {value!r}")
        if self.expert_routing not in EXPERT_ROUTINGS:
            raise ValueError(f"{name}.expert_routing={self.expert_routing!r}; expected one of {list(EXPERT_ROUTINGS)}")
        if not isinstance(self.normalize_expert_weights, bool):
            raise ValueError(f"{name}.normalize_expert_weights must be a bool, got {self.normalize_expert_weights!r}")
        f = self.routed_scaling_factor
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f < math.inf:
            raise ValueError(f"{name}.routed_scaling_factor must be a finite number > 0, got {f!r}")
        eps = self.expert_weights_eps
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 <= eps < math.inf:
            raise ValueError(f"{name}.expert_weights_eps must be a finite number >= 0, got {eps!r}")
        where = self.expert_layers
        if where is not None and (not isinstance(where, list | tuple) or not self.mlp_in_layer or not self.n_experts
                                  or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layer
                                         for i in where)):
            raise ValueError(f"{name}.expert_layers={where!r}; expected None, or a list of layer indices in 0 .. "
                             f"{self.n_layer - 1} with mlp_in_layer and n_experts >= 1")
        if where is not None:
            self.expert_layers = sorted(set(where))
        self._check_shared_expert()
        self._check_expert_counts()
        self._check_swiglu_limits()

    def _check_shared_expert(self) -> None:
        name = type(self).__name__
        for key in ("gated_shared_expert", "plain_shared_expert"):
            if getattr(self, key) and not (self.mlp_in_layer and self.n_experts):
                raise ValueError(f"{name}.{key} sits beside a layer's experts; expected mlp_in_layer and "
                                 f"n_experts >= 1, got mlp_in_layer={self.mlp_in_layer}, n_experts={self.n_experts}")
        if self.gated_shared_expert and self.plain_shared_expert:
            raise ValueError(f"{name}: gated_shared_expert and plain_shared_expert are two forms of one shared "
                             "expert; expected at most one")

    def _check_swiglu_limits(self) -> None:
        """One limit a layer; a layer without experts (or a shared expert) clips nothing, as in transformers."""
        name = type(self).__name__
        for key in ("expert_swiglu_limits", "shared_swiglu_limits"):
            limits = getattr(self, key)
            if limits is None:
                continue
            if not isinstance(limits, list | tuple) or len(limits) != self.n_layer or any(
                    isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf for v in limits):
                raise ValueError(f"{name}.{key}={limits!r}; expected None or one finite limit >= 0 per layer "
                                 f"({self.n_layer}), 0 where a layer is not clipped")
            setattr(self, key, [float(v) for v in limits])
            if any(limits) and self.n_experts and self.mlp_act != "silu_gated":
                raise ValueError(f"{name}.{key} clips a gated SiLU expert's product; expected mlp_act='silu_gated', "
                                 f"got {self.mlp_act!r}")

    def swiglu_limit(self, key: str, index: int) -> float:
        """Layer `index`'s limit from `key` ("expert_swiglu_limits" or "shared_swiglu_limits"); 0: none."""
        limits = getattr(self, key)
        return limits[index] if limits else 0.0

    def _check_expert_counts(self) -> None:
        """k, the groups and where the experts sit fit each other."""
        name = type(self).__name__
        if not self.n_experts:
            if "moe" in self.layer_types:
                raise ValueError(f"{name}.layer_types has 'moe' layers but n_experts=0; expected n_experts >= 1")
            return
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"{name}.experts_per_token={self.experts_per_token} must be <= "
                             f"n_experts={self.n_experts}")
        if self.n_experts % self.n_expert_groups or self.expert_groups_per_token > self.n_expert_groups:
            raise ValueError(f"{name}.n_expert_groups={self.n_expert_groups} must divide n_experts={self.n_experts} "
                             f"and be >= expert_groups_per_token={self.expert_groups_per_token}")
        per_group = self.n_experts // self.n_expert_groups
        if self.expert_routing == "sigmoid" and (per_group < 2 or self.expert_groups_per_token * per_group
                                                 < self.experts_per_token):
            raise ValueError(f"{name}: {self.expert_groups_per_token} of {self.n_expert_groups} expert groups "
                             f"({per_group} experts each) cannot hold experts_per_token={self.experts_per_token}, "
                             "or a group has fewer than 2 experts (a group is scored by its best two)")
        if not self.mlp_in_layer and "moe" not in self.layer_types:
            raise ValueError(f"{name}.n_experts={self.n_experts} with mlp_in_layer=False needs 'moe' layers")
        if self.mlp_in_layer and "moe" in self.layer_types:
            raise ValueError(f"{name}: 'moe' layers are layers of their own; expected mlp_in_layer=False")

    @property
    def n_layer(self) -> int:
        return len(self.layer_types)

    @property
    def rotary_dim(self) -> int:
        """rd: the leading dims of each head that RoPE rotates (transformers' int(hd * factor)); the
        whole head with rope_proportional (its unrotated pairs at frequency 0)."""
        return self.head_dim if self.rope_proportional else int(self.head_dim * self.partial_rotary_factor)

    @property
    def rotated_pairs(self) -> int:
        """rope_proportional: the pairs (j, j + hd / 2), j < this, that turn (transformers' int(f hd // 2))."""
        return int(self.partial_rotary_factor * self.head_dim // 2)

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_nheads * self.headdim

    @property
    def delta_conv_dim(self) -> int:
        """A "deltanet" layer's conv channels: its queries, keys and values, 2 hk dk + hv dv."""
        return 2 * self.delta_k_heads * self.delta_k_dim + self.delta_v_heads * self.delta_v_dim

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_size_multiple
        return (self.vocab_size + m - 1) // m * m


def inverse_frequencies(theta: float, rd: int, pairs: int | None = None) -> Tensor:
    """theta^(-2j / rd) for the first `pairs` (all rd / 2 by default), then 0 (pairs that stay
    as they are) -> (rd / 2,)."""
    pairs = rd // 2 if pairs is None else pairs
    turned = 1.0 / (theta ** (torch.arange(0, 2 * pairs, 2, dtype=torch.float32) / rd))
    return torch.cat([turned, torch.zeros(rd // 2 - pairs)])


def rope_frequencies(config: HybridConfig) -> Tensor:
    """RoPE's inverse frequencies (rd / 2,): theta^(-2j / rd), j < rd / 2; rope_proportional:
    theta^(-2j / hd) for the rotated pairs, then 0 (those pairs stay as they are)."""
    pairs = config.rotated_pairs if config.rope_proportional else None
    return inverse_frequencies(config.rope_theta, config.rotary_dim, pairs)


class ScaledLinear(nn.Linear):
    """nn.Linear whose output is multiplied by a constant, a number or one per output feature
    (Falcon-H1's μP multipliers), kept as a buffer beside the weights: the parameter names, and so
    the checkpoint keys and what int8 / int4 match, stay nn.Linear's."""

    def __init__(self, in_features: int, out_features: int, bias: bool, out_scale):
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("out_scale", torch.as_tensor(out_scale, dtype=torch.float32), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        return super().forward(x) * self.out_scale.to(x.dtype)


def scaled_linear(d_in: int, d_out: int, bias: bool, out_scale=1.0) -> nn.Linear:
    """nn.Linear, or a ScaledLinear where a multiplier is not 1 (other models' graphs stay as they were)."""
    neutral = all(float(m) == 1.0 for m in (out_scale if isinstance(out_scale, list) else [out_scale]))
    return nn.Linear(d_in, d_out, bias=bias) if neutral else ScaledLinear(d_in, d_out, bias, out_scale)


def rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """DeepSeek's RoPE: x (..., rd) as pairs (x[2j], x[2j + 1]), pair j turned by angle j, laid out
    [first of each pair; second of each pair] (transformers' apply_rotary_pos_emb_interleave);
    cos, sin (b, 1, l, rd) as `HybridLM._rope` gives them (their two halves alike)."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]  # (b, 1, l, rd / 2)
    first, second = x[..., 0::2], x[..., 1::2]  # (..., rd / 2) each
    return torch.cat([first * c - second * s, second * c + first * s], dim=-1)


def visible_slots(past_lengths: Tensor, P: int, length: int) -> tuple[Tensor, Tensor]:
    """What each of l new queries sees of an appended cache: its valid past slots (b, 1, 1, P),
    and the new positions up to and including its own (l, l)."""
    slots = torch.arange(P, device=past_lengths.device)
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=past_lengths.device))  # (l, l)
    return (slots[None, :] < past_lengths[:, None])[:, None, None, :], causal  # (b, 1, 1, P)


class Attention(nn.Module):
    """Causal self-attention over an appended KV buffer plus the new positions; GQA, RoPE or none.

    `window`: a query sees only the last `window` positions, its own included (a sliding window),
    and the cache is the window itself, (b, nkv, window, hd), replaced each call: slot j holds
    position past_lengths - window + j (right-aligned; a negative position is no token yet)."""

    def __init__(self, config: HybridConfig, window: int | None = None, d_in: int | None = None):
        super().__init__()
        self.window = window
        d, nh, nkv, hd = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
        width = d_in or d  # what q/k/v read (a zamba block's: 2 d)
        self.n_heads, self.n_kv_heads, self.head_dim = nh, nkv, hd
        self.scale = config.attention_multiplier if config.attention_multiplier is not None else hd ** -0.5
        bias = config.attention_bias
        self.gated = config.attention_output_gate
        self.q_proj = nn.Linear(width, nh * hd * (2 if self.gated else 1), bias=bias)  # per head: q, then its gate
        self.k_proj = scaled_linear(width, nkv * hd, bias, config.key_multiplier)
        self.v_proj = nn.Linear(width, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, d, bias=bias)
        if config.attention_head_gate:  # one gate a head, from the layer's input
            self.g_proj = nn.Linear(d, nh, bias=False)
        across = config.qk_norm_across_heads  # one norm over every head's dims, or one per head
        if config.qk_norm:
            self.q_norm = RMSNorm(nh * hd if across else hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(nkv * hd if across else hd, config.rms_norm_eps)
        self.qk_norm = "across" if config.qk_norm and across else "per head" if config.qk_norm else None

    def project(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, adapters: dict | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x (b, l, d) -> q (b, nh, l, hd), k and v (b, nkv, l, hd): projected (plus `adapters`' "q",
        "k", "v" of x where given: a zamba layer's own LoRA), normed (qk_norm: per head, or across
        the heads), then rotated (rope); and the output gate (b, l, nh * hd), or None (not gated; a
        head gate is (b, l, nh, 1), each head's one scalar)."""
        b, length, _ = x.shape
        adapters = adapters or {}

        def projected(name: str) -> Tensor:  # (b, l, .)
            out = getattr(self, f"{name}_proj")(x)
            return out + adapters[name](x) if name in adapters else out

        q, gate = projected("q").view(b, length, self.n_heads, -1), None  # (b, l, nh, hd; 2 hd where gated)
        if self.gated:
            q, gate = q.chunk(2, dim=-1)  # (b, l, nh, hd) each
            gate = gate.reshape(b, length, -1)  # (b, l, nh * hd)
        elif hasattr(self, "g_proj"):
            gate = self.g_proj(x)[..., None]  # (b, l, nh, 1)
        k = projected("k").view(b, length, self.n_kv_heads, self.head_dim)  # (b, l, nkv, hd)
        if self.qk_norm == "across":  # over (nh * hd) and (nkv * hd)
            q = self.q_norm(q.flatten(2)).view(b, length, self.n_heads, self.head_dim)  # (b, l, nh, hd)
            k = self.k_norm(k.flatten(2)).view(b, length, self.n_kv_heads, self.head_dim)  # (b, l, nkv, hd)
        elif self.qk_norm:  # over hd
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (b, nh, l, hd), (b, nkv, l, hd)
        v = projected("v").view(b, length, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (b, nkv, l, hd)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v, gate

    def output(self, out: Tensor, gate: Tensor | None) -> Tensor:
        """The heads' output (b, l, nh * hd), times sigmoid(gate) where gated (a head gate: each
        head's hd values by its scalar), -> o_proj (b, l, d)."""
        if gate is not None and gate.dim() == 4:  # (b, l, nh, 1)
            b, length, _ = out.shape
            out = (out.view(b, length, self.n_heads, self.head_dim) * torch.sigmoid(gate)).view(b, length, -1)
        elif gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)

    def visible(self, past_lengths: Tensor, P: int, length: int) -> tuple[Tensor, Tensor]:
        """What each query sees: the valid past slots (b, 1, 1, P), and the new positions up to and
        including its own (l, l). With a window (P = window slots, right-aligned), only positions
        p - window < . <= p for a query at p: the past slots then (b, 1, l, P)."""
        if self.window is None:
            return visible_slots(past_lengths, P, length)
        slots = torch.arange(P, device=past_lengths.device)
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=past_lengths.device))  # (l, l)
        # slot j holds position past_lengths - P + j; query t is at past_lengths + t and sees it
        # while t + P - j < window: the slots j > t + P - window
        t = torch.arange(length, device=past_lengths.device)
        held = slots[None, :] >= P - past_lengths[:, None]  # (b, P): a token there (position >= 0)
        recent = slots[None, :] > t[:, None] + (P - self.window)  # (l, P)
        past = (held[:, None, :] & recent[None])[:, None]  # (b, 1, l, P)
        return past, causal & (t[:, None] - t[None, :] < self.window)  # (l, l)

    def new_state(self, past_key: Tensor, past_value: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """What the layer's state becomes: the new positions' (k, v) (b, nkv, l, hd), which the
        caller appends; or, with a window, the window itself (b, nkv, window, hd): the last
        `window` positions of the past and the new ones (an exporter of right-padded rows takes
        them at each row's end instead)."""
        if self.window is None:
            return k, v
        key, value = (torch.cat([past.to(new.dtype), new], dim=2)  # (b, nkv, P + l, hd)
                      for past, new in ((past_key, k), (past_value, v)))
        return key[:, :, -self.window:], value[:, :, -self.window:]  # (b, nkv, window, hd) each

    def forward(
        self, x: Tensor, past_key: Tensor, past_value: Tensor, past_lengths: Tensor,
        rope: tuple[Tensor, Tensor] | None, step: bool = False, adapters: dict | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (b, l, d) at positions past_lengths[r] + 0 .. l - 1.

        Args:
            past_key, past_value: (b, nkv, P, hd), row r's slots < past_lengths[r] valid
            past_lengths:         (b,) int64
            rope:                 (cos, sin), each (b, 1, l, rd), or None (no positions)
            step:                 l = 1 (a decode step): the cache is read where it lies (below)
            adapters:             a zamba layer's LoRA on q / k / v (see `project`), or None
        Returns:
            out (b, l, d) and the new positions' (key, value), each (b, nkv, l, hd).
        """
        b, length, _ = x.shape
        P = past_key.shape[2]
        nkv, hd = self.n_kv_heads, self.head_dim
        rep = self.n_heads // nkv  # query heads per kv head: kv head j serves j*rep .. j*rep+rep-1
        q, k, v, gate = self.project(x, rope, adapters)

        # Each kv head's query heads are rows of one product: K/V are not copied per query head.
        # A step (l = 1) also attends the past slots and its own position in two products whose
        # scores are joined, so it reads the cache where it lies instead of copying it with the
        # new K/V appended (Falcon-H1-Tiny's step at 4096 tokens: 69 -> 32 ms). A prefill appends
        # them (one copy of a cache that is empty for a fresh prompt): its scores are l times
        # larger, and joining and splitting them would cost more than the copy saves.
        q = q.reshape(b, nkv, rep * length, hd)  # (b, nkv, rep * l, hd): row i*l + t is head j*rep + i at t
        past_key, past_value = past_key.to(k.dtype), past_value.to(v.dtype)
        if step:
            scores = torch.cat([torch.matmul(q, past_key.transpose(-1, -2)),  # (b, nkv, rep, P)
                                torch.matmul(q, k.transpose(-1, -2))], dim=-1) * self.scale  # (b, nkv, rep, P + 1)
        else:
            keys = torch.cat([past_key, k], dim=2)  # (b, nkv, P + l, hd)
            scores = torch.matmul(q, keys.transpose(-1, -2)) * self.scale  # (b, nkv, rep * l, P + l)

        # Visible: the valid past slots, and the new positions up to and including the query's own.
        past_visible, causal = self.visible(past_lengths, P, length)  # (b, 1, 1 or l, P), (l, l)
        past_visible = past_visible.repeat(1, 1, rep, 1) if self.window is not None else past_visible
        causal = causal.repeat(rep, 1)  # (rep * l, l): each query head's rows alike
        visible = torch.cat([past_visible.expand(b, 1, rep * length, P), causal.expand(b, 1, rep * length, length)],
                            dim=-1)  # (b, 1, rep * l, P + l)

        # The most negative finite value rather than -inf: never NaN (every query sees itself anyway).
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (b, nkv, rep * l, P + l)
        if step:
            out = torch.matmul(probs[..., :P], past_value) + torch.matmul(probs[..., P:], v)  # (b, nkv, rep, hd)
        else:
            out = torch.matmul(probs, torch.cat([past_value, v], dim=2))  # (b, nkv, rep * l, hd)
        out = out.view(b, self.n_heads, length, hd).transpose(1, 2).reshape(b, length, self.n_heads * hd)  # (b, l, nh * hd)
        return self.output(out, gate), self.new_state(past_key, past_value, k, v)


class LatentAttention(nn.Module):
    """Kimi-Linear's multi-head latent attention (DeepSeek-V2's MLA; RoPE on the shared key part
    only with config.rope, Ling 3's; a sigmoid gate per head with attention_head_gate): the cache
    holds, per position, one RMS-normed latent c (r) and one key part k_r (rd) that every head
    shares; head j's key is [W_uk[j] c; k_r] and its value W_uv[j] c (kv_b_proj's rows). The
    product is taken in the latent (DeepSeek's absorbed form, equal to expanding the keys): the
    query's first nope dims through W_uk[j] meet c, its last rd dims meet k_r, and the heads'
    outputs, weighted sums of c, go through W_uv[j]; so a step reads r + rd numbers per cached
    position instead of nh (nope + rd + dv). A prefill reads its past so too, but expands its
    own positions' keys and values (each new position once per head): pairs of new positions,
    l^2 of them, are then nope + rd + dv products a head, not 2r + rd."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        d, nh = config.d_model, config.n_heads
        r, self.nope, self.rd, self.dv = config.mla_kv_rank, config.mla_nope_dim, config.mla_rope_dim, config.mla_v_dim
        self.n_heads, self.rank = nh, r
        bias, eps = config.attention_bias, config.mla_norm_eps
        width = nh * (self.nope + self.rd)  # the queries
        if config.mla_q_rank is None:
            self.q_proj = nn.Linear(d, width, bias=False)
        else:  # through a normed bottleneck
            self.q_a_proj = nn.Linear(d, config.mla_q_rank, bias=bias)
            self.q_a_norm = RMSNorm(config.mla_q_rank, eps)
            self.q_b_proj = nn.Linear(config.mla_q_rank, width, bias=False)
        self.kv_a_proj = nn.Linear(d, r + self.rd, bias=bias)  # the latent, then the shared key part
        self.kv_a_norm = RMSNorm(r, eps)
        self.kv_b_proj = nn.Linear(r, nh * (self.nope + self.dv), bias=False)  # per head: W_uk rows, then W_uv rows
        self.o_proj = nn.Linear(nh * self.dv, d, bias=bias)
        if config.attention_head_gate:  # one gate a head, from the layer's input
            self.g_proj = nn.Linear(d, nh, bias=False)
        multiplier = config.attention_multiplier
        self.scale = multiplier if multiplier is not None else (self.nope + self.rd) ** -0.5

    def queries(self, x: Tensor) -> Tensor:
        """x (b, l, d) -> q (b, nh, l, nope + rd)."""
        b, length, _ = x.shape
        q = self.q_proj(x) if hasattr(self, "q_proj") else self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        return q.view(b, length, self.n_heads, self.nope + self.rd).transpose(1, 2)

    def parts(self, x: Tensor, positions: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x (b, l, d) -> the queries' own parts (b, nh, l, nope) and shared parts (b, nh, l, rd);
        the new positions' latents (b, 1, l, r) and key parts (b, 1, l, rd). `positions`: RoPE's
        (cos, sin) (b, 1, l, rd) turning the shared parts, or None (no positions)."""
        q_nope, q_rope = self.queries(x).split([self.nope, self.rd], dim=-1)  # (b, nh, l, nope), (b, nh, l, rd)
        latent, rope = self.kv_a_proj(x).split([self.rank, self.rd], dim=-1)  # (b, l, r), (b, l, rd)
        latent, rope = self.kv_a_norm(latent)[:, None], rope[:, None]  # (b, 1, l, r), (b, 1, l, rd)
        if positions is not None:
            q_rope, rope = rope_interleaved(q_rope, *positions), rope_interleaved(rope, *positions)
        return q_nope, q_rope, latent, rope

    def project(self, x: Tensor, positions: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`parts`, the queries' own parts taken into the latent (b, nh, l, r: through W_uk)."""
        q_nope, q_rope, latent, rope = self.parts(x, positions)
        return torch.matmul(q_nope, self._w()[:, :self.nope]), q_rope, latent, rope  # (nh, nope, r): W_uk

    def _w(self) -> Tensor:
        """kv_b_proj's weight per head, (nh, nope + dv, r): W_uk's rows, then W_uv's."""
        return self.kv_b_proj.weight.view(self.n_heads, self.nope + self.dv, self.rank)

    def output(self, mixed: Tensor, x: Tensor) -> Tensor:
        """The heads' weighted sums of latents (b, nh, l, r) -> through W_uv, then `heads_out`."""
        return self.heads_out(torch.matmul(mixed, self._w()[:, self.nope:].transpose(1, 2)), x)  # (b, nh, l, dv)

    def heads_out(self, heads: Tensor, x: Tensor) -> Tensor:
        """The heads' values (b, nh, l, dv), each times sigmoid(g_proj(x)) where gated (x (b, l, d)
        the layer's input), through o_proj -> (b, l, d)."""
        b, _, length, _ = heads.shape
        out = heads.transpose(1, 2)  # (b, l, nh, dv)
        if hasattr(self, "g_proj"):
            out = out * torch.sigmoid(self.g_proj(x))[..., None]  # (b, l, nh, 1) a head
        return self.o_proj(out.reshape(b, length, self.n_heads * self.dv))  # (b, l, nh * dv) -> d

    def forward(self, x: Tensor, past_latent: Tensor, past_rope: Tensor, past_lengths: Tensor,
                positions: tuple[Tensor, Tensor] | None = None, step: bool = False
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (b, l, d) at positions past_lengths[r] + 0 .. l - 1; past_latent (b, 1, P, r) and
        past_rope (b, 1, P, rd), row r's first past_lengths[r] slots valid; `positions`: RoPE's
        (cos, sin) or None; `step`: l = 1, the cache read where it lies (as `Attention`'s step)
        -> out (b, l, d) and the new positions' (latent (b, 1, l, r), key part (b, 1, l, rd))."""
        b, length, _ = x.shape
        P = past_latent.shape[2]
        q_nope, q_rope, latent, rope = self.parts(x, positions)
        # the scale on the queries ((b, nh, l, nope + rd) numbers), not on the (b, nh, l, P + l) scores
        q_nope, q_rope = q_nope * self.scale, q_rope * self.scale
        w_uk, w_uv = self._w().split([self.nope, self.dv], dim=1)  # (nh, nope, r), (nh, dv, r)
        q_latent = torch.matmul(q_nope, w_uk)  # (b, nh, l, r): the past is read in the latent
        past_latent, past_rope = past_latent.to(x.dtype), past_rope.to(x.dtype)

        def scores_of(c: Tensor, k_r: Tensor) -> Tensor:  # c (b, 1, m, r), k_r (b, 1, m, rd) -> (b, nh, l, m)
            return torch.matmul(q_latent, c.transpose(-1, -2)) + torch.matmul(q_rope, k_r.transpose(-1, -2))

        if step:  # the new position in the latent too (the past and it in two products: no copy of the cache)
            new_scores = scores_of(latent, rope)  # (b, nh, 1, 1)
        else:  # the new positions' keys and values expanded per head (transformers' form): a pair of them then
            # costs nope + rd and dv, not r + rd and r (Kimi-Linear's widths: 320 against 1088 a pair and head)
            keys = torch.matmul(latent, w_uk.transpose(1, 2))  # (b, 1, l, r) @ (nh, r, nope) -> (b, nh, l, nope)
            keys = torch.cat([keys, rope.expand(b, self.n_heads, length, self.rd)], dim=-1)  # (b, nh, l, nope + rd)
            values = torch.matmul(latent, w_uv.transpose(1, 2))  # (b, nh, l, dv)
            # one product over both parts (no (l, l) sum of two)
            new_scores = torch.matmul(torch.cat([q_nope, q_rope], dim=-1), keys.transpose(-1, -2))  # (b, nh, l, l)
        scores = torch.cat([scores_of(past_latent, past_rope), new_scores], dim=-1)  # (b, nh, l, P + l)
        past_visible, causal = visible_slots(past_lengths, P, length)  # (b, 1, 1, P), (l, l)
        visible = torch.cat([past_visible.expand(b, 1, length, P), causal.expand(b, 1, length, length)], dim=-1)
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)  # (b, nh, l, P + l)
        mixed = torch.matmul(probs[..., :P], past_latent)  # (b, nh, l, r): the past's weighted latents
        if step:
            mixed = mixed + torch.matmul(probs[..., P:], latent)  # (b, nh, 1, r)
            return self.output(mixed, x), (latent, rope)
        heads = torch.matmul(mixed, w_uv.transpose(1, 2)) + torch.matmul(probs[..., P:], values)  # (b, nh, l, dv)
        return self.heads_out(heads, x), (latent, rope)

    def allocate_inference_cache(self, batch: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        """An empty cache (P = 0): latents (b, 1, 0, r), key parts (b, 1, 0, rd)."""
        return (torch.zeros(batch, 1, 0, self.rank, dtype=dtype, device=device),
                torch.zeros(batch, 1, 0, self.rd, dtype=dtype, device=device))


def swiglu(gate: Tensor, up: Tensor, limit: float = 0.0) -> Tensor:
    """silu(gate) * up, each (..., f); with a limit L > 0 (Ling 3), min(silu(gate), L) * clamp(up, -L, L):
    transformers' post-activation clipping."""
    act = F.silu(gate)
    if limit:
        act, up = act.clamp(max=limit), up.clamp(-limit, limit)
    return act * up


class MLP(nn.Module):
    """Gated SiLU, down(silu(gate(x)) * up(x)) (Bamba, Granite), gated GELU, down(gelu(gate(x)) *
    up(x)) (Zamba2), or squared ReLU, down(relu(up(x))^2) (Nemotron-H); `d_ff` wide unless a width
    is given; gated SiLU clipped at `limit` when one is given (`swiglu`)."""

    def __init__(self, config: HybridConfig, width: int | None = None, limit: float = 0.0):
        super().__init__()
        self.limit = limit
        d, f, bias = config.d_model, width or config.d_ff, config.mlp_bias
        gate_multiplier, down_multiplier = config.mlp_multipliers
        self.gated = config.mlp_act in ("silu_gated", "gelu_gated")
        self.act = F.gelu if config.mlp_act == "gelu_gated" else F.silu  # (exact GELU, transformers' "gelu")
        if self.gated:
            self.gate_proj = scaled_linear(d, f, bias, gate_multiplier)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = scaled_linear(f, d, bias, down_multiplier)

    def forward(self, x: Tensor, adapter: nn.Module | None = None) -> Tensor:
        """x (..., d) -> (..., d). `adapter` (a zamba layer's LoRA, gated only): its (..., 2 f), gate
        then up, added to the projections."""
        if not self.gated:
            return self.down_proj(torch.square(F.relu(self.up_proj(x))))  # (..., d)
        gate, up = self.gate_proj(x), self.up_proj(x)  # (..., f) each
        if adapter is not None:
            extra_gate, extra_up = adapter(x).chunk(2, dim=-1)  # (..., f) each
            gate, up = gate + extra_gate, up + extra_up
        if self.limit:
            return self.down_proj(swiglu(gate, up, self.limit))  # (..., d)
        return self.down_proj(self.act(gate) * up)  # (..., d)


def softmax_top_k(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Granite's routing: logits (n, E) -> the softmax over each row's top k, float32 (n, k), and
    those experts (n, k) int64."""
    top, experts = logits.float().topk(k, dim=-1)  # (n, k) each
    return torch.softmax(top, dim=-1), experts


class Experts(nn.Module):
    """A mixture of experts (see the module docstring): a router picks k of E experts per token;
    a token's output is the weighted sum of its experts' outputs. Eagerly each expert runs on
    the tokens that picked it. `limit`: its SwiGLU's clipping (`swiglu`; 0: none)."""

    def __init__(self, config: HybridConfig, limit: float = 0.0):
        super().__init__()
        d, e, fe = config.d_model, config.n_experts, config.d_ff_expert
        self.limit = limit
        self.k = config.experts_per_token
        self.gated = config.mlp_act == "silu_gated"
        self.sigmoid = config.expert_routing == "sigmoid"
        self.groups, self.groups_per_token = config.n_expert_groups, config.expert_groups_per_token
        self.normalize, self.scaling = config.normalize_expert_weights, config.routed_scaling_factor
        self.eps = config.expert_weights_eps
        self.router = nn.Linear(d, e, bias=False)
        if self.sigmoid:
            self.register_buffer("router_bias", torch.zeros(e))  # (E,) added to the scores to choose
        if self.gated:
            self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * fe, d))  # (E, 2 fe, d): gate rows, then up rows
        else:
            self.up_proj = nn.Parameter(torch.empty(e, fe, d))  # (E, fe, d)
        self.down_proj = nn.Parameter(torch.empty(e, d, fe))  # (E, d, fe)

    @property
    def stacks(self) -> tuple[Tensor, ...]:
        """The experts' weights, each (E, ., .)."""
        return (self.gate_up_proj if self.gated else self.up_proj), self.down_proj

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (n, d) -> weights (n, k) in x's dtype, experts (n, k) int64 (distinct in a row)."""
        if not self.sigmoid and self.normalize:  # Granite: the logits in x's dtype, then float32
            weights, experts = softmax_top_k(self.router(x), self.k)
            return weights.to(x.dtype), experts
        if not self.sigmoid:  # Jamba: the top k of the softmax over all E, as they are
            weights, experts = torch.softmax(self.router(x).float(), dim=-1).topk(self.k, dim=-1)  # (n, k) each
            return weights.to(x.dtype), experts
        scores = F.linear(x.float(), self.router.weight.float()).sigmoid()  # (n, E), in float32 (Nemotron-H)
        choice = scores + self.router_bias  # (n, E)
        n, e = choice.shape
        best = choice.reshape(n, self.groups, e // self.groups).topk(2, dim=-1)[0].sum(-1)  # (n, groups)
        groups = best.topk(self.groups_per_token, dim=-1)[1]  # (n, groups_per_token)
        keep = torch.zeros_like(best).scatter(1, groups, 1.0)  # (n, groups)
        keep = keep[:, :, None].expand(n, self.groups, e // self.groups).reshape(n, e)  # (n, E)
        experts = choice.masked_fill(keep == 0, float("-inf")).topk(self.k, dim=-1)[1]  # (n, k)
        weights = scores.gather(1, experts)  # (n, k)
        if self.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + self.eps)
        return (weights * self.scaling).to(x.dtype), experts

    def expert(self, e: int, x: Tensor) -> Tensor:
        """Expert e on x (m, d) -> (m, d): down(silu(gate(x)) * up(x)), or down(relu(up(x))^2)."""
        if self.gated:
            gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)  # (m, fe) each
            return F.linear(swiglu(gate, up, self.limit), self.down_proj[e])  # (m, d)
        return F.linear(torch.square(F.relu(F.linear(x, self.up_proj[e]))), self.down_proj[e])  # (m, d)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., d) -> (..., d)."""
        flat = x.reshape(-1, x.shape[-1])  # (n, d)
        weights, experts = self.route(flat)
        out = torch.zeros_like(flat)
        for e in experts.unique().tolist():
            token, slot = torch.where(experts == e)  # (m,) each: the tokens that picked e, and where
            out.index_add_(0, token, self.expert(e, flat[token]) * weights[token, slot, None])
        return out.reshape(x.shape)


def mamba2_mixer(config: HybridConfig) -> Mamba2Mixer:
    """`models.mamba2.Mamba2Mixer` with the hybrid's sizes (the adapter).

    Mamba2Config ties the mixer width to expand * d_model; the hybrids give heads * head dim
    instead (Nemotron-H's need not be a multiple of d_model). So the mixer is built for
    d_model = d_in, expand = 1 (every inner size right), and its two projections that touch the
    residual stream are then replaced by ones of width d: in_proj (d -> 2 d_in + 2 g n + h) and
    out_proj (d_in -> d).
    """
    inner = Mamba2Config(
        d_model=config.mamba_d_inner, n_layer=1, vocab_size=1, d_state=config.d_state, d_conv=config.d_conv,
        expand=1, headdim=config.headdim, ngroups=config.ngroups, chunk_size=config.chunk_size,
        bias=config.mamba_bias, conv_bias=config.conv_bias, rms_norm_eps=config.rms_norm_eps,
        norm_before_gate=config.mamba_norm_before_gate, dt_min_limit=config.dt_min_limit,
        dt_max_limit=config.dt_max_limit,
    )
    mixer = Mamba2Mixer(inner)
    d_in, gn, h = config.mamba_d_inner, config.ngroups * config.d_state, config.mamba_nheads
    widths = (d_in, d_in, gn, gn, h)  # in_proj's parts: z, x, B, C, Δ
    scale = [m for m, w in zip(config.ssm_multipliers, widths, strict=True) for _ in range(w)]  # (2 d_in + 2 g n + h,)
    mixer.in_proj = scaled_linear(config.d_model, mixer.in_proj.out_features, config.mamba_bias, scale)
    mixer.out_proj = nn.Linear(config.mamba_d_inner, config.d_model, bias=config.mamba_bias)
    if not config.mamba_gated_norm:
        mixer.norm = SiLUGate()
    return mixer


class ShortConv(nn.Module):
    """LFM2's gated short convolution: in_proj -> B, C, x (d each); y = C * conv(B * x), the conv
    causal and depthwise, ks wide, without an activation; -> out_proj."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        d, ks, bias = config.d_model, config.short_conv_kernel, config.short_conv_bias
        self.kernel = ks
        self.in_proj = nn.Linear(d, 3 * d, bias=bias)
        self.conv = nn.Conv1d(d, d, kernel_size=ks, groups=d, padding=ks - 1, bias=bias)
        self.out_proj = nn.Linear(d, d, bias=bias)

    @staticmethod
    def conv_input(projected: Tensor) -> Tensor:
        """in_proj's output (b, l, 3 d), B | C | x -> what the conv reads, B * x (b, d, l)."""
        B, _, x = projected.chunk(3, dim=-1)  # (b, l, d) each
        return (B * x).transpose(1, 2)

    def forward(self, h: Tensor, conv_state: Tensor, step: bool = False) -> tuple[Tensor, tuple[Tensor]]:
        """h (b, l, d), conv_state (b, d, ks): the last ks conv inputs before these tokens ->
        out (b, l, d), (new conv_state (b, d, ks),). `step`: l = 1, the conv as one product."""
        projected = self.in_proj(h)  # (b, l, 3 d)
        C = projected.chunk(3, dim=-1)[1]  # (b, l, d)
        x_cat = torch.cat([conv_state.to(h.dtype), self.conv_input(projected)], dim=-1)  # (b, d, ks + l)
        new_state = x_cat[:, :, -self.kernel:]  # (b, d, ks)
        if step:  # the window is the new state itself
            conv = (new_state * self.conv.weight[:, 0, :]).sum(-1, keepdim=True)  # (b, d, 1)
            if self.conv.bias is not None:
                conv = conv + self.conv.bias[:, None]
        else:  # a valid conv over the state's last ks - 1 inputs and the l new ones: l outputs
            conv = F.conv1d(x_cat[:, :, 1:], self.conv.weight, self.conv.bias, groups=self.conv.in_channels)  # (b, d, l)
        return self.out_proj(C * conv.transpose(1, 2)), (new_state,)

    def allocate_inference_cache(self, batch: int, dtype: torch.dtype, device) -> tuple[Tensor]:
        return (torch.zeros(batch, self.in_proj.in_features, self.kernel, dtype=dtype, device=device),)


def delta_rule_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the gated delta rule, per row and value head (float32):

        S <- exp(g) S;  S <- S + k (β (v - Sᵀk))ᵀ;  y = Sᵀq

    q, k (b, h, dk); v (b, h, dv); g (b, h), or (b, h, dk) a decay per key channel (Kimi's: row i
    of S times exp(g_i)); beta (b, h); s (b, h, dk, dv) -> y (b, h, dv), the new s."""
    decay = g.exp()
    s = s * (decay[..., None] if g.dim() == 3 else decay[..., None, None])  # (b, h, dk, dv): decayed
    recalled = torch.matmul(k[:, :, None], s)  # (b, h, 1, dv): what s gives for k
    s = s + torch.matmul(k[..., None], (v[:, :, None] - recalled) * beta[..., None, None])  # (b, h, dk, dv)
    return torch.matmul(q[:, :, None], s)[:, :, 0], s


def gated_delta_ref(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s0: Tensor,
                    lower_bound: float | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule token by token (the reference a lowering must equal).

    q, k (b, l, h, dk): L2-normed, q also scaled by dk^-0.5; v (b, l, h, dv); g (b, l, h) log
    decays <= 0, or (b, l, h, dk) one per key channel; beta (b, l, h) in (0, 2); s0 (b, h, dk, dv)
    -> y (b, l, h, dv), s (b, h, dk, dv), both float32. A token with g = 0 and beta = 0 leaves s
    as it is. `lower_bound`: None, or the caller's promise that g >= it everywhere (a lowering
    may use it; the rule itself does not)."""
    s, ys = s0.float(), []
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    for t in range(q.shape[1]):
        y, s = delta_rule_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], s)
        ys.append(y)
    y = torch.stack(ys, 1) if ys else v.new_zeros(v.shape)  # (b, l, h, dv)
    return y, s


def l2_normed(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x (..., n) / sqrt(sum x^2 + eps) over the last dim (FLA's and transformers' l2norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's Gated DeltaNet: in_proj -> q, k, v through a causal depthwise conv (d_conv wide, no
    bias) and SiLU; q and k L2-normed (q scaled by dk^-0.5), each of hk heads serving hv / hk
    value heads; per value head a decay exp(g), g = -exp(A_log) softplus(a_proj(h) + dt_bias), and
    a write strength β = sigmoid(b_proj(h)) (2 sigmoid with delta_negative_eigenvalues); the gated
    delta rule over a (dk, dv) state per value head; its output RMS-normed per head and gated by
    SiLU(z_proj(h)); -> out_proj."""

    lower_bound: float | None = None  # a bound every log decay keeps to (Ling 3's KDA: its own)

    def __init__(self, config: HybridConfig):
        super().__init__()
        d, k = config.d_model, config.d_conv
        self.hk, self.hv = config.delta_k_heads, config.delta_v_heads
        self.dk, self.dv = config.delta_k_dim, config.delta_v_dim
        c, width = config.delta_conv_dim, self.hv * self.dv
        self.kernel = k
        self.in_proj = nn.Linear(d, c, bias=False)  # q | k | v: the conv's inputs
        self.b_proj = nn.Linear(d, self.hv, bias=False)  # β before its sigmoid
        self.conv1d = nn.Conv1d(c, c, kernel_size=k, groups=c, padding=k - 1, bias=False)
        self.beta_scale = 2.0 if config.delta_negative_eigenvalues else 1.0
        self.eps = config.rms_norm_eps if config.delta_norm_eps is None else config.delta_norm_eps
        self._build_gates(config)
        self.out_proj = nn.Linear(width, d, bias=False)

    def _build_gates(self, config: HybridConfig) -> None:
        """The decay's and the output gate's weights."""
        d = config.d_model
        self.z_proj = nn.Linear(d, self.hv * self.dv, bias=False)  # the output gate
        self.a_proj = nn.Linear(d, self.hv, bias=False)  # the decay's input
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.hv).uniform_(1, 16)))
        self.norm = RMSNormGated(self.dv, self.dv, self.eps, norm_before_gate=True)  # per head, shared

    def log_decay(self, h: Tensor) -> Tensor:
        """h (b, l, d) -> g (b, l, hv) float32: each value head's log decay, <= 0."""
        return -self.A_log.float().exp() * F.softplus(self.a_proj(h).float() + self.dt_bias.float())

    def gated(self, y: Tensor, h: Tensor) -> Tensor:
        """The rule's output y (b, l, hv, dv) float32, normed per head and gated -> (b, l, hv, dv) float32."""
        b, length, _ = h.shape
        return self.norm(y, self.z_proj(h).reshape(b, length, self.hv, self.dv))

    def forward(self, h: Tensor, conv_state: Tensor, state: Tensor, rule: Scan = gated_delta_ref,
                step: bool = False) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """h (b, l, d), conv_state (b, c, k) the last k conv inputs, state (b, hv, dk, dv) float32
        -> out (b, l, d), (new conv_state, new state). `rule`: the delta rule over l tokens
        (`gated_delta_ref` or an exporter's lowering); `step`: l = 1, the conv as one product."""
        b, length, _ = h.shape
        x_cat = torch.cat([conv_state.to(h.dtype), self.in_proj(h).transpose(1, 2)], dim=-1)  # (b, c, k + l)
        new_conv = x_cat[:, :, -self.kernel:]  # (b, c, k)
        if step:  # the window is the new conv state itself
            conv = (new_conv * self.conv1d.weight[:, 0, :]).sum(-1, keepdim=True)  # (b, c, 1)
        else:  # a valid conv over the state's last k - 1 inputs and the l new ones: l outputs
            conv = F.conv1d(x_cat[:, :, 1:], self.conv1d.weight, groups=self.conv1d.in_channels)  # (b, c, l)
        q, k, v = F.silu(conv).transpose(1, 2).split([self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], -1)
        q = l2_normed(q.reshape(b, length, self.hk, self.dk).float()) * self.dk ** -0.5  # (b, l, hk, dk)
        k = l2_normed(k.reshape(b, length, self.hk, self.dk).float())  # (b, l, hk, dk)
        if self.hv != self.hk:  # key head j serves value heads j * hv / hk .. (j + 1) * hv / hk - 1
            q, k = (t.repeat_interleave(self.hv // self.hk, dim=2) for t in (q, k))  # (b, l, hv, dk)
        beta = torch.sigmoid(self.b_proj(h).float())  # (b, l, hv)
        if self.beta_scale != 1:
            beta = beta * self.beta_scale
        y, state = rule(q, k, v.reshape(b, length, self.hv, self.dv), self.log_decay(h), beta, state,
                        lower_bound=self.lower_bound)  # (b, l, hv, dv)
        y = self.gated(y, h)  # (b, l, hv, dv) float32
        return self.out_proj(y.reshape(b, length, -1).to(h.dtype)), (new_conv, state)

    def allocate_inference_cache(self, batch: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        c = self.in_proj.out_features
        return (torch.zeros(batch, c, self.kernel, dtype=dtype, device=device),
                torch.zeros(batch, self.hv, self.dk, self.dv, dtype=torch.float32, device=device))


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi-Linear's Kimi Delta Attention: a Gated DeltaNet (q, k, v as its, one key head per
    value head) whose decay is per head AND key channel, g = -exp(A_log) softplus(f_b(f_a(h)) +
    dt_bias), (b, l, h, dk); its output RMS-normed per head and gated by sigmoid(g_b(g_a(h))).
    Ling 3's: one projection for each gate (f_proj, g_proj), and g bounded, lower_bound *
    sigmoid(exp(A_log) (f_proj(h) + dt_bias))."""

    def _build_gates(self, config: HybridConfig) -> None:
        d, h, dk = config.d_model, self.hv, self.dk
        if config.kda_low_rank_gates:  # the decay's input and the output gate, each through dk
            self.f_a_proj = nn.Linear(d, dk, bias=False)
            self.f_b_proj = nn.Linear(dk, h * dk, bias=False)
            self.g_a_proj = nn.Linear(d, self.dv, bias=False)
            self.g_b_proj = nn.Linear(self.dv, h * self.dv, bias=False)
        else:
            self.f_proj = nn.Linear(d, h * dk, bias=False)
            self.g_proj = nn.Linear(d, h * self.dv, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(h * dk))
        self.A_log = nn.Parameter(torch.log(torch.empty(h).uniform_(1, 16)))
        self.lower_bound = config.kda_gate_lower_bound
        self.norm = RMSNorm(self.dv, self.eps)  # per head, shared

    def log_decay(self, h: Tensor) -> Tensor:
        """h (b, l, d) -> g (b, l, h, dk) float32: a log decay per head and key channel, <= 0."""
        b, length, _ = h.shape
        f = self.f_proj(h) if hasattr(self, "f_proj") else self.f_b_proj(self.f_a_proj(h))  # (b, l, h dk)
        x = (f.float() + self.dt_bias.float()).view(b, length, self.hv, self.dk)  # (b, l, h, dk)
        rate = self.A_log.float().exp()[:, None]  # (h, 1)
        if self.lower_bound is not None:  # bounded: in (lower_bound, 0)
            return self.lower_bound * torch.sigmoid(rate * x)
        return -rate * F.softplus(x)

    def gated(self, y: Tensor, h: Tensor) -> Tensor:
        b, length, _ = h.shape
        gate = self.g_proj(h) if hasattr(self, "g_proj") else self.g_b_proj(self.g_a_proj(h))  # (b, l, h dv)
        return self.norm(y) * torch.sigmoid(gate.float().view(b, length, self.hv, self.dv))


def mamba1_mixer(config: HybridConfig) -> MambaMixer:
    """`models.mamba.MambaMixer` with the hybrid's sizes (Jamba's mixer: Mamba-1, its Δ input, B
    and C RMS-normed with weights when mamba1_dt_norm)."""
    return MambaMixer(MambaConfig(
        d_model=config.d_model, n_layer=1, vocab_size=1, d_state=config.d_state, d_conv=config.d_conv,
        expand=config.mamba1_expand, dt_rank=config.mamba1_dt_rank, bias=config.mamba_bias,
        conv_bias=config.conv_bias, rms_norm_eps=config.rms_norm_eps,
        mixer_rms_eps=config.rms_norm_eps if config.mamba1_dt_norm else None, mixer_norm_weights=config.mamba1_dt_norm,
    ))


class SiLUGate(nn.Module):
    """The mixer's output without a norm: y * SiLU(z) in float32 (Falcon-H1's mamba_rms_norm false)."""

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        """y, z (..., d_in) -> (..., d_in) float32."""
        return y.float() * F.silu(z.float())


class SharedBlock(nn.Module):
    """Zamba2's shared transformer block: attention over cat(x, embedding) (2 d wide) after its
    norm, then the gated MLP after a second norm; "zamba" layers call it in turn, each with its
    own adapters (LoRA) and its own KV cache."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        d = config.d_model
        self.norm = RMSNorm(2 * d, config.rms_norm_eps)
        self.attention = Attention(config, d_in=2 * d)
        self.mlp_norm = RMSNorm(d, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, embedded: Tensor, kv: LayerState, past_lengths: Tensor,
                rope: tuple[Tensor, Tensor] | None, step: bool, adapters: dict, mlp_adapter: nn.Module | None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x, embedded (b, l, d) -> the block's output (b, l, d) and the attention's new state."""
        h = self.norm(torch.cat([x, embedded], dim=-1))  # (b, l, 2 d)
        out, new_kv = self.attention(h, *kv, past_lengths, rope, step=step, adapters=adapters)  # (b, l, d)
        return self.mlp(self.mlp_norm(out), mlp_adapter), new_kv


def lora(d_in: int, rank: int, d_out: int) -> nn.Sequential:
    """x -> up(down(x)): a low-rank adapter (its weights `0.weight` (rank, d_in), `1.weight` (d_out, rank))."""
    return nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Linear(rank, d_out, bias=False))


_MIXERS = {"conv": ShortConv, "mamba": mamba1_mixer, "deltanet": GatedDeltaNet, "kda": KimiDeltaAttention,
           "mla": LatentAttention}  # the kinds whose mixer is built from the config alone


class HybridLayer(nn.Module):
    """x + r * mixer(norm(x)) [then x + r * mlp(mlp_norm(x)) when mlp_in_layer, plus the experts' output
    when it has experts], r the residual multiplier; a "moe" layer's mixer is its experts plus its
    shared expert MLP; a "parallel" layer's, its Mamba-2 mixer's output plus its attention's; a
    "conv" layer's, its gated short convolution; a "mamba" layer's, its Mamba-1 mixer. With
    `expert_layers`, a layer listed has its experts instead of its MLP. With attention_post_norm an
    "attention" layer norms its branches' outputs instead: x + r * norm(mixer(x)), then
    x + r * mlp_norm(mlp(x)); with sandwich_norm every layer norms both:
    x + r * post_norm(mixer(norm(x))), then x + r * post_mlp_norm(mlp(mlp_norm(x))).
    Each Mamba-2 / attention branch: out_multiplier * branch(in_multiplier * h)."""

    def __init__(self, config: HybridConfig, kind: str, index: int = 0):
        super().__init__()
        self.kind = kind
        self.norm_after = config.attention_post_norm and kind == "attention"  # (instead of before)
        self.local_rope = index in config.sliding_window_layers and config.sliding_rope_theta is not None
        self.residual_multiplier = config.residual_multiplier
        self.ssm_multipliers = (config.ssm_in_multiplier, config.ssm_out_multiplier)
        self.attention_multipliers = (config.attention_in_multiplier, config.attention_out_multiplier)
        # where the conv state sits in this layer's state tuple (None: no conv state)
        self.conv_index = {"mamba2": 0, "parallel": 2, "conv": 0, "mamba": 0, "deltanet": 0, "zamba": 2,
                           "kda": 0}.get(kind)
        self.block_id = config.layer_types[:index].count("zamba") % config.shared_blocks  # (a zamba layer's block)
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self._build_mixer(config, kind, index)
        # the layer's own feed-forward (mlp_in_layer): its MLP, its experts, or both (see expert_layers)
        feed_forward = config.mlp_in_layer and kind != "mlp"
        where = config.expert_layers
        if feed_forward:
            self.mlp_norm = RMSNorm(config.d_model, config.rms_norm_eps)
        if config.sandwich_norm:  # each branch's output normed too
            self.post_norm = RMSNorm(config.d_model, config.rms_norm_eps)
            if feed_forward:
                self.post_mlp_norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.mlp = MLP(config) if feed_forward and (where is None or index not in where) else None
        self.experts = Experts(config, config.swiglu_limit("expert_swiglu_limits", index)) \
            if feed_forward and config.n_experts and (where is None or index in where) else None
        if self.experts is not None and (config.gated_shared_expert or config.plain_shared_expert):
            # beside the experts
            self.shared = MLP(config, config.d_ff_shared_expert, config.swiglu_limit("shared_swiglu_limits", index))
            if config.gated_shared_expert:  # gated per token
                self.shared_gate = nn.Linear(config.d_model, 1, bias=False)

    def _build_mixer(self, config: HybridConfig, kind: str, index: int) -> None:
        """The layer's mixer (a "parallel" layer's attention beside it; a "moe" layer's shared MLP)."""
        if kind in MAMBA_KINDS:
            self.mixer = mamba2_mixer(config)
            if kind == "parallel":
                self.attention = Attention(config)
            if kind == "zamba":  # the shared block's output -> the mixer's input; its own adapters
                self._build_zamba(config)
        elif kind == "attention":
            self.mixer = Attention(config, config.sliding_window if index in config.sliding_window_layers else None)
        elif kind in _MIXERS:
            self.mixer = _MIXERS[kind](config)
        elif kind == "moe":
            self.mixer = Experts(config, config.swiglu_limit("expert_swiglu_limits", index))
            self.shared = MLP(config, config.d_ff_shared_expert, config.swiglu_limit("shared_swiglu_limits", index))
        else:
            self.mixer = MLP(config)

    def _build_zamba(self, config: HybridConfig) -> None:
        d, r = config.d_model, config.shared_adapter_rank
        self.linear = nn.Linear(d, d, bias=False)
        if r:
            self.mlp_adapter = lora(d, r, 2 * config.d_ff)  # gate then up
        if r and config.shared_attention_adapters:
            self.adapters = nn.ModuleDict({name: lora(2 * d, r, width) for name, width in
                                           (("q", config.n_heads * config.head_dim),
                                            ("k", config.n_kv_heads * config.head_dim),
                                            ("v", config.n_kv_heads * config.head_dim))})

    def _zamba(self, x: Tensor, state: LayerState, past_lengths: Tensor, rope, scan: Scan, step: bool,
               shared: SharedBlock, embedded: Tensor) -> tuple[Tensor, LayerState]:
        """A zamba layer: x + mixer(norm(x + linear(shared(x, embedded)))) -> (b, l, d) and its
        state (key, value, conv_state, ssm_state)."""
        adapters = dict(self.adapters) if hasattr(self, "adapters") else {}
        t, new_kv = shared(x, embedded, state[:2], past_lengths, rope, step, adapters,
                           getattr(self, "mlp_adapter", None))  # (b, l, d)
        out, new_ssm = self._mamba(self.norm(x + self.linear(t)), state[2:], scan, step)
        return self._residual(x, out), (*new_kv, *new_ssm)

    def _residual(self, x: Tensor, out: Tensor) -> Tensor:
        return x + (out if self.residual_multiplier == 1 else out * self.residual_multiplier)

    @staticmethod
    def _scaled(x: Tensor, multiplier: float) -> Tensor:
        return x if multiplier == 1 else x * multiplier

    def _mamba(self, h: Tensor, state: LayerState, scan: Scan, step: bool) -> tuple[Tensor, LayerState]:
        """The Mamba-2 (or a "mamba" layer's Mamba-1) branch: h (b, l, d) -> out (b, l, d), (conv_state,
        ssm_state); `scan` the mixer's."""
        into, out_of = self.ssm_multipliers
        h = self._scaled(h, into)
        out, conv_state, ssm_state = self.mixer.step(h, *state) if step else self.mixer(h, *state, scan=scan)
        return self._scaled(out, out_of), (conv_state, ssm_state)

    def _attention(self, attention: nn.Module, h: Tensor, state: LayerState, past_lengths: Tensor,
                   rope: tuple[Tensor, Tensor] | None, step: bool) -> tuple[Tensor, LayerState]:
        """The attention branch: h (b, l, d) -> out (b, l, d), the new positions' (key, value)."""
        into, out_of = self.attention_multipliers
        out, new_kv = attention(self._scaled(h, into), *state, past_lengths, rope, step=step)
        return self._scaled(out, out_of), new_kv

    def forward(
        self, x: Tensor, state: LayerState, past_lengths: Tensor, rope: tuple[Tensor, Tensor] | None,
        scan: Scan, step: bool, selective_scan: Scan = selective_scan_ref, delta_rule: Scan = gated_delta_ref,
        shared: SharedBlock | None = None, embedded: Tensor | None = None,
    ) -> tuple[Tensor, LayerState]:
        """x (b, l, d) -> (b, l, d) and this layer's new state (the new positions' K/V for attention).
        `step`: l = 1 and the mamba2 mixer takes its single-token path. `scan`: the Mamba-2 mixers',
        `selective_scan`: the Mamba-1 mixers', `delta_rule`: the Gated DeltaNets'. A zamba layer's
        `shared` block and the model's `embedded` tokens (b, l, d)."""
        if self.kind == "zamba":
            return self._zamba(x, state, past_lengths, rope, scan, step, shared, embedded)
        h = x if self.norm_after else self.norm(x)
        out, new_state = self._mix(h, state, past_lengths, rope, scan, step, selective_scan, delta_rule)
        x = self._residual(x, self._normed_output(out, self.norm, "post_norm"))
        if self.mlp is not None or self.experts is not None:
            fed = self._feed_forward(x if self.norm_after else self.mlp_norm(x))
            x = self._residual(x, self._normed_output(fed, self.mlp_norm, "post_mlp_norm"))
        return x, new_state

    def _mix(self, h: Tensor, state: LayerState, past_lengths: Tensor, rope: tuple[Tensor, Tensor] | None,
             scan: Scan, step: bool, selective_scan: Scan, delta_rule: Scan) -> tuple[Tensor, LayerState]:
        """The layer's mixer on its normed input h (b, l, d) -> out (b, l, d), its new state."""
        if self.kind == "mamba2":
            return self._mamba(h, state, scan, step)
        if self.kind == "mamba":
            return self._mamba(h, state, selective_scan, step)
        if self.kind == "parallel":  # state: (key, value, conv_state, ssm_state)
            out, new_ssm = self._mamba(h, state[2:], scan, step)
            attended, new_kv = self._attention(self.attention, h, state[:2], past_lengths, rope, step)
            return out + attended, (*new_kv, *new_ssm)
        if self.kind == "attention":
            return self._attention(self.mixer, h, state, past_lengths, rope, step)
        if self.kind == "conv":
            return self.mixer(h, *state, step=step)
        if self.kind in DELTA_KINDS:
            return self.mixer(h, *state, rule=delta_rule, step=step)
        if self.kind == "mla":
            return self.mixer(h, *state, past_lengths, rope, step=step)
        if self.kind == "moe":
            return self.mixer(h) + self.shared(h), ()
        return self.mixer(h), ()

    def _normed_output(self, out: Tensor, before: nn.Module, after: str) -> Tensor:
        """A branch's output (b, l, d) as the residual takes it: normed by the branch's own norm
        where it norms outputs instead of inputs (norm_after), or by its sandwich norm `after`."""
        if self.norm_after:
            out = before(out)
        return getattr(self, after)(out) if hasattr(self, after) else out

    def _feed_forward(self, h: Tensor) -> Tensor:
        """The layer's own feed-forward (mlp_in_layer) on h (b, l, d): its experts, its MLP, and the
        gated shared expert, summed -> (b, l, d)."""
        parts = [f(h) for f in (self.experts, self.mlp) if f is not None]
        if hasattr(self, "shared_gate"):  # the gated shared expert (a "moe" layer's shared is its mixer's)
            parts.append(torch.sigmoid(self.shared_gate(h)) * self.shared(h))
        elif self.experts is not None and hasattr(self, "shared"):  # the plain one
            parts.append(self.shared(h))
        out = parts[0]
        for part in parts[1:]:
            out = out + part
        return out


class HybridLM(nn.Module):
    """The hybrid language model: embedding (times embedding_multiplier) -> layers -> norm_f ->
    lm_head (logits divided by logits_scaling). Logits are float32, sliced to vocab_size."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.layers = nn.ModuleList([HybridLayer(config, kind, i) for i, kind in enumerate(config.layer_types)])
        if "zamba" in config.layer_types:  # owned here once, called by the zamba layers in turn
            self.shared_blocks = nn.ModuleList([SharedBlock(config) for _ in range(config.shared_blocks)])
        self.norm_f = RMSNorm(config.d_model, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_frequencies(config), persistent=False)  # (rd / 2,)
        if config.sliding_rope_theta is not None:  # the sliding-window layers' own: the whole head
            local = inverse_frequencies(config.sliding_rope_theta, config.head_dim)  # (hd / 2,)
            self.register_buffer("local_inv_freq", local, persistent=False)
        self._init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.no_grad()
    def _init_weights(self):
        # As transformers' hybrids: linears and the embedding ~ N(0, 0.02), biases zero (the
        # Mamba-2 mixers keep their own dt_bias / A_log / D / conv init).
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, Experts):
                for stack in module.stacks:
                    nn.init.normal_(stack, std=0.02)

    @staticmethod
    def _rope(positions: Tensor, dtype: torch.dtype, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
        """positions (b, l) int64 -> cos, sin (b, 1, l, rd) in `dtype`, angles computed in float32."""
        freqs = positions[..., None].float() * inv_freq  # (b, l, rd / 2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (b, 1, l, rd)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _run(self, input_ids: Tensor, state: list[LayerState] | None, past_lengths: Tensor | None,
             scan: Scan, step: bool, selective_scan: Scan = selective_scan_ref,
             delta_rule: Scan = gated_delta_ref) -> tuple[Tensor, list[LayerState]]:
        b, length = input_ids.shape
        if state is None:
            state = self.allocate_inference_cache(b, device=input_ids.device)
        if past_lengths is None:
            past_lengths = torch.zeros(b, dtype=torch.long, device=input_ids.device)
        x = self.embed_tokens(input_ids)  # (b, l, d)
        if self.config.embedding_multiplier != 1:
            x = x * self.config.embedding_multiplier
        rope = local = None
        if self.config.rope:
            positions = past_lengths[:, None] + torch.arange(length, device=input_ids.device)  # (b, l)
            rope = self._rope(positions, x.dtype, self.inv_freq)
            if hasattr(self, "local_inv_freq"):
                local = self._rope(positions, x.dtype, self.local_inv_freq)
        new_state, embedded = [], x
        for layer, layer_state in zip(self.layers, state, strict=True):
            shared = self.shared_blocks[layer.block_id] if layer.kind == "zamba" else None
            x, layer_state = layer(x, layer_state, past_lengths, local if layer.local_rope else rope, scan, step,
                                   selective_scan, delta_rule, shared, embedded)
            new_state.append(layer_state)
        logits = self.lm_head(self.norm_f(x)).float()[..., : self.config.vocab_size]  # (b, l, v)
        if self.config.logits_scaling != 1:
            logits = logits / self.config.logits_scaling
        return logits, new_state

    def forward(
        self, input_ids: Tensor, state: list[LayerState] | None = None, past_lengths: Tensor | None = None,
        scan: Scan = ssd_sequential, selective_scan: Scan = selective_scan_ref, delta_rule: Scan = gated_delta_ref,
    ) -> tuple[Tensor, list[LayerState]]:
        """Run l >= 1 tokens on from `state` (None: a fresh sequence).

        Args:
            input_ids:    (b, l) int64; row r's tokens take positions past_lengths[r] .. + l - 1
            state:        list over layers (see the module docstring); attention buffers (b, nkv, P, hd)
            past_lengths: (b,) int64 valid attention slots per row (None: zeros)
            scan:         the SSD scan of the mamba2 layers (`ssd_sequential`,
                          `partial(ssd_chunked, chunk=...)`, or an exporter's wrapper)
            selective_scan: the selective scan of the "mamba" (Mamba-1) layers (`selective_scan_ref`,
                          or an exporter's lowering)
            delta_rule:   the gated delta rule of the "deltanet" layers (`gated_delta_ref`, or an
                          exporter's lowering)
        Returns:
            logits (b, l, vocab_size) float32 and the new state: mamba2 layers' whole, attention
            layers' new positions only, (key, value) each (b, nkv, l, hd); "mlp" layers ().
        """
        return self._run(input_ids, state, past_lengths, scan, step=False, selective_scan=selective_scan,
                         delta_rule=delta_rule)

    def step(
        self, token_ids: Tensor, state: list[LayerState], past_lengths: Tensor | None = None
    ) -> tuple[Tensor, list[LayerState]]:
        """One token per row, no loop; the conventions of `forward` with l = 1.

        Args:
            token_ids:    (b,) or (b, 1) int64, at positions past_lengths
            state, past_lengths: as in `forward`
        Returns:
            logits (b, vocab_size) float32 and the new state (attention: (b, nkv, 1, hd) each).
        """
        logits, new_state = self._run(token_ids.reshape(-1, 1), state, past_lengths, ssd_sequential, step=True)
        return logits[:, 0], new_state  # (b, v)

    def allocate_inference_cache(
        self, batch: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> list[LayerState]:
        """State of a fresh sequence: mamba2 and conv zeros, attention buffers with P = 0 (a
        window's: its slots, zeros), "mlp" ()."""
        w = self.embed_tokens.weight
        dtype, device = dtype or w.dtype, device or w.device
        c = self.config
        state = []
        for layer in self.layers:
            slots = layer.mixer.window if layer.kind == "attention" and layer.mixer.window else 0  # (a window: zeros)
            kv = tuple(torch.zeros(batch, c.n_kv_heads, slots, c.head_dim, dtype=dtype, device=device)
                       for _ in range(2))
            has_conv = layer.conv_index is not None  # a Mamba-2 mixer or a short conv
            ssm = layer.mixer.allocate_inference_cache(batch, dtype, device) if has_conv else ()
            if layer.kind == "mla":  # its latents and shared key parts, P = 0
                kv = layer.mixer.allocate_inference_cache(batch, dtype, device)
            state.append((kv if layer.kind in ATTENTION_KINDS else ()) + tuple(ssm))
        return state


def append_kv(state: list[LayerState], new_state: list[LayerState], past_lengths: Tensor | None,
              windowed=()) -> list[LayerState]:
    """The next call's state, for eager users and tests (graphs never use it; a runtime writes in place).
    `windowed`: the layers whose attention state is a window (`config.sliding_window_layers`),
    taken as it is.

    Attention layers (a 4-d first tensor in the new state): the new (key, value) (b, nkv, l, hd)
    are written into copies of the buffers at row r's slots past_lengths[r] .. + l - 1, the buffers
    grown (zero-filled) to max(P, max(past_lengths) + l) slots when needed; a "parallel" layer's
    conv/SSM state after them is taken as it is. Mamba2 and conv layers: the new state as it is. "mlp"
    layers: (). Returns a new list; nothing handed in is modified.
    """
    out = []
    for i, (old, new) in enumerate(zip(state, new_state, strict=True)):
        if len(new) not in (2, 4) or new[0].dim() != 4 or i in windowed:  # mamba2, conv (3-d), "mlp", a window
            out.append(new)
            continue
        (key, value), (new_key, new_value), replaced = old[:2], new[:2], tuple(new[2:])
        b, _, P, _ = key.shape
        length = new_key.shape[2]
        lengths = past_lengths if past_lengths is not None else torch.zeros(b, dtype=torch.long, device=key.device)
        if b and int(lengths.max()) > P:
            raise ValueError(f"past_lengths {lengths.tolist()} exceed the buffer's {P} slots")
        capacity = max(P, int(lengths.max()) + length) if b else P + length
        slots = lengths[:, None] + torch.arange(length, device=key.device)  # (b, l)
        out.append((_write_at(key, new_key, slots, capacity), _write_at(value, new_value, slots, capacity), *replaced))
    return out


def _write_at(buffer: Tensor, new: Tensor, slots: Tensor, capacity: int) -> Tensor:
    """buffer (b, nkv, P, hd) grown to (b, nkv, capacity, hd), new (b, nkv, l, hd) written at slots (b, l)."""
    b, nkv, P, hd = buffer.shape
    grown = buffer.new_zeros(b, nkv, capacity, hd)  # (b, nkv, capacity, hd)
    grown[:, :, :P] = buffer
    index = slots[:, None, :, None].expand(b, nkv, slots.shape[1], hd)  # (b, nkv, l, hd)
    return grown.scatter(2, index, new.to(buffer.dtype))
