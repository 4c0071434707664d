"""Read the hybrid checkpoint layouts into `models.hybrid.HybridLM`.

Sixteen config layouts, told apart by `family` / `model_type`:

- ours: the keys of `HybridConfig` plus `"family": "hybrid"`;
- transformers' `BambaConfig` (`model_type: "bamba"`): attention at `attn_layer_indices`, Mamba-2
  elsewhere, every layer followed by its gated MLP (`intermediate_size`); RoPE on the first
  `partial_rotary_factor` of each head, 0.5 unless `rope_parameters` says otherwise (BambaConfig
  inserts 0.5 when absent);
- transformers' `GraniteMoeHybridConfig` (`model_type: "granitemoehybrid"`): `layer_types`
  ("linear_attention" / "full_attention", or the legacy "mamba" / "attention"); the MLP is the
  shared one (`shared_intermediate_size`, its `input_linear` holding gate then up), and with
  `num_local_experts` > 0 (Granite-4.0-H Tiny / Small) the `block_sparse_moe` beside it:
  `num_experts_per_tok` of the experts (`intermediate_size` wide) per token;
  `position_embedding_type` None = no positions, "rope" = RoPE over the whole head (its rotary init ignores `partial_rotary_factor`); the softmax scale
  is `attention_multiplier` itself; `embedding_multiplier`, `residual_multiplier` (both residual
  adds) and `logits_scaling` (a divisor);
- transformers' `NemotronHConfig` (`model_type: "nemotron_h"`): `layers_block_type`
  ("linear_attention" / "full_attention" / "mlp", legacy "mamba" / "attention") or an older
  config's `hybrid_override_pattern` ("M" / "*" / "-"); each layer one block, the MLP layers
  squared-ReLU and ungated (`mlp_hidden_act: relu2`), attention without positions, without
  biases (`attention_bias` is not read by its attention) and scaled by head_dim^-0.5; the Mamba-2
  width is `mamba_num_heads * mamba_head_dim` (not `expand * hidden_size`); its mixer clamps Δ to
  `[time_step_min, inf)` (not `time_step_limit`, which it does not read); `use_bias` (not
  `mamba_proj_bias`) puts biases in in_proj / out_proj; its lm_head is never tied to the embedding
  (`tie_word_embeddings` is not acted on).

- transformers' `FalconH1Config` (`model_type: "falcon_h1"`): every layer "parallel" (attention and
  a Mamba-2 mixer on one pre-norm, summed, then the gated MLP); the mixer `mamba_d_ssm` wide (or
  `mamba_expand * hidden_size`), its output gated by SiLU(z) alone unless `mamba_rms_norm` (then the
  grouped gated RMSNorm, `mamba_norm_before_gate`); RoPE over the whole head (its rotary init reads
  no `partial_rotary_factor`), scaled by head_dim^-0.5; the μP multipliers (`embedding_multiplier`,
  `key_multiplier`, `attention_in/out_multiplier`, `ssm_in/out_multiplier`, `ssm_multipliers` over
  in_proj's z, x, B, C, Δ, `mlp_multipliers` on the gate and the output) kept as they are, and
  `lm_head_multiplier` as logits_scaling = 1 / it. `mamba_proj_bias` (in_proj) and `projectors_bias`
  (out_proj) must agree (ours has one `mamba_bias`).

- transformers' `Lfm2Config` (`model_type: "lfm2"`, Liquid AI's LFM2): `layer_types` ("conv" /
  "full_attention"), or `full_attn_idxs` (every layer attention when neither is given); a "conv"
  layer is the gated short convolution (`conv_L_cache` wide, `conv_bias` in its in_proj, conv and
  out_proj), an attention layer RMS-norms queries and keys per head before RoPE (theta 1e6 unless
  `rope_parameters` says otherwise) and is scaled by head_dim^-0.5; every layer ends with its gated
  MLP, whose width is `intermediate_size` (`block_ff_dim`) adjusted as transformers adjusts it
  when `block_auto_adjust_ff_dim` (2/3 of it, times `block_ffn_dim_multiplier`, rounded up to
  `block_multiple_of`); one `norm_eps`; the head tied to the embedding unless
  `tie_word_embeddings` (`tie_embedding`) is false;
- transformers' `Lfm2MoeConfig` (`model_type: "lfm2_moe"`, LFM2-8B-A1B): LFM2's layers (its
  `layer_types` required), the first `num_dense_layers` with a gated MLP `intermediate_size` wide
  (not adjusted), the rest with `num_experts` experts of `moe_intermediate_size` instead, a token
  taking `num_experts_per_tok` of them by a sigmoid router whose choice adds `expert_bias`
  (`use_expert_bias`), weighted by their scores normalised (`norm_topk_prob`, + 1e-6) and times
  `routed_scaling_factor`;
- transformers' `Lfm3Config` (`model_type: "lfm3"`, Liquid AI's LFM3): LFM2's short convs (`conv_L_cache`
  wide, 7 by default) beside attention of two kinds, `layer_types` "sliding_attention" (a query
  sees the last `sliding_window` positions, its own included) and "full_attention", each with
  its own RoPE from `rope_parameters[kind]`: "default" (the whole head: transformers' Lfm3 reads
  no partial factor there) or "proportional" (full attention only: the first
  `partial_rotary_factor` * head_dim / 2 pairs (j, j + head_dim / 2) turn, at theta^(-2j / head_dim));
  queries and keys RMS-normed per head, each head's output times sigmoid(g_proj(x)) where
  `use_attention_gate`, and with `use_sandwich_norm` every branch's output RMS-normed too
  (`post_operator_norm`, `post_ffn_norm`); the MLP `intermediate_size` wide (not adjusted);
  absent `layer_types`: Lfm3Config's own (attention at i % 4 == 2, sliding at i % 4 == 0 past 0);
- transformers' `JambaConfig` (`model_type: "jamba"`, AI21's Jamba): attention (no positions,
  head_dim^-0.5) where `i % attn_layer_period == attn_layer_offset`, Mamba-1 mixers elsewhere
  (`mamba_expand * hidden_size` wide, `mamba_d_state`, `mamba_d_conv`, `mamba_dt_rank` ("auto":
  ceil(hidden_size / 16)), their Δ input, B and C RMS-normed with weights), every layer ending
  with its gated MLP, or with `num_experts` experts instead where `i % expert_layer_period ==
  expert_layer_offset` (`intermediate_size` wide, `num_experts_per_tok` a token: the top k of the
  router's softmax over all experts, not renormalised);
- transformers' `Qwen3_5TextConfig` (`model_type: "qwen3_5_text"`), and the `text_config` of
  Qwen3.5's image-text `Qwen3_5Config` (`model_type: "qwen3_5"`: its vision tower is not read,
  its head tied by the top-level `tie_word_embeddings`): `layer_types` ("linear_attention" /
  "full_attention", or every `full_attention_interval`-th layer attention); a linear-attention
  layer is a Gated DeltaNet (`linear_num_key_heads` / `linear_num_value_heads` heads of
  `linear_key_head_dim` / `linear_value_head_dim`, conv `linear_conv_kernel_dim`); attention has
  an output gate and per-head q/k norms, RoPE on `partial_rotary_factor` (0.25) of each head; every
  RMSNorm but the DeltaNet's is zero-centred (x̂ * (1 + w)), read as ours with w' = 1 + w;
  and Qwen3.5-MoE's (`qwen3_5_moe_text`, `qwen3_5_moe`): the same layers with `num_experts`
  experts of `moe_intermediate_size` instead of the MLP in every layer (`num_experts_per_tok` a
  token, the router's softmax over them renormalised) beside a shared expert MLP of
  `shared_expert_intermediate_size` gated by sigmoid(shared_expert_gate(h));
- transformers' `Qwen3NextConfig` (`model_type: "qwen3_next"`, Qwen3-Next): Qwen3.5-MoE's layers
  with the DeltaNet's projections fused as saved (`in_proj_qkvz`: per key head its query, key,
  and the values and gates of the value heads it serves; `in_proj_ba`: per key head its value
  heads' write strengths, then their decays), read apart into ours; experts in the layers not in
  `mlp_only_layers` where (i + 1) % `decoder_sparse_step` == 0, a gated MLP of
  `intermediate_size` in the others; the top k's weights renormalised where `norm_topk_prob`;
- transformers' `OlmoHybridConfig` (`model_type: "olmo_hybrid"`, AI2's OLMo-hybrid): `layer_types`
  ("linear_attention" / "full_attention"; absent, every 4th layer attends and the last at least);
  a linear-attention layer is a pre-norm Gated DeltaNet with its q, k and v projections apart
  (read into one in_proj in that order, the conv's channel order), its output gate `g_proj`, its
  gated norm's epsilon 1e-5 (FLA's, not `rms_norm_eps`) and, with `linear_allow_neg_eigval`
  (default), β = 2 sigmoid(b); an attention layer is post-norm (x + norm(attn(x)), x +
  norm(mlp(x))), its queries and keys RMS-normed across all heads, RoPE over the whole head
  unless `rope_parameters` holds `rope_theta: null` (as the released checkpoints do: no
  positions), scaled by head_dim^-0.5; every layer ends with its gated MLP.

- transformers' `Zamba2Config` (`model_type: "zamba2"`, Zyphra's Zamba2): `layers_block_type`
  ("mamba" / "linear_attention": a pre-norm Mamba-2 layer without an MLP; "hybrid": the same
  after a call of one of `num_mem_blocks` shared transformer blocks, taken in turn, on cat(x,
  the embedding) — attention 2 * hidden_size wide in heads of 2 * hidden_size / heads, scaled by
  (head_dim / 2)^-0.5, RoPE only with `use_mem_rope`, then a gated MLP (`hidden_act`, gelu by
  default, `intermediate_size` or 4 * hidden_size wide) — whose output, through the layer's own
  `linear`, joins the Mamba-2 layer's input); each hybrid layer's own LoRA adapters of
  `adapter_rank` on the block's MLP gate/up, and on its q/k/v with
  `use_shared_attention_adapter`; the mixer `mamba_expand * hidden_size` wide in `n_mamba_heads`
  heads, its conv biased, Δ clamped at `time_step_min`; `add_bias_linear` biases in_proj,
  out_proj and the MLP. Its mixers' gated norms have epsilon 1e-5 whatever `rms_norm_eps` says:
  another `rms_norm_eps` is refused.

Nemotron-H's mixture-of-experts layers ("moe" / "E": `n_routed_experts` squared-ReLU experts of
`moe_intermediate_size`, `num_experts_per_tok` a token, a sigmoid router whose choice adds
`e_score_correction_bias` within the best `topk_group` of `n_group` groups, weights normalised
by `norm_topk_prob` and times `routed_scaling_factor`, beside a shared expert MLP of
`moe_shared_expert_intermediate_size`) are read too; a `moe_latent_size` (a latent projection
around the experts) is refused, naming it. Keys absent from a transformers config.json take that
config class's defaults in transformers 5.24.

What transformers' torch paths do that ours does differently, only where it cannot matter for a
checkpoint loaded as it is:
- their single-token Mamba-2 path does not clamp Δ, their prefill does; ours clamps in both
  (so `step` equals `forward` with l = 1). With the default limits (0, inf) nothing differs;
- Bamba's `forward` without `position_ids` puts every call's tokens at positions 0 .. l-1
  (it does not add the cache length); generate() passes position_ids. Ours always places row r's
  tokens at past_lengths[r] onwards.
"""

import math
import re
from dataclasses import fields
from functools import partial

import torch
from torch import Tensor

from seqexport.families.hybrid import MODEL_TYPES
from seqexport.models.hybrid import HybridConfig, HybridLM

_OURS = {f.name for f in fields(HybridConfig)}
_LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}

# transformers 5.24's class defaults for the keys a config.json may leave out.
_BAMBA_DEFAULTS = dict(
    vocab_size=128000, tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-5, attn_layer_indices=None,
    mamba_n_heads=128, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=256, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False, time_step_limit=(0.0, math.inf),
    rope_parameters=None, attention_bias=False, mlp_bias=False,
)
_GRANITE_DEFAULTS = dict(
    vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
    hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=None, attention_bias=False,
    embedding_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0, attention_multiplier=1.0,
    num_local_experts=8, num_experts_per_tok=2, intermediate_size=11008, shared_intermediate_size=1024,
    position_embedding_type=None, layer_types=None,
    mamba_n_heads=128, mamba_n_groups=1, mamba_d_state=256, mamba_d_head="auto", mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False, time_step_limit=(0.0, math.inf),
)
_NEMOTRON_H_DEFAULTS = dict(
    vocab_size=131072, hidden_size=4096, layers_block_type=None, tie_word_embeddings=False, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=21504, mlp_hidden_act="relu2", mlp_bias=False,
    ssm_state_size=128, mamba_num_heads=128, mamba_head_dim=64, mamba_hidden_act="silu", n_groups=8,
    conv_kernel=4, chunk_size=128, time_step_min=0.001, use_conv_bias=True, use_bias=False,
    layer_norm_epsilon=1e-5, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=7688,
    moe_shared_expert_intermediate_size=7688, n_group=1, topk_group=1, norm_topk_prob=True,
    routed_scaling_factor=1.0, moe_latent_size=None,
)
_FALCON_H1_DEFAULTS = dict(
    vocab_size=128000, tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-5,
    mamba_d_ssm=1024, mamba_n_heads=128, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=256, mamba_d_conv=4,
    mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False, mamba_norm_before_gate=True,
    mamba_rms_norm=False, time_step_limit=(0.0, math.inf), projectors_bias=False, rope_parameters=None,
    lm_head_multiplier=1.0, embedding_multiplier=1.0, mlp_multipliers=None, key_multiplier=1.0,
    attention_out_multiplier=1.0, attention_in_multiplier=1.0, ssm_multipliers=None, ssm_in_multiplier=1.0,
    ssm_out_multiplier=1.0, attention_bias=False, mlp_bias=False,
)
_LFM2_DEFAULTS = dict(
    vocab_size=65536, hidden_size=2560, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=None, conv_bias=False,
    conv_L_cache=3, block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
    full_attn_idxs=None, layer_types=None,
)
_LFM2_MOE_DEFAULTS = dict(
    vocab_size=65536, hidden_size=2048, intermediate_size=7168, moe_intermediate_size=1792, num_hidden_layers=32,
    tie_word_embeddings=True, rope_parameters=None, norm_eps=1e-5, num_attention_heads=32, num_key_value_heads=8,
    conv_bias=False, conv_L_cache=3, num_dense_layers=2, num_experts_per_tok=4, num_experts=32, use_expert_bias=True,
    routed_scaling_factor=1.0, norm_topk_prob=True, layer_types=None, full_attn_idxs=None,
)
_JAMBA_DEFAULTS = dict(
    vocab_size=65536, tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-6, num_experts_per_tok=2,
    num_experts=16, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=8, attn_layer_offset=4,
    mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank="auto", mamba_conv_bias=True,
    mamba_proj_bias=False,
)
_QWEN3_5_DEFAULTS = dict(
    vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
    num_key_value_heads=4, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=None,
    attention_bias=False, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_num_key_heads=16, linear_num_value_heads=32, layer_types=None, full_attention_interval=4,
)
_QWEN3_5_MOE_DEFAULTS = dict(
    _QWEN3_5_DEFAULTS, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
    moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts_per_tok=8, num_experts=256,
)
_QWEN3_NEXT_DEFAULTS = dict(
    _QWEN3_5_DEFAULTS, vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
    num_key_value_heads=2, decoder_sparse_step=1, moe_intermediate_size=512, shared_expert_intermediate_size=512,
    num_experts_per_tok=10, num_experts=512, norm_topk_prob=True, mlp_only_layers=[],
)
_OLMO_HYBRID_DEFAULTS = dict(
    vocab_size=100352, hidden_size=3840, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=30,
    num_key_value_heads=None, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=None,
    attention_bias=False, layer_types=None, linear_num_key_heads=None, linear_num_value_heads=None,
    linear_key_head_dim=None, linear_value_head_dim=None, linear_conv_kernel_dim=4, linear_allow_neg_eigval=True,
)
_LFM3_DEFAULTS = dict(
    vocab_size=128000, hidden_size=2048, intermediate_size=7680, num_hidden_layers=24, num_attention_heads=16,
    num_key_value_heads=4, norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=None, conv_bias=False,
    conv_L_cache=7, layer_types=None, head_dim=128, sliding_window=256, use_sandwich_norm=True,
    use_attention_gate=True, attention_bias=False,
)
_LFM3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5}}
_KIMI_LINEAR_DEFAULTS = dict(  # KimiLinearConfig's, under the names its config.json is saved with
    vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024, num_hidden_layers=27,
    num_attention_heads=32, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128,
    qk_nope_head_dim=128, num_expert_group=1, topk_group=1, num_experts_per_token=8, moe_renormalize=True,
    hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, num_experts=256,
    num_shared_experts=1, routed_scaling_factor=2.446, linear_head_dim=128, linear_num_heads=32,
    linear_conv_kernel_dim=4, layer_types=None, mlp_layer_types=None,
)
# KimiLinearConfig's attribute_map: a config.json may carry either name
_KIMI_LINEAR_ALIASES = dict(num_local_experts="num_experts", num_experts_per_tok="num_experts_per_token",
                            n_group="num_expert_group", n_shared_experts="num_shared_experts",
                            norm_topk_prob="moe_renormalize")
_BAILING_HYBRID_DEFAULTS = dict(  # BailingHybridConfig's (Ling 3), as its config.json is saved
    {k: v for k, v in _KIMI_LINEAR_DEFAULTS.items() if not k.startswith("linear_")},  # (its KDA's: from head_dim)
    vocab_size=157184, hidden_size=2560, intermediate_size=6144, moe_intermediate_size=768,
    num_hidden_layers=42, routed_scaling_factor=2.5, num_expert_group=8, topk_group=4, rms_norm_eps=1e-6,
    num_experts=512, head_dim=128, short_conv_kernel_size=4, layer_group_size=6, first_k_dense_replace=2,
    kda_safe_gate=True, kda_lower_bound=-5.0, rope_theta=6_000_000.0,
)
_BAILING_HYBRID_ALIASES = dict(_KIMI_LINEAR_ALIASES, swiglu_limits="expert_swiglu_limit_list",
                               swiglu_limits_shared="share_expert_swiglu_limit_list")
_ZAMBA2_DEFAULTS = dict(
    vocab_size=32000, hidden_size=2560, num_hidden_layers=54, layers_block_type=None, mamba_d_state=64,
    mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, time_step_min=0.001, n_mamba_heads=8, chunk_size=256,
    add_bias_linear=False, intermediate_size=None, hidden_act="gelu", num_attention_heads=32, num_key_value_heads=None,
    num_mem_blocks=1, use_shared_attention_adapter=False, adapter_rank=128, use_mem_rope=False, rope_parameters=None,
    rms_norm_eps=1e-5, use_long_context=False, tie_word_embeddings=True,
)
_LFM2_ALIASES = dict(block_ff_dim="intermediate_size", tie_embedding="tie_word_embeddings")  # read as the latter
# Older Nemotron-H config.json names that NemotronHConfig still reads (old name -> new name).
_NEMOTRON_H_ALIASES = dict(mamba_n_groups="n_groups", mamba_d_conv="conv_kernel", mamba_dt_min="time_step_min",
                           mamba_conv_bias="use_conv_bias", mamba_chunk_size="chunk_size",
                           num_local_experts="n_routed_experts")
# Nemotron-H's MoE mixer (after the layer prefix `layers.{i}.mixer.`) -> ours; `experts.{j}.` keys
# (as saved, one expert each) are stacked in `_stack_experts`
_NEMOTRON_H_MOE = {"gate.weight": "router.weight", "gate.e_score_correction_bias": "router_bias",
                   "experts.up_proj": "up_proj", "experts.down_proj": "down_proj"}
_NEMOTRON_H_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_GRANITE_EXPERTS = {"input_linear.weight": "gate_up_proj", "output_linear.weight": "down_proj",
                    "router.layer.weight": "router.weight", "experts.gate_up_proj": "gate_up_proj",
                    "experts.down_proj": "down_proj"}
# (LFM3's names too: o_proj, q_norm / k_norm, and its head gate g_proj, saved as gate_proj)
_LFM2_ATTENTION = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "out_proj": "o_proj", "o_proj": "o_proj",
                   "q_norm": "q_norm", "k_norm": "k_norm", "g_proj": "g_proj", "gate_proj": "g_proj",
                   "q_layernorm": "q_norm", "k_layernorm": "k_norm"}
_LFM_NORMS = {"operator_norm": "norm", "ffn_norm": "mlp_norm", "post_operator_norm": "post_norm",
              "post_ffn_norm": "post_mlp_norm"}  # (LFM3's sandwich norms: the last two)
_LFM2_MLP = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_LFM2_MOE = {"gate.weight": "router.weight", "expert_bias": "router_bias", "experts.gate_up_proj": "gate_up_proj",
             "experts.down_proj": "down_proj"}
_QWEN3_5_DELTANET = {"in_proj_qkv": "in_proj", "in_proj_z": "z_proj", "in_proj_b": "b_proj", "in_proj_a": "a_proj"}
_OLMO_HYBRID_DELTANET = {"g_proj": "z_proj", "o_proj": "out_proj", "o_norm": "norm"}
_OLMO_HYBRID_MODULES = {"input_layernorm": "norm", "attention_layer_norm": "norm",
                        "post_attention_layernorm": "post_attention_layernorm",
                        "feedforward_layer_norm": "post_attention_layernorm",
                        "post_feedforward_layernorm": "mlp_norm", "self_attn": "mixer", "mlp": "mlp"}
_QWEN3_5_MOE = {"gate": "experts.router", "experts": "experts", "shared_expert": "shared",
                "shared_expert_gate": "shared_gate"}  # mlp.<name> -> ours (as held, or each expert as saved)
_QWEN3_5_MODULES = {"input_layernorm": "norm", "post_attention_layernorm": "mlp_norm", "linear_attn": "mixer",
                    "self_attn": "mixer", "mlp": "mlp"}
_OUR_KIND = {"linear_attention": "mamba2", "full_attention": "attention", "mlp": "mlp", "moe": "moe"}


def is_hybrid_config(d: dict) -> bool:
    """True for ours (`"family": "hybrid"`) and transformers' layouts read here (`MODEL_TYPES`)."""
    return isinstance(d, dict) and (d.get("family") == "hybrid" or d.get("model_type") in MODEL_TYPES)


def hybrid_config_from_json(d: dict) -> HybridConfig:
    """A `HybridConfig` from any of the config.json layouts (see the module docstring).

    Raises ValueError for a dict of no known layout, for MoE variants, and for settings that
    select something `HybridLM` does not implement, naming the key and its value.
    """
    if not isinstance(d, dict):
        raise ValueError(f"a hybrid config must be a dict, got {type(d).__name__}")
    if "family" in d:
        if d["family"] != "hybrid":
            raise ValueError(f"config names family {d['family']!r}; expected 'hybrid'")
        return HybridConfig.from_dict({k: v for k, v in d.items() if k != "family"})
    readers = {"bamba": _from_bamba, "granitemoehybrid": _from_granite, "nemotron_h": _from_nemotron_h,
               "falcon_h1": _from_falcon_h1, "lfm2": _from_lfm2, "lfm2_moe": _from_lfm2_moe, "lfm3": _from_lfm3,
               "jamba": _from_jamba, "zamba2": _from_zamba2,
               "qwen3_5": _from_qwen3_5, "qwen3_5_text": _from_qwen3_5, "qwen3_5_moe": _from_qwen3_5,
               "qwen3_5_moe_text": _from_qwen3_5, "qwen3_next": _from_qwen3_5, "olmo_hybrid": _from_olmo_hybrid,
               "kimi_linear": _from_kimi_linear, "bailing_hybrid": _from_bailing_hybrid}
    if d.get("model_type") in readers:
        return readers[d["model_type"]](d)
    if "model_type" in d:
        raise ValueError(f"transformers model_type={d['model_type']!r} is not a hybrid read here; expected one of "
                         f"{sorted(readers)}")
    raise ValueError(f"config keys {sorted(d)} match no hybrid layout; expected 'family': 'hybrid' or a "
                     f"transformers 'model_type' of {sorted(readers)}")


def _number(value, key: str) -> float:
    """A JSON number, inf included (bare `Infinity`, or transformers 5's `{"__float__": "Infinity"}`)."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        value = value["__float__"]
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{key} holds {value!r}; expected a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} holds {value!r}; expected a number")
    return float(value)


def _dt_limits(value, key: str) -> dict:
    """(min, max) Δ clamp -> dt_min_limit / dt_max_limit (inf -> None); None = no clamp."""
    if value is None:
        return dict(dt_min_limit=0.0, dt_max_limit=None)
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"{key}={value!r}; expected a pair [min, max]")
    lo, hi = _number(value[0], f"{key}[0]"), _number(value[1], f"{key}[1]")
    return dict(dt_min_limit=lo, dt_max_limit=None if hi == math.inf else hi)


def _require_value(d: dict, key: str, allowed: tuple, why: str = "") -> None:
    if d[key] not in allowed:
        raise ValueError(f"{key}={d[key]!r} is not supported{why}; expected one of {list(allowed)}")


def _rope(d: dict, model: str, default_factor: float | None, default_theta: float = 10000.0) -> dict:
    """rope_parameters (or an older config.json's rope_scaling and top-level rope_theta, which
    transformers 5 reads into it) -> rope_theta, partial_rotary_factor.

    default_factor None: the model's rotary init ignores partial_rotary_factor (whole head)."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_parameters={params!r}; expected a dict")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_parameters.rope_type={rope_type!r} ({model}) is not supported; expected 'default'")
    theta = _number(params.get("rope_theta", d.get("rope_theta", default_theta)), "rope_parameters.rope_theta")
    factor = 1.0 if default_factor is None else _number(params.get("partial_rotary_factor", default_factor),
                                                         "rope_parameters.partial_rotary_factor")
    return dict(rope_theta=theta, partial_rotary_factor=factor)


def _mamba_head_dim(d: dict, d_ssm: int | None = None) -> dict:
    """Bamba / Granite / Falcon-H1: the mixer `d_ssm` wide (Falcon-H1's mamba_d_ssm; None, or
    null in its config: mamba_expand * hidden_size), split into mamba_n_heads."""
    width = "mamba_expand * hidden_size" if d_ssm is None else "mamba_d_ssm"
    inner = d["mamba_expand"] * d["hidden_size"] if d_ssm is None else d_ssm
    head = inner // d["mamba_n_heads"] if d["mamba_d_head"] == "auto" else d["mamba_d_head"]
    if head * d["mamba_n_heads"] != inner:
        raise ValueError(f"mamba_n_heads * mamba_d_head = {d['mamba_n_heads']} * {head} must equal "
                         f"{width} = {inner}")
    return dict(
        mamba_nheads=d["mamba_n_heads"], headdim=head, ngroups=d["mamba_n_groups"], d_state=d["mamba_d_state"],
        d_conv=d["mamba_d_conv"], chunk_size=d["mamba_chunk_size"], conv_bias=d["mamba_conv_bias"],
        mamba_bias=d["mamba_proj_bias"], **_dt_limits(d["time_step_limit"], "time_step_limit"),
    )


def _attention_sizes(d: dict) -> dict:
    heads = d["num_attention_heads"]
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"num_attention_heads must be an integer >= 1, got {heads!r}")
    # Their attention reads getattr(config, "head_dim", hidden_size // heads): a head_dim key wins.
    return dict(n_heads=heads, n_kv_heads=d["num_key_value_heads"] or heads,
                head_dim=d.get("head_dim") or d["hidden_size"] // heads)


def _from_bamba(d: dict) -> HybridConfig:
    d = {**_BAMBA_DEFAULTS, **d}
    _require_value(d, "hidden_act", ("silu",), " (the MLP's gate and the Mamba-2 conv both use it)")
    n = d["num_hidden_layers"]
    attn = d["attn_layer_indices"] or []
    bad = [i for i in attn if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
    if bad:
        raise ValueError(f"attn_layer_indices holds {bad}; expected layer indices in 0 .. {n - 1}")
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"],
        layer_types=["attention" if i in attn else "mamba2" for i in range(n)],
        mlp_in_layer=True, d_ff=d["intermediate_size"], mlp_act="silu_gated", mlp_bias=d["mlp_bias"],
        **_attention_sizes(d), rope=True, **_rope(d, "bamba", default_factor=0.5),
        attention_bias=d["attention_bias"], **_mamba_head_dim(d),
        rms_norm_eps=d["rms_norm_eps"], tie_embeddings=d["tie_word_embeddings"], pad_vocab_size_multiple=1,
    )


def _from_granite(d: dict) -> HybridConfig:
    d = {**_GRANITE_DEFAULTS, **d}
    experts = d["num_local_experts"]
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
        raise ValueError(f"num_local_experts={experts!r}; expected an integer >= 0 (0: the shared MLP only)")
    _require_value(d, "hidden_act", ("silu",), " (the MLP's gate and the Mamba-2 conv both use it)")
    _require_value(d, "position_embedding_type", (None, "rope"))
    n = d["num_hidden_layers"]
    types = d["layer_types"] or ["linear_attention"] * n
    types = [_LEGACY_LAYER_TYPES.get(t, t) for t in types]
    bad = [t for t in types if t not in ("linear_attention", "full_attention")]
    if bad or len(types) != n:
        raise ValueError(f"layer_types={d['layer_types']!r}; expected num_hidden_layers={n} entries, each "
                         "'linear_attention' / 'full_attention' (or legacy 'mamba' / 'attention')")
    rope = d["position_embedding_type"] == "rope"
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=[_OUR_KIND[t] for t in types],
        mlp_in_layer=True, d_ff=d["shared_intermediate_size"], mlp_act="silu_gated", mlp_bias=False,
        **(dict(n_experts=experts, experts_per_token=d["num_experts_per_tok"], d_ff_expert=d["intermediate_size"])
           if experts else {}),
        **_attention_sizes(d), rope=rope, **(_rope(d, "granitemoehybrid", default_factor=None) if rope else {}),
        attention_bias=d["attention_bias"], attention_multiplier=_number(d["attention_multiplier"],
                                                                         "attention_multiplier"),
        embedding_multiplier=_number(d["embedding_multiplier"], "embedding_multiplier"),
        residual_multiplier=_number(d["residual_multiplier"], "residual_multiplier"),
        logits_scaling=_number(d["logits_scaling"], "logits_scaling"),
        **_mamba_head_dim(d), rms_norm_eps=d["rms_norm_eps"], tie_embeddings=d["tie_word_embeddings"],
        pad_vocab_size_multiple=1,
    )


def _nemotron_h_layer_types(d: dict) -> list[str]:
    if d.get("layers_block_type") is not None:
        key, value = "layers_block_type", d["layers_block_type"]
        if not isinstance(value, list):
            raise ValueError(f"layers_block_type={value!r}; expected a list of layer types")
        types = [_LEGACY_LAYER_TYPES.get(t, t) for t in value]
    elif d.get("hybrid_override_pattern") is not None:
        key, value = "hybrid_override_pattern", d["hybrid_override_pattern"]
        if not isinstance(value, str) or set(value) - set(_NEMOTRON_H_PATTERN):
            raise ValueError(f"hybrid_override_pattern={value!r}; expected a string of {sorted(_NEMOTRON_H_PATTERN)}")
        types = [_NEMOTRON_H_PATTERN[c] for c in value]
    else:
        raise ValueError("nemotron_h config has neither 'layers_block_type' nor 'hybrid_override_pattern'")
    bad = [t for t in types if t not in _OUR_KIND]
    if bad or not types:
        raise ValueError(f"{key}={value!r}; expected a non-empty list of 'linear_attention', 'full_attention', "
                         "'mlp', 'moe'")
    return [_OUR_KIND[t] for t in types]


def _nemotron_h_experts(d: dict, types: list[str]) -> dict:
    """The experts' fields of a config with "moe" layers ({} without)."""
    if "moe" not in types:
        return {}
    if d["moe_latent_size"] is not None:
        raise ValueError(f"moe_latent_size={d['moe_latent_size']!r}: experts behind a latent projection are not "
                         "supported; expected null")
    return dict(n_experts=d["n_routed_experts"], experts_per_token=d["num_experts_per_tok"],
                d_ff_expert=d["moe_intermediate_size"], d_ff_shared_expert=d["moe_shared_expert_intermediate_size"],
                expert_routing="sigmoid", n_expert_groups=d["n_group"], expert_groups_per_token=d["topk_group"],
                normalize_expert_weights=d["norm_topk_prob"],
                routed_scaling_factor=_number(d["routed_scaling_factor"], "routed_scaling_factor"))


def _from_nemotron_h(d: dict) -> HybridConfig:
    d = {**_NEMOTRON_H_DEFAULTS, **d}
    for old, new in _NEMOTRON_H_ALIASES.items():
        if old in d:
            d[new] = d[old]
    _require_value(d, "mlp_hidden_act", ("relu2",))
    _require_value(d, "mamba_hidden_act", ("silu",))
    types = _nemotron_h_layer_types(d)
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=types, **_nemotron_h_experts(d, types),
        mlp_in_layer=False, d_ff=d["intermediate_size"], mlp_act="relu2", mlp_bias=d["mlp_bias"],
        **_attention_sizes(d), rope=False, attention_bias=False,
        mamba_nheads=d["mamba_num_heads"], headdim=d["mamba_head_dim"], ngroups=d["n_groups"],
        d_state=d["ssm_state_size"], d_conv=d["conv_kernel"], chunk_size=d["chunk_size"],
        mamba_bias=d["use_bias"], conv_bias=d["use_conv_bias"],
        dt_min_limit=_number(d["time_step_min"], "time_step_min"), dt_max_limit=None,
        # NemotronHForCausalLM ties nothing (`_tied_weights_keys = {}`), whatever tie_word_embeddings says.
        rms_norm_eps=d["layer_norm_epsilon"], tie_embeddings=False, pad_vocab_size_multiple=1,
    )


def _numbers(value, key: str, n: int) -> list[float]:
    if not isinstance(value, list | tuple) or len(value) != n:
        raise ValueError(f"{key}={value!r}; expected a list of {n} numbers")
    return [_number(v, f"{key}[{j}]") for j, v in enumerate(value)]


def _falcon_h1_mamba(d: dict) -> dict:
    """Falcon-H1's mixer: Bamba's fields, mamba_d_ssm wide, and its output gate."""
    if d["mamba_proj_bias"] != d["projectors_bias"]:
        raise ValueError(f"mamba_proj_bias={d['mamba_proj_bias']!r} (in_proj) with projectors_bias="
                         f"{d['projectors_bias']!r} (out_proj) is not supported; expected both the same")
    return dict(**_mamba_head_dim(d, d["mamba_d_ssm"]), mamba_gated_norm=d["mamba_rms_norm"],
                mamba_norm_before_gate=d["mamba_norm_before_gate"])


def _from_falcon_h1(d: dict) -> HybridConfig:
    d = {**_FALCON_H1_DEFAULTS, **d}
    _require_value(d, "hidden_act", ("silu",), " (the MLP's gate and the Mamba-2 conv both use it)")
    lm_head = _number(d["lm_head_multiplier"], "lm_head_multiplier")
    if not lm_head > 0:
        raise ValueError(f"lm_head_multiplier={lm_head!r} is not supported; expected a number > 0")
    multipliers = {k: _number(d[k], k) for k in ("key_multiplier", "attention_in_multiplier",
                                                 "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")}
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=["parallel"] * d["num_hidden_layers"],
        mlp_in_layer=True, d_ff=d["intermediate_size"], mlp_act="silu_gated", mlp_bias=d["mlp_bias"],
        **_attention_sizes(d), rope=True, **_rope(d, "falcon_h1", default_factor=None),
        attention_bias=d["attention_bias"], **_falcon_h1_mamba(d),
        embedding_multiplier=_number(d["embedding_multiplier"], "embedding_multiplier"), logits_scaling=1 / lm_head,
        **multipliers, ssm_multipliers=_numbers(d["ssm_multipliers"] or [1.0] * 5, "ssm_multipliers", 5),
        mlp_multipliers=_numbers(d["mlp_multipliers"] or [1.0, 1.0], "mlp_multipliers", 2),
        rms_norm_eps=d["rms_norm_eps"], tie_embeddings=d["tie_word_embeddings"], pad_vocab_size_multiple=1,
    )


def _lfm2_layer_types(d: dict) -> list[str]:
    n = d["num_hidden_layers"]
    if d["layer_types"] is None:
        attn = list(range(n)) if d["full_attn_idxs"] is None else d["full_attn_idxs"]
        if not isinstance(attn, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n
                                             for i in attn):
            raise ValueError(f"full_attn_idxs={attn!r}; expected a list of layer indices in 0 .. {n - 1}")
        return ["attention" if i in attn else "conv" for i in range(n)]
    types = d["layer_types"]
    if not isinstance(types, list) or len(types) != n or set(types) - {"conv", "full_attention"}:
        raise ValueError(f"layer_types={types!r}; expected num_hidden_layers={n} entries, each 'conv' or "
                         "'full_attention'")
    return ["conv" if t == "conv" else "attention" for t in types]


def _lfm2_ff_width(d: dict) -> int:
    """The MLP's width as transformers' Lfm2MLP computes it from intermediate_size."""
    width = d["intermediate_size"]
    if d["block_auto_adjust_ff_dim"]:
        width = int(2 * width / 3)
        if d["block_ffn_dim_multiplier"] is not None:
            width = int(_number(d["block_ffn_dim_multiplier"], "block_ffn_dim_multiplier") * width)
            multiple = d["block_multiple_of"]
            if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
                raise ValueError(f"block_multiple_of={multiple!r}; expected a positive integer")
            width = multiple * ((width + multiple - 1) // multiple)
    return width


def _lfm2_fields(d: dict, model: str) -> dict:
    """What LFM2 and LFM2-MoE share: their layers, attention (per-head q/k norms, RoPE θ 1e6 by
    default), short convs, one norm eps and the gated MLP's kind."""
    return dict(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=_lfm2_layer_types(d),
        mlp_in_layer=True, mlp_act="silu_gated", mlp_bias=False,
        **_attention_sizes(d), rope=True, **_rope(d, model, default_factor=None, default_theta=1e6),
        attention_bias=False, qk_norm=True, short_conv_kernel=d["conv_L_cache"], short_conv_bias=d["conv_bias"],
        rms_norm_eps=d["norm_eps"], tie_embeddings=d["tie_word_embeddings"], pad_vocab_size_multiple=1,
    )


def _from_lfm2(d: dict) -> HybridConfig:
    d = {**_LFM2_DEFAULTS, **d}
    for old, new in _LFM2_ALIASES.items():
        if old in d:
            d[new] = d[old]
    return HybridConfig(**_lfm2_fields(d, "lfm2"), d_ff=_lfm2_ff_width(d))


def _from_lfm2_moe(d: dict) -> HybridConfig:
    d = {**_LFM2_MOE_DEFAULTS, **d}
    if "tie_embedding" in d:  # (Lfm2MoeConfig reads no block_ff_dim)
        d["tie_word_embeddings"] = d["tie_embedding"]
    if d["layer_types"] is None:  # Lfm2MoeConfig derives none (its layers would not build)
        raise ValueError("lfm2_moe config has no 'layer_types'; expected a list of 'conv' / 'full_attention'")
    dense = d["num_dense_layers"]
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense <= d["num_hidden_layers"]:
        raise ValueError(f"num_dense_layers={dense!r}; expected a layer count in 0 .. {d['num_hidden_layers']}")
    return HybridConfig(
        **_lfm2_fields(d, "lfm2_moe"), d_ff=d["intermediate_size"],
        n_experts=d["num_experts"], experts_per_token=d["num_experts_per_tok"], d_ff_expert=d["moe_intermediate_size"],
        expert_routing="sigmoid", normalize_expert_weights=d["norm_topk_prob"],
        routed_scaling_factor=_number(d["routed_scaling_factor"], "routed_scaling_factor"),
        expert_weights_eps=1e-6, expert_layers=list(range(dense, d["num_hidden_layers"])),
    )


def _lfm3_layer_types(d: dict) -> list[str]:
    n, types = d["num_hidden_layers"], d["layer_types"]
    if types is None:  # as Lfm3Config derives them
        types = ["full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv"
                 for i in range(n)]
    if not isinstance(types, list) or len(types) != n or set(types) - {"conv", "sliding_attention", "full_attention"}:
        raise ValueError(f"layer_types={types!r}; expected num_hidden_layers={n} entries, each 'conv', "
                         "'sliding_attention' or 'full_attention'")
    return types


def _lfm3_rope(d: dict, types: list[str]) -> dict:
    """LFM3's RoPE per attention kind: `rope_parameters` {kind: {rope_type, rope_theta, …}} ->
    ours (the full-attention layers' as the model's rope, the sliding layers' theta apart)."""
    params = _LFM3_ROPE if d["rope_parameters"] is None else d["rope_parameters"]
    out = {}
    for kind in ("full_attention", "sliding_attention"):
        if kind not in types:
            continue
        p = params.get(kind) if isinstance(params, dict) else None
        if not isinstance(p, dict):
            raise ValueError(f"rope_parameters[{kind!r}]={p!r}; expected a dict (lfm3 gives each attention kind its own)")
        allowed = ("default", "proportional") if kind == "full_attention" else ("default",)
        rope_type = p.get("rope_type", "default")
        if rope_type not in allowed:
            raise ValueError(f"rope_parameters[{kind!r}].rope_type={rope_type!r} is not supported; expected one of "
                             f"{list(allowed)}")
        if _number(p.get("factor", 1.0), f"rope_parameters[{kind!r}].factor") != 1.0:
            raise ValueError(f"rope_parameters[{kind!r}].factor={p['factor']!r} is not supported; expected 1")
        theta = _number(p.get("rope_theta", 10000.0), f"rope_parameters[{kind!r}].rope_theta")
        if kind == "sliding_attention":
            out["sliding_rope_theta"] = theta
        else:
            proportional = rope_type == "proportional"
            out.update(rope_theta=theta, rope_proportional=proportional, partial_rotary_factor=_number(
                p.get("partial_rotary_factor", 1.0), f"rope_parameters[{kind!r}].partial_rotary_factor")
                if proportional else 1.0)
    return out


def _from_lfm3(d: dict) -> HybridConfig:
    d = {**_LFM3_DEFAULTS, **d}
    for key in ("use_sandwich_norm", "use_attention_gate", "conv_bias", "attention_bias"):
        _require_value(d, key, (True, False))
    types = _lfm3_layer_types(d)
    window = d["sliding_window"]
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window={window!r}; expected a positive integer (layers {sliding} slide)")
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=["conv" if t == "conv" else "attention"
                                                                           for t in types],
        mlp_in_layer=True, mlp_act="silu_gated", mlp_bias=False, d_ff=d["intermediate_size"],
        **_attention_sizes(d), rope=True, **_lfm3_rope(d, types), sliding_window_layers=sliding,
        **({"sliding_window": window} if sliding else {}), attention_bias=d["attention_bias"], qk_norm=True,
        attention_head_gate=d["use_attention_gate"], sandwich_norm=d["use_sandwich_norm"],
        short_conv_kernel=d["conv_L_cache"], short_conv_bias=d["conv_bias"], rms_norm_eps=d["norm_eps"],
        tie_embeddings=d["tie_word_embeddings"], pad_vocab_size_multiple=1,
    )


def _zamba2_layer_types(d: dict) -> list[str]:
    n, types = d["num_hidden_layers"], d.get("layer_types") or d["layers_block_type"]
    if types is None:  # as Zamba2Config derives them (its docstring's 54 layers)
        types = ["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3 + ["hybrid"] \
            + ["mamba"] * 2
    if not isinstance(types, list) or len(types) != n or set(types) - {"mamba", "linear_attention", "hybrid"}:
        raise ValueError(f"layers_block_type={types!r}; expected num_hidden_layers={n} entries, each 'mamba' "
                         "('linear_attention') or 'hybrid'")
    return ["zamba" if t == "hybrid" else "mamba2" for t in types]


def _from_zamba2(d: dict) -> HybridConfig:
    d = {**_ZAMBA2_DEFAULTS, **d}
    _require_value(d, "hidden_act", ("gelu", "silu"), " (the shared block's gated MLP)")
    _require_value(d, "rms_norm_eps", (1e-5,), " (its Mamba-2 mixers' gated norms have 1e-5, the others this: "
                   "ours have one)")
    for key in ("use_shared_attention_adapter", "use_mem_rope", "add_bias_linear"):
        _require_value(d, key, (True, False))
    if d["use_mem_rope"] and d["use_long_context"]:
        raise ValueError("use_long_context=True (a rescaled RoPE) is not supported; expected false")
    width, heads = d["hidden_size"], d["n_mamba_heads"]
    inner = int(d["mamba_expand"] * width)
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or inner % heads:
        raise ValueError(f"n_mamba_heads={heads!r} must divide mamba_expand * hidden_size = {inner}")
    sizes = _attention_sizes({**d, "head_dim": None})
    sizes["head_dim"] = 2 * width // sizes["n_heads"]  # heads over cat(x, embedding): 2 * hidden_size wide
    return HybridConfig(
        d_model=width, vocab_size=d["vocab_size"], layer_types=_zamba2_layer_types(d), mlp_in_layer=False,
        mlp_act=f"{d['hidden_act']}_gated", mlp_bias=d["add_bias_linear"], d_ff=d["intermediate_size"] or 4 * width,
        **sizes, attention_multiplier=(sizes["head_dim"] / 2) ** -0.5, rope=d["use_mem_rope"],
        **(_rope(d, "zamba2", default_factor=None) if d["use_mem_rope"] else {}),
        mamba_nheads=heads, headdim=inner // heads, ngroups=d["mamba_ngroups"], d_state=d["mamba_d_state"],
        d_conv=d["mamba_d_conv"], chunk_size=d["chunk_size"], mamba_bias=d["add_bias_linear"], conv_bias=True,
        dt_min_limit=_number(d["time_step_min"], "time_step_min"), dt_max_limit=None,
        shared_blocks=d["num_mem_blocks"], shared_adapter_rank=d["adapter_rank"],
        shared_attention_adapters=d["use_shared_attention_adapter"], rms_norm_eps=d["rms_norm_eps"],
        tie_embeddings=d["tie_word_embeddings"], pad_vocab_size_multiple=1,
    )


def _kimi_linear_types(d: dict) -> tuple[list[str], list[str]]:
    """Each layer's mixer ("full_attention" / "linear_attention") and feed-forward ("dense" /
    "sparse") as KimiLinearConfig derives them: its `layer_types`, else `linear_attn_config`'s
    1-indexed `full_attn_layers` and `kda_layers` (the published checkpoints'), else attention
    where i % 4 == 0 past 0; its `mlp_layer_types`, else dense below `first_k_dense_replace` (1)."""
    n, linear = d["num_hidden_layers"], d.get("linear_attn_config") or {}
    types = d["layer_types"]
    if types is None and "full_attn_layers" in linear and "kda_layers" in linear:
        types = [None] * n
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for layer in linear[key]:
                if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= n:
                    raise ValueError(f"linear_attn_config.{key} holds {layer!r}; expected layer numbers 1 .. {n}")
                types[layer - 1] = kind
    elif types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or set(types) - {"linear_attention", "full_attention"}:
        raise ValueError(f"layer_types={types!r}; expected num_hidden_layers={n} entries, each 'linear_attention' "
                         "or 'full_attention'")
    mlp = d["mlp_layer_types"]
    if mlp is None:
        first = d.get("first_k_dense_replace", 1)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"first_k_dense_replace={first!r}; expected an int >= 0")
        mlp = ["dense" if i < first else "sparse" for i in range(n)]
    if not isinstance(mlp, list) or len(mlp) != n or set(mlp) - {"dense", "sparse"}:
        raise ValueError(f"mlp_layer_types={mlp!r}; expected num_hidden_layers={n} entries, each 'dense' or 'sparse'")
    return ["mla" if t == "full_attention" else "kda" for t in types], mlp


def _kimi_linear_experts(d: dict, mlp: list[str]) -> dict:
    """The "sparse" layers' experts instead of the MLP: `num_experts` of `moe_intermediate_size`,
    `num_experts_per_token` a token by a sigmoid router choosing with `e_score_correction_bias`
    within the best `topk_group` of `num_expert_group` groups, weights renormalised
    (`moe_renormalize`) and times `routed_scaling_factor`; beside them `num_shared_experts` shared
    MLPs (one of their total width), added as they are."""
    layers = [i for i, t in enumerate(mlp) if t == "sparse"]
    if not layers:
        return {}
    shared = d["num_shared_experts"]
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise ValueError(f"num_shared_experts={shared!r}; expected an int >= 0")
    return dict(n_experts=d["num_experts"], experts_per_token=d["num_experts_per_token"],
                d_ff_expert=d["moe_intermediate_size"], expert_routing="sigmoid",
                n_expert_groups=d["num_expert_group"], expert_groups_per_token=d["topk_group"],
                normalize_expert_weights=d["moe_renormalize"], expert_weights_eps=1e-20,
                routed_scaling_factor=_number(d["routed_scaling_factor"], "routed_scaling_factor"),
                expert_layers=layers, plain_shared_expert=shared > 0,
                d_ff_shared_expert=max(1, d["moe_intermediate_size"] * shared))


def _from_kimi_linear(d: dict) -> HybridConfig:
    return HybridConfig(**_kimi_linear_fields(d))


def _kimi_linear_fields(d: dict) -> dict:
    """Kimi-Linear's config.json (any of its spellings) -> `HybridConfig`'s fields."""
    d = dict(d)
    for alias, name in _KIMI_LINEAR_ALIASES.items():
        if alias in d and name not in d:
            d[name] = d[alias]
    linear = d.get("linear_attn_config") or {}
    if not isinstance(linear, dict):
        raise ValueError(f"linear_attn_config={linear!r}; expected a dict")
    for theirs, ours in (("head_dim", "linear_head_dim"), ("num_heads", "linear_num_heads"),
                         ("short_conv_kernel_size", "linear_conv_kernel_dim")):
        if theirs in linear:
            d[ours] = linear[theirs]
    d = {**_KIMI_LINEAR_DEFAULTS, **d}
    _require_value(d, "hidden_act", ("silu",), " (the MLPs, the experts and the KDA's conv use it)")
    if "moe_router_activation_func" in d:
        _require_value(d, "moe_router_activation_func", ("sigmoid",))
    if "mla_use_nope" in d:  # (False: a rotated MLA, which transformers' Kimi-Linear does not run either)
        _require_value(d, "mla_use_nope", (True,))
    types, mlp = _kimi_linear_types(d)
    heads = d["num_attention_heads"]
    return dict(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=types, mlp_in_layer=True,
        mlp_act="silu_gated", mlp_bias=False, d_ff=d["intermediate_size"], **_kimi_linear_experts(d, mlp),
        n_heads=heads, n_kv_heads=heads, head_dim=d["qk_nope_head_dim"] + d["qk_rope_head_dim"], rope=False,
        attention_bias=d["attention_bias"], mla_kv_rank=d["kv_lora_rank"], mla_q_rank=d["q_lora_rank"],
        mla_nope_dim=d["qk_nope_head_dim"], mla_rope_dim=d["qk_rope_head_dim"], mla_v_dim=d["v_head_dim"],
        d_conv=d["linear_conv_kernel_dim"], delta_k_heads=d["linear_num_heads"], delta_v_heads=d["linear_num_heads"],
        delta_k_dim=d["linear_head_dim"], delta_v_dim=d["linear_head_dim"], rms_norm_eps=d["rms_norm_eps"],
        tie_embeddings=d["tie_word_embeddings"], pad_vocab_size_multiple=1,
    )


def _from_bailing_hybrid(d: dict) -> HybridConfig:
    """Ling 3 (`BailingHybridConfig`): Kimi-Linear's layers with one projection for each KDA
    gate, a bounded decay (`kda_safe_gate`), and latent attention with RoPE (DeepSeek's
    interleaved pairs on its `qk_rope_head_dim` dims) and a gate per head; attention every
    `layer_group_size`-th layer; the experts' and shared experts' SwiGLU clipped after the
    activation where a layer's limit is not 0 (`*_swiglu_limit_list`, one a decoder layer: transformers'
    `limit_after_act`; a dense layer's MLP is never clipped)."""
    d = dict(d)
    for alias, name in _BAILING_HYBRID_ALIASES.items():
        if alias in d and name not in d:
            d[name] = d[alias]
    d = {**_BAILING_HYBRID_DEFAULTS, **d}
    _require_value(d, "hidden_act", ("silu",), " (the MLPs, the experts and the KDA's conv use it)")
    _require_value(d, "kda_safe_gate", (True, False))
    n, every = d["num_hidden_layers"], d["layer_group_size"]
    limits = {}
    for key, name in (("expert_swiglu_limit_list", "expert_swiglu_limits"),
                      ("share_expert_swiglu_limit_list", "shared_swiglu_limits")):
        if d.get(key) is not None:
            limits[name] = _numbers(d[key], key, n)
            if not all(0 <= v < math.inf for v in limits[name]):
                raise ValueError(f"{key}={d[key]!r}; expected finite limits >= 0 (0: the layer is not clipped)")
    if d["layer_types"] is None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"layer_group_size={every!r}; expected a positive integer")
        d["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    d["linear_head_dim"] = d.get("linear_head_dim") or d["head_dim"]  # (its config's head_dim, as published)
    d["linear_num_heads"] = d.get("linear_num_heads") or d["num_attention_heads"]
    d["linear_conv_kernel_dim"] = d.get("linear_conv_kernel_dim") or d["short_conv_kernel_size"]
    bound = _number(d["kda_lower_bound"], "kda_lower_bound") if d["kda_safe_gate"] else None
    return HybridConfig(**{**_kimi_linear_fields(d), "rope": True, **_rope(d, "bailing_hybrid", default_factor=None),
                           "head_dim": d["qk_rope_head_dim"], "attention_head_gate": True,
                           "kda_low_rank_gates": False, "kda_gate_lower_bound": bound, **limits})


def _from_jamba(d: dict) -> HybridConfig:
    d = {**_JAMBA_DEFAULTS, **d}
    _require_value(d, "hidden_act", ("silu",), " (the MLP's gate and the Mamba conv both use it)")
    n, period, offset = d["num_hidden_layers"], d["attn_layer_period"], d["attn_layer_offset"]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (period, offset)) or not 0 <= offset < period:
        raise ValueError(f"attn_layer_period={period!r}, attn_layer_offset={offset!r}; expected integers with "
                         "0 <= offset < period")
    experts, e_period, e_offset = d["num_experts"], d["expert_layer_period"], d["expert_layer_offset"]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (experts, e_period, e_offset)) or experts < 1 \
            or not 0 <= e_offset < e_period:
        raise ValueError(f"num_experts={experts!r}, expert_layer_period={e_period!r}, expert_layer_offset="
                         f"{e_offset!r}; expected integers, num_experts >= 1, 0 <= offset < period")
    expert_layers = [i for i in range(n) if i % e_period == e_offset] if experts > 1 else []
    moe = dict(n_experts=experts, experts_per_token=d["num_experts_per_tok"], d_ff_expert=d["intermediate_size"],
               expert_routing="softmax", normalize_expert_weights=False, expert_layers=expert_layers) \
        if expert_layers else {}
    rank = d["mamba_dt_rank"]
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"],
        layer_types=["attention" if i % period == offset else "mamba" for i in range(n)],
        mlp_in_layer=True, d_ff=d["intermediate_size"], mlp_act="silu_gated", mlp_bias=False, **moe,
        **_attention_sizes(d), rope=False, attention_bias=False,
        mamba1_expand=d["mamba_expand"], mamba1_dt_rank=math.ceil(d["hidden_size"] / 16) if rank == "auto" else rank,
        mamba1_dt_norm=True, d_state=d["mamba_d_state"], d_conv=d["mamba_d_conv"], conv_bias=d["mamba_conv_bias"],
        mamba_bias=d["mamba_proj_bias"], rms_norm_eps=d["rms_norm_eps"], tie_embeddings=d["tie_word_embeddings"],
        pad_vocab_size_multiple=1,
    )


def _qwen3_5_text(d: dict) -> dict:
    """Qwen3.5's text model config: `Qwen3_5TextConfig` itself, or the `text_config` of the
    image-text `Qwen3_5Config` its checkpoints ship (whose vision tower is not read: text in, text
    out), tied as transformers ties it: by the top-level `tie_word_embeddings`."""
    if d["model_type"].endswith("_text") or d["model_type"] == "qwen3_next":  # (Qwen3-Next: text only)
        return d
    text = d.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{d['model_type']} config's text_config={text!r}; expected a dict (the text config's keys)")
    return {**text, "model_type": d["model_type"] + "_text", "tie_word_embeddings": d.get("tie_word_embeddings", False)}


def _qwen3_5_layer_types(d: dict) -> list[str]:
    n, types = d["num_hidden_layers"], d["layer_types"]
    if types is None:  # as Qwen3_5TextConfig derives them: every full_attention_interval-th layer attends
        every = d["full_attention_interval"]
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"full_attention_interval={every!r}; expected a positive integer")
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or set(types) - {"linear_attention", "full_attention"}:
        raise ValueError(f"layer_types={types!r}; expected num_hidden_layers={n} entries, each 'linear_attention' "
                         "or 'full_attention'")
    return ["deltanet" if t == "linear_attention" else "attention" for t in types]


def _qwen3_5_experts(d: dict, n: int) -> dict:
    """Qwen3.5-MoE: in every layer, instead of the MLP, `num_experts` experts of
    `moe_intermediate_size`, `num_experts_per_tok` a token by the softmax over the router's top
    k (the top k of the softmax over all, renormalised), and a shared expert MLP of
    `shared_expert_intermediate_size` gated by sigmoid(shared_expert_gate(h))."""
    if d["model_type"] == "qwen3_next":  # experts where transformers' Qwen3NextDecoderLayer puts them
        only = d["mlp_only_layers"]
        if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
            raise ValueError(f"mlp_only_layers={only!r}; expected a list of layer indices")
        step = d["decoder_sparse_step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"decoder_sparse_step={step!r}; expected a positive integer")
        layers = [i for i in range(n) if i not in only and d["num_experts"] > 0 and (i + 1) % step == 0]
        normalize = d["norm_topk_prob"]
    elif d["model_type"].startswith("qwen3_5_moe"):
        layers, normalize = list(range(n)), True
    else:
        layers = []
    dense = dict(d_ff=d["intermediate_size"]) if len(layers) < n else {}
    if not layers:
        return dense
    return dict(dense, n_experts=d["num_experts"], experts_per_token=d["num_experts_per_tok"],
                d_ff_expert=d["moe_intermediate_size"], expert_routing="softmax", normalize_expert_weights=normalize,
                expert_layers=layers, gated_shared_expert=True, d_ff_shared_expert=d["shared_expert_intermediate_size"])


def _from_qwen3_5(d: dict) -> HybridConfig:
    d = _qwen3_5_text(d)
    d = {**{"qwen3_5_moe_text": _QWEN3_5_MOE_DEFAULTS, "qwen3_next": _QWEN3_NEXT_DEFAULTS}.get(
        d["model_type"], _QWEN3_5_DEFAULTS), **d}
    _require_value(d, "hidden_act", ("silu",), " (the MLP's gate and the Gated DeltaNet's conv both use it)")
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=_qwen3_5_layer_types(d),
        mlp_in_layer=True, mlp_act="silu_gated", mlp_bias=False, **_qwen3_5_experts(d, d["num_hidden_layers"]),
        **_attention_sizes(d), rope=True, **_rope(d, "qwen3_5", default_factor=0.25),
        attention_bias=d["attention_bias"], qk_norm=True, attention_output_gate=True,
        d_conv=d["linear_conv_kernel_dim"], delta_k_heads=d["linear_num_key_heads"],
        delta_v_heads=d["linear_num_value_heads"], delta_k_dim=d["linear_key_head_dim"],
        delta_v_dim=d["linear_value_head_dim"], rms_norm_eps=d["rms_norm_eps"],
        tie_embeddings=d["tie_word_embeddings"], pad_vocab_size_multiple=1,
    )


def _olmo_hybrid_sizes(d: dict) -> dict:
    """OlmoHybridConfig's derived sizes where the config leaves them out (as its __post_init__):
    the DeltaNet's heads default to num_attention_heads, a key head to 0.75 hidden_size / heads,
    a value head to twice that; every 4th layer attends (the last, if none does)."""
    n, d = d["num_hidden_layers"], dict(d)
    if d["layer_types"] is None:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
        d["layer_types"] = types if "full_attention" in types else types[:-1] + ["full_attention"]
    d["linear_num_key_heads"] = d["linear_num_key_heads"] or d["num_attention_heads"]
    d["linear_num_value_heads"] = d["linear_num_value_heads"] or d["num_attention_heads"]
    d["linear_key_head_dim"] = d["linear_key_head_dim"] or int(0.75 * d["hidden_size"] / d["linear_num_key_heads"])
    d["linear_value_head_dim"] = d["linear_value_head_dim"] or 2 * d["linear_key_head_dim"]
    return d


def _from_olmo_hybrid(d: dict) -> HybridConfig:
    d = _olmo_hybrid_sizes({**_OLMO_HYBRID_DEFAULTS, **d})
    _require_value(d, "hidden_act", ("silu",), " (the MLP's gate and the Gated DeltaNet's conv both use it)")
    _require_value(d, "linear_allow_neg_eigval", (True, False))
    # Their model builds no rotary embedding where rope_parameters holds rope_theta null (the
    # released checkpoints); a config without rope_parameters gets RoPE at theta 10000.
    params = d["rope_parameters"]
    rope = not (isinstance(params, dict) and "rope_theta" in params and params["rope_theta"] is None)
    return HybridConfig(
        d_model=d["hidden_size"], vocab_size=d["vocab_size"], layer_types=_qwen3_5_layer_types(d),
        mlp_in_layer=True, mlp_act="silu_gated", mlp_bias=False, d_ff=d["intermediate_size"],
        **_attention_sizes(d), rope=rope, **(_rope(d, "olmo_hybrid", default_factor=None) if rope else {}),
        attention_bias=d["attention_bias"], qk_norm=True, qk_norm_across_heads=True, attention_post_norm=True,
        d_conv=d["linear_conv_kernel_dim"], delta_k_heads=d["linear_num_key_heads"],
        delta_v_heads=d["linear_num_value_heads"], delta_k_dim=d["linear_key_head_dim"],
        delta_v_dim=d["linear_value_head_dim"], delta_negative_eigenvalues=d["linear_allow_neg_eigval"],
        delta_norm_eps=1e-5, rms_norm_eps=d["rms_norm_eps"], tie_embeddings=d["tie_word_embeddings"],
        pad_vocab_size_multiple=1,
    )


# ---- state dicts ----

# layouts told by a part of a key that they alone have, tried in this order
_KEY_MARKS = (("olmo_hybrid", (".linear_attn.g_proj.", ".post_feedforward_layernorm.")),
              ("zamba2", (".shared_transformer.", ".mamba_decoder.")),
              ("bailing_hybrid", ("model.word_embeddings.", ".self_attn.forget_gate.f_proj.")),  # (Ling 3)
              ("kimi_linear", (".self_attn.kv_a_proj_with_mqa.", ".self_attn.f_a_proj.", ".self_attn.forget_gate.")))


def _layout_of(state: dict[str, Tensor]) -> str:
    if "embed_tokens.weight" in state:
        return "ours"
    for layout, marks in _KEY_MARKS:
        if any(mark in key for key in state for mark in marks):
            return layout
    if "model.embedding_norm.weight" in state:
        return "lfm2"  # (and lfm2_moe and lfm3: LFM2's names, and their experts' or norms')
    if "model.language_model.embed_tokens.weight" in state or any(
            ".linear_attn." in k or k.endswith(".self_attn.q_norm.weight") for k in state):
        return "qwen3_5"  # (the image-text checkpoint's text model, or the text model's own)
    if "model.embed_tokens.weight" in state:
        if any(".shared_mlp." in k for k in state):
            return "granitemoehybrid"
        return "bamba"
    if "backbone.embeddings.weight" in state or "model.embeddings.weight" in state:
        return "nemotron_h"
    raise ValueError("state dict has none of 'embed_tokens.weight' (ours), 'model.embed_tokens.weight' (bamba, "
                     "granitemoehybrid, falcon_h1, lfm2), 'backbone.embeddings.weight' / 'model.embeddings.weight' "
                     "(nemotron_h)")


def _nemotron_h_moe_key(key: str) -> str:
    """`layers.{i}.mixer.<MoE part>` -> ours (`shared_experts` -> the layer's `shared`); others as they are."""
    parts = key.split(".", 3)  # layers, i, mixer, rest
    if len(parts) != 4 or parts[2] != "mixer":
        return key
    stem, rest = f"layers.{parts[1]}", parts[3]
    if rest in _NEMOTRON_H_MOE:
        return f"{stem}.mixer.{_NEMOTRON_H_MOE[rest]}"
    if rest.startswith("shared_experts."):
        return f"{stem}.shared.{rest.removeprefix('shared_experts.')}"
    return key


def _stack_experts(out: dict[str, Tensor], config: HybridConfig) -> None:
    """`layers.{i}.mixer.experts.{j}.{up_proj,down_proj}.weight` (one expert each, as Nemotron-H
    saves them) -> `layers.{i}.mixer.{up_proj,down_proj}` (E, ., .), in place; ValueError
    naming the first expert missing."""
    if not config.n_experts:  # experts keys are left for the unknown-key check
        return
    pieces: dict[tuple[str, str], dict[int, Tensor]] = {}
    for key in [k for k in out if ".mixer.experts." in k]:
        head, tail = key.split(".mixer.experts.", 1)
        j, _, name = tail.partition(".")
        if not j.isdigit() or name not in ("up_proj.weight", "down_proj.weight"):
            continue  # left for the unknown-key check
        pieces.setdefault((head, name.removesuffix(".weight")), {})[int(j)] = out.pop(key)
    for (head, name), experts in pieces.items():
        missing = [j for j in range(config.n_experts) if j not in experts]
        if missing or len(experts) != config.n_experts:
            raise ValueError(f"{head}.mixer.experts holds {name} of experts {sorted(experts)[:8]}...; expected "
                             f"experts 0 .. {config.n_experts - 1} (n_routed_experts), missing {missing[:8]}")
        out[f"{head}.mixer.{name}"] = torch.stack([experts[j] for j in range(config.n_experts)])


def _stack_saved_experts(out: dict[str, Tensor], config: HybridConfig, names=("w1", "w3", "w2")) -> None:
    """LFM2-MoE (Jamba) as saved, `layers.{i}.experts.{j}.{w1,w3,w2}.weight` (`{gate,up,down}_proj`):
    gate, up (fe, d); down (d, fe) -> `layers.{i}.experts.gate_up_proj` (E, 2 fe, d), gate rows then
    up rows, and `.down_proj` (E, d, fe), in place; ValueError naming the first piece missing. With
    no expert_bias in any layer of a sigmoid router (LFM2-MoE's `use_expert_bias` false) its bias is
    zeros, which chooses as none."""
    gate, up, down = names
    if not config.n_experts:  # experts keys are left for the unknown-key check
        return
    pieces: dict[str, dict[tuple[int, str], Tensor]] = {}
    for key in [k for k in out if ".experts." in k]:
        head, tail = key.split(".experts.", 1)
        j, _, name = tail.partition(".")
        if j.isdigit() and name.removesuffix(".weight") in names:
            pieces.setdefault(head, {})[int(j), name.removesuffix(".weight")] = out.pop(key)
    for head, parts in pieces.items():
        want = [(j, w) for j in range(config.n_experts) for w in names]
        missing = [f"experts.{j}.{w}.weight" for j, w in want if (j, w) not in parts]
        if missing or len(parts) != len(want):  # named as saved, under the layer's MoE block (its path varies)
            raise ValueError(f"layer {head.removeprefix('layers.')}'s MoE block holds {len(parts)} of the {len(want)} "
                             f"expert weights {' / '.join(names)} of experts 0 .. {config.n_experts - 1} "
                             f"(num_experts); missing {missing[:8]}")
        out[f"{head}.experts.gate_up_proj"] = torch.stack(
            [torch.cat([parts[j, gate], parts[j, up]]) for j in range(config.n_experts)])  # (E, 2 fe, d)
        out[f"{head}.experts.down_proj"] = torch.stack([parts[j, down] for j in range(config.n_experts)])  # (E, d, fe)
    routers = {k.removesuffix(".router.weight") for k in out if k.endswith(".experts.router.weight")}
    if config.expert_routing == "sigmoid" and not any(f"{head}.router_bias" in out for head in routers):
        for head in routers:
            out[f"{head}.router_bias"] = torch.zeros(config.n_experts)


_STACKERS = {"nemotron_h": _stack_experts, "lfm2": _stack_saved_experts,
             "bamba": partial(_stack_saved_experts, names=("gate_proj", "up_proj", "down_proj")),  # (Jamba's)
             "qwen3_5": partial(_stack_saved_experts, names=("gate_proj", "up_proj", "down_proj")),
             "kimi_linear": _stack_saved_experts,
             "bailing_hybrid": partial(_stack_saved_experts, names=("gate_proj", "up_proj", "down_proj"))}


def _rename(key: str, layout: str, parallel: bool = False) -> str | None:
    """A source key -> ours, or None when the layout has no such key. `parallel`: the layers hold
    attention beside the mixer (Falcon-H1), so `self_attn` is the layer's `attention`."""
    if layout == "ours":
        return key
    if layout == "nemotron_h":
        return _nemotron_h_key(key)
    if layout == "lfm2":
        return _lfm2_key(key)
    if layout == "qwen3_5":
        return _qwen3_5_key(key)
    if layout == "olmo_hybrid":
        return _olmo_hybrid_key(key)
    if layout == "zamba2":
        return _zamba2_key(key)
    if layout in ("kimi_linear", "bailing_hybrid"):
        return _kimi_linear_key(key)
    return _bamba_key(key, parallel)


def _nemotron_h_key(key: str) -> str | None:
    """`backbone.` (as saved) or `model.` (as in memory) dropped, `embeddings` -> `embed_tokens`."""
    for prefix in ("backbone.", "model."):
        if key.startswith(prefix):
            rest = key[len(prefix):]
            return "embed_tokens.weight" if rest == "embeddings.weight" else _nemotron_h_moe_key(rest)
    return key if key == "lm_head.weight" else None


_TOP_LEVEL = {"model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "lm_head.weight",
              "model.norm.weight": "norm_f.weight"}  # (transformers' most common names)


def _split(key: str, top: dict[str, str]) -> str | tuple[str, str, str] | None:
    """A transformers key: a top-level one's new name (`top`), a layer's (i, module, rest) from
    `model.layers.{i}.{module}.{rest}`, or None."""
    if key in top:
        return top[key]
    parts = key.split(".", 4)  # model, layers, i, module, rest
    return (parts[2], parts[3], parts[4]) if len(parts) == 5 and parts[:2] == ["model", "layers"] else None


def _bamba_key(key: str, parallel: bool) -> str | None:
    """Bamba / Granite / Falcon-H1 / Jamba names -> ours (see `convert_state_dict`)."""
    split = _split(key, {"model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "lm_head.weight",
                         "model.final_layernorm.weight": "norm_f.weight", "model.norm.weight": "norm_f.weight"})
    if not isinstance(split, tuple):
        return split
    i, module, rest = split
    modules = {"input_layernorm": "norm", "mamba": "mixer", "self_attn": "attention" if parallel else "mixer",
               "pre_ff_layernorm": "mlp_norm", "post_attention_layernorm": "mlp_norm",
               "feed_forward": "mlp", "shared_mlp": "mlp", "block_sparse_moe": "experts"}
    if module not in modules:
        return None
    if module == "shared_mlp":
        rest = {"output_linear.weight": "down_proj.weight"}.get(rest, rest)
    if module == "feed_forward" and rest.split(".")[0] in ("router", "experts"):  # Jamba's mixture of experts
        return f"layers.{i}.experts.{_GRANITE_EXPERTS.get(rest, rest.removeprefix('experts.'))}"
    if module == "block_sparse_moe":  # as saved, and as transformers 5 holds it in memory
        rest = _GRANITE_EXPERTS.get(rest, rest)
    return f"layers.{i}.{modules[module]}.{rest}"


def _lfm2_key(key: str) -> str | None:
    """LFM2's names -> ours: `operator_norm` / `ffn_norm` -> `norm` / `mlp_norm`, `self_attn` and
    `conv` -> `mixer` (`out_proj` and `{q,k}_layernorm` of attention -> `o_proj`, `{q,k}_norm`),
    `feed_forward.{w1,w3,w2}` -> `mlp.{gate,up,down}_proj`, `embedding_norm` (the final norm) -> `norm_f`."""
    split = _split(key, {"model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "lm_head.weight",
                         "model.embedding_norm.weight": "norm_f.weight"})
    if not isinstance(split, tuple):
        return split
    i, module, rest = split
    name, _, what = rest.rpartition(".")  # e.g. "q_layernorm", "weight"
    if module == "self_attn":
        name = _LFM2_ATTENTION.get(name)
    elif module == "feed_forward" and rest in _LFM2_MOE:  # LFM2-MoE's router and its bias
        return f"layers.{i}.experts.{_LFM2_MOE[rest]}"
    elif module == "feed_forward" and rest.startswith("experts."):  # stacked (in memory) or one expert each (saved)
        return f"layers.{i}.experts.{_LFM2_MOE.get(rest, rest.removeprefix('experts.'))}"
    elif module == "feed_forward":
        name = _LFM2_MLP.get(name)
    elif module in _LFM_NORMS and rest == "weight":
        return f"layers.{i}.{_LFM_NORMS[module]}.weight"
    elif module != "conv":
        return None
    if not name:
        return None
    return f"layers.{i}.{'mlp' if module == 'feed_forward' else 'mixer'}.{name}.{what}"


def _qwen3_5_key(key: str) -> str | None:
    """Qwen3.5's names (the image-text checkpoint's under `model.language_model.`) -> ours:
    `linear_attn` and `self_attn` -> `mixer` (`in_proj_{qkv,z,b,a}` -> `in_proj`, `{z,b,a}_proj`),
    `input_layernorm` / `post_attention_layernorm` -> `norm` / `mlp_norm`, `model.norm` -> `norm_f`."""
    if key.startswith("model.language_model."):
        key = "model." + key.removeprefix("model.language_model.")
    split = _split(key, _TOP_LEVEL)
    if not isinstance(split, tuple):
        return split
    i, module, rest = split
    if module not in _QWEN3_5_MODULES:
        return None
    name, dot, tail = rest.partition(".")
    if module == "linear_attn":
        name = _QWEN3_5_DELTANET.get(name, name)
    if module == "mlp" and name in _QWEN3_5_MOE:  # Qwen3.5-MoE's block: router, experts, shared expert
        return f"layers.{i}.{_QWEN3_5_MOE[name]}{dot}{tail}"
    return f"layers.{i}.{_QWEN3_5_MODULES[module]}.{name}{dot}{tail}"


def _olmo_hybrid_key(key: str) -> str | None:
    """OLMo-hybrid's names, as saved (OLMo-core's) or as transformers holds them -> ours:
    `linear_attn` / `self_attn` -> `mixer` (the DeltaNet's `g_proj`, `o_proj`, `o_norm` -> `z_proj`,
    `out_proj`, `norm`; its q/k/v_proj and, as saved, q/k/v_conv1d joined in
    `_olmo_hybrid_weights`), `input_layernorm` (`attention_layer_norm`) -> `norm`,
    `post_feedforward_layernorm` -> `mlp_norm`, `model.norm` -> `norm_f`;
    `post_attention_layernorm` (`feedforward_layer_norm`) is named so here: it is an attention
    layer's `norm` and a DeltaNet layer's `mlp_norm`, placed by `_olmo_hybrid_weights`."""
    split = _split(key, _TOP_LEVEL)
    if not isinstance(split, tuple):
        return split
    i, module, rest = split
    name, dot, tail = rest.partition(".")
    if module == "linear_attn":
        return f"layers.{i}.mixer.{_OLMO_HYBRID_DELTANET.get(name, name)}{dot}{tail}"
    if module in _OLMO_HYBRID_MODULES:
        return f"layers.{i}.{_OLMO_HYBRID_MODULES[module]}.{rest}"
    return None


def _zamba2_key(key: str) -> str | None:
    """Zamba2's names -> ours: a layer's `mamba` (`mamba_decoder.mamba`) -> `mixer`, its
    `input_layernorm` (`mamba_decoder.input_layernorm`) -> `norm`, `linear` as it is,
    `model.final_layernorm` -> `norm_f`; `shared_transformer.*` named `zamba2_shared.{i}.*` here:
    `_zamba2_weights` places it (a shared block's weight, or one hybrid layer's adapter)."""
    split = _split(key, {"model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "lm_head.weight",
                         "model.final_layernorm.weight": "norm_f.weight"})
    if not isinstance(split, tuple):
        return split
    i, module, rest = split
    if module == "mamba_decoder":
        module, _, rest = rest.partition(".")
    if module in _ZAMBA2_LAYER:
        return f"layers.{i}.{_ZAMBA2_LAYER[module]}.{rest}"
    return f"zamba2_shared.{i}.{rest}" if module == "shared_transformer" else None


def _kimi_linear_key(key: str) -> str | None:
    """Kimi-Linear's names, as saved or as transformers holds them -> ours: `self_attn` -> `mixer`
    (a KDA's `forget_gate.` dropped, `o_norm` -> `norm`; its q/k/v projections, its saved
    q/k/v convs and `o_proj` placed by `_kimi_linear_weights`; an MLA's `kv_a_proj_with_mqa`,
    `{q_a,kv_a}_layernorm` -> `kv_a_proj`, `{q_a,kv_a}_norm`), `input_layernorm` /
    `post_attention_layernorm` -> `norm` / `mlp_norm`, `mlp` and `block_sparse_moe` (as saved) ->
    `mlp` (dense), `experts` (`gate` -> `router`, its `e_score_correction_bias` -> `router_bias`),
    `shared` (`shared_experts`), `model.norm` -> `norm_f`."""
    split = _split(key, {**_TOP_LEVEL, "model.word_embeddings.weight": "embed_tokens.weight"})  # (Ling 3's saved)
    if not isinstance(split, tuple):
        return split
    i, module, rest = split
    if module in ("self_attn", "attention"):  # (Ling 3's saved: attention)
        name, dot, tail = rest.removeprefix("forget_gate.").partition(".")
        return f"layers.{i}.mixer.{_KIMI_LINEAR_ATTENTION.get(name, name)}{dot}{tail}"
    name, _, tail = rest.partition(".")
    if module in ("mlp", "block_sparse_moe"):
        if name == "gate":
            return f"layers.{i}.experts.{_KIMI_LINEAR_ROUTER.get(tail, tail)}"
        if name in ("experts", "shared_experts"):
            return f"layers.{i}.{'shared' if name == 'shared_experts' else 'experts'}.{tail}"
        return f"layers.{i}.mlp.{rest}"
    if module in ("input_layernorm", "post_attention_layernorm"):
        return f"layers.{i}.{'norm' if module == 'input_layernorm' else 'mlp_norm'}.{rest}"
    return None


_KIMI_LINEAR_ATTENTION = {"o_norm": "norm", "kv_a_proj_with_mqa": "kv_a_proj", "q_a_layernorm": "q_a_norm",
                          "kv_a_layernorm": "kv_a_norm", "dense": "o_proj"}  # (dense: Ling 3's saved o_proj)
_KIMI_LINEAR_ROUTER = {"weight": "router.weight", "e_score_correction_bias": "router_bias",
                       "expert_bias": "router_bias"}  # (Ling 3's saved bias)


def _kimi_linear_weights(out: dict[str, Tensor], config: HybridConfig, source: dict[str, str],
                         layout: str = "kimi_linear") -> None:
    """In place: each KDA's q, k and v projections (and, as saved, convs) joined rows after rows
    into `in_proj` (`conv1d`), the conv's channel order; its `o_proj` -> `out_proj` (an MLA
    layer's keeps its name); its `A_log` (1, 1, h, 1) -> (h,). A missing piece is named under
    the layer's attention module as the checkpoint names it (Ling 3 saves `attention`)."""
    for i, kind in enumerate(config.layer_types):
        if kind != "kda":
            continue
        stem = f"layers.{i}.mixer"
        module = next((theirs.split(".")[3] for ours, theirs in source.items() if ours.startswith(f"{stem}.")
                       and theirs.startswith(f"model.layers.{i}.")), "self_attn")
        _join(out, source, i, [f"{p}_proj.weight" for p in "qkv"], "in_proj.weight", layout, module)
        _join(out, source, i, [f"{p}_conv1d.weight" for p in "qkv"], "conv1d.weight", layout, module)
        for key in [k for k in out if k.startswith(f"{stem}.o_proj.")]:
            new = f"{stem}.out_proj.{key.rsplit('.', 1)[1]}"
            out[new], source[new] = out.pop(key), source.pop(key, key)
        if f"{stem}.A_log" in out and out[f"{stem}.A_log"].numel() == config.delta_v_heads:
            out[f"{stem}.A_log"] = out[f"{stem}.A_log"].reshape(-1)  # (h,)


_ZAMBA2_LAYER = {"mamba": "mixer", "input_layernorm": "norm", "linear": "linear"}
_ZAMBA2_ADAPTER = re.compile(r"(?:self_attn\.linear_([qkv])_adapter_list|feed_forward\.gate_up_proj_adapter_list)"
                             r"\.(\d+)\.([01])\.weight")
_ZAMBA2_BLOCK = {"input_layernorm": "norm", "pre_ff_layernorm": "mlp_norm", "self_attn": "attention",
                 "feed_forward": "mlp"}


def _zamba2_weights(out: dict[str, Tensor], config: HybridConfig, source: dict[str, str]) -> None:
    """In place: Zamba2's shared transformer weights (held under every hybrid layer in memory,
    saved under the first of each block) -> `shared_blocks.{b}` (hybrid layer n calls block
    n % shared_blocks), its fused MLP `gate_up_proj` (gate rows, then up) split; each adapter
    (`…adapter_list.{n}`: hybrid layer n's, wherever saved) -> that layer's `adapters` /
    `mlp_adapter`. One weight named twice must be the same tensor (ValueError naming both)."""
    hybrid = [i for i, kind in enumerate(config.layer_types) if kind == "zamba"]
    for key in [k for k in out if k.startswith("zamba2_shared.")]:
        value, saved = out.pop(key), source.pop(key, key)
        _, i, rest = key.split(".", 2)
        placed = _zamba2_place(rest, int(i), hybrid, config.shared_blocks, value)
        for name, part in (placed or {saved: value}).items():  # (unplaced: kept as saved, for the unknown-key check)
            if name in out and not torch.equal(out[name], part):
                raise ValueError(f"{saved} and {source.get(name, name)} are the same weight of this config "
                                 f"({name}) but differ; expected tied copies")
            out[name], source[name] = part, saved


def _zamba2_place(rest: str, i: int, hybrid: list[int], blocks: int, value: Tensor) -> dict[str, Tensor] | None:
    """One `shared_transformer.{rest}` weight of layer i -> {our name: tensor}, or None (no place)."""
    adapter = _ZAMBA2_ADAPTER.fullmatch(rest)
    if adapter:
        which, n, part = adapter.groups()
        if int(n) >= len(hybrid):
            return None
        where = f"adapters.{which}" if which else "mlp_adapter"
        return {f"layers.{hybrid[int(n)]}.{where}.{part}.weight": value}
    if i not in hybrid:
        return None
    module, _, tail = rest.partition(".")
    if module not in _ZAMBA2_BLOCK:
        return None
    stem = f"shared_blocks.{hybrid.index(i) % blocks}.{_ZAMBA2_BLOCK[module]}"
    if tail.startswith("gate_up_proj.") and value.shape[0] % 2 == 0:  # (2 f, .): gate then up
        gate, up = value.chunk(2, dim=0)
        kind = tail.removeprefix("gate_up_proj.")
        return {f"{stem}.gate_proj.{kind}": gate, f"{stem}.up_proj.{kind}": up}
    return {f"{stem}.{tail}": value}


def _olmo_hybrid_weights(out: dict[str, Tensor], config: HybridConfig, source: dict[str, str]) -> None:
    """In place: each layer's `post_attention_layernorm` to where it acts (an attention layer's
    output norm `norm`, a DeltaNet layer's MLP pre-norm `mlp_norm`), and a DeltaNet's q, k and v
    projections joined rows after rows into `in_proj` (the conv's channels, in that order),
    recorded in `source`. ValueError naming a missing piece as saved."""
    for key in [k for k in out if k.endswith(".post_attention_layernorm.weight")]:
        i = int(key.split(".")[1])
        if i < config.n_layer:  # (else left for the unknown-key check)
            new = f"layers.{i}.{'norm' if config.layer_types[i] == 'attention' else 'mlp_norm'}.weight"
            out[new], source[new] = out.pop(key), source.pop(key, key)
    for i, kind in enumerate(config.layer_types):
        if kind == "deltanet":  # q, k, v rows after rows: the conv's channels (b, 2 hk dk + hv dv, .)
            _join(out, source, i, [f"{p}_proj.weight" for p in "qkv"], "in_proj.weight")
            _join(out, source, i, [f"{p}_conv1d.weight" for p in "qkv"], "conv1d.weight")


def _join(out: dict[str, Tensor], source: dict[str, str], i: int, parts: list[str], into: str,
          layout: str = "olmo_hybrid", module: str = "linear_attn") -> None:
    """Layer i's DeltaNet weights `parts` (as saved apart, under `module`) -> one `into`, rows in
    that order; none of them: nothing. ValueError naming a missing part as saved."""
    stem = f"layers.{i}.mixer"
    keys = [f"{stem}.{p}" for p in parts]
    if not any(k in out for k in keys):
        return
    missing = [f"model.layers.{i}.{module}.{p}" for p, k in zip(parts, keys) if k not in out]
    if missing:
        raise ValueError(f"state dict ({layout} layout) lacks {missing}: layer {i}'s Gated DeltaNet is saved "
                         f"with {', '.join(parts)} apart, and needs each")
    out[f"{stem}.{into}"] = torch.cat([out.pop(k) for k in keys])
    source[f"{stem}.{into}"] = source.pop(keys[0], keys[0])
    for k in keys[1:]:
        source.pop(k, None)


def _qwen3_5_weights(out: dict[str, Tensor], config: HybridConfig, source: dict[str, str]) -> None:
    """In place: Qwen3.5's zero-centred RMSNorm weights (x̂ * (1 + w)) as ours (x̂ * w'): w' = 1 + w,
    the same float32 sum theirs computes. Not a Gated DeltaNet's own gated norm (x̂ * w).
    Qwen3-Next's fused DeltaNet projections read apart (`_unfuse_qwen3_next`)."""
    _unfuse_qwen3_next(out, config, source)
    for key in list(out):
        if key == "norm_f.weight" or key.endswith((".norm.weight", ".mlp_norm.weight", ".q_norm.weight",
                                                   ".k_norm.weight")):
            i = key.split(".")[1] if key.startswith("layers.") else None
            if i is None or not key.endswith(".mixer.norm.weight") or config.layer_types[int(i)] != "deltanet":
                out[key] = 1.0 + out[key]


def _unfuse_qwen3_next(out: dict[str, Tensor], config: HybridConfig, source: dict[str, str]) -> None:
    """In place: Qwen3-Next's `in_proj_qkvz` (hk groups of [q (dk), k (dk), v (r dv), z (r dv)]
    rows, r = hv / hk value heads a key head serves) -> our `in_proj` (every q, then every k,
    then every v: the conv's channel order, as transformers concatenates them) and `z_proj`;
    `in_proj_ba` (hk groups of [b (r), a (r)]) -> `b_proj`, `a_proj`, each recorded in `source`
    (our key -> the checkpoint's) as coming from the fused one. ValueError naming a fused weight
    of the wrong shape as the checkpoint names it."""
    hk, hv, dk, dv = config.delta_k_heads, config.delta_v_heads, config.delta_k_dim, config.delta_v_dim
    r = hv // hk if hk else 0
    for key in [k for k in out if k.endswith((".mixer.in_proj_qkvz.weight", ".mixer.in_proj_ba.weight"))]:
        w, stem, saved_as = out.pop(key), key.rsplit(".", 2)[0], source.pop(key, key)  # (rows, d); `layers.{i}.mixer`
        fused_qkvz = key.endswith("qkvz.weight")
        per_group = 2 * dk + 2 * r * dv if fused_qkvz else 2 * r
        if w.dim() != 2 or w.shape[0] != hk * per_group:
            raise ValueError(f"{saved_as} has shape {tuple(w.shape)}; expected ({hk} key heads x {per_group}, "
                             "hidden_size)")
        groups = w.reshape(hk, per_group, w.shape[1])  # (hk, per group, d)
        if fused_qkvz:
            q, k, v, z = groups.split([dk, dk, r * dv, r * dv], dim=1)
            parts = {"in_proj": torch.cat([q.reshape(hk * dk, -1), k.reshape(hk * dk, -1),
                                           v.reshape(hv * dv, -1)]),  # (2 hk dk + hv dv, d)
                     "z_proj": z.reshape(hv * dv, -1)}  # value head g r + j: group g's j-th
        else:
            b, a = groups.split([r, r], dim=1)  # (hk, r, d) each
            parts = {"b_proj": b.reshape(hv, -1), "a_proj": a.reshape(hv, -1)}
        for name, weight in parts.items():
            out[f"{stem}.{name}.weight"], source[f"{stem}.{name}.weight"] = weight, saved_as


_REGROUPERS = {"qwen3_5": _qwen3_5_weights, "olmo_hybrid": _olmo_hybrid_weights, "zamba2": _zamba2_weights,
               "kimi_linear": _kimi_linear_weights,
               "bailing_hybrid": partial(_kimi_linear_weights, layout="bailing_hybrid")}


def _tie(out: dict[str, Tensor], config: HybridConfig) -> None:
    """A tied model's lm_head is its embedding (a saved lm_head must equal it)."""
    if config.tie_embeddings and "embed_tokens.weight" in out:
        head = out.get("lm_head.weight")
        if head is not None and not torch.equal(head, out["embed_tokens.weight"]):
            raise ValueError("config ties lm_head to the embedding, but 'lm_head.weight' differs from it")
        out["lm_head.weight"] = out["embed_tokens.weight"]


def convert_state_dict(state: dict[str, Tensor], config: HybridConfig) -> dict[str, Tensor]:
    """A state dict in any of the layouts (told apart by its keys) -> the keys of `HybridLM(config)`, float32.

    - Bamba / Granite / Falcon-H1 (its `self_attn` -> `attention`): `model.layers.{i}.{input_layernorm,mamba,self_attn,pre_ff_layernorm |
      post_attention_layernorm,feed_forward | shared_mlp}` -> `layers.{i}.{norm,mixer,mixer,mlp_norm,mlp}`;
      Granite's `shared_mlp.input_linear.weight` (2f, d) splits into gate_proj (first f rows) and
      up_proj (last f), `output_linear` -> down_proj; `block_sparse_moe.{input_linear,
      output_linear,router.layer}.weight` -> `experts.{gate_up_proj,down_proj,router.weight}`;
    - Nemotron-H: `backbone.` (as saved) or `model.` (as in memory) dropped, `embeddings` -> `embed_tokens`;
      its multi-token-prediction weights (`mtp.*`) are ignored, as transformers does;
    - a missing `lm_head.weight` is the embedding when tied.

    Returns a new dict. Raises ValueError naming missing keys, keys the layout does not have
    (e.g. experts a dense config has no place for), and an `input_linear` whose rows are not
    2 * d_ff, and expert weights of the wrong shape.
    """
    layout = _layout_of(state)
    parallel = "parallel" in config.layer_types  # Falcon-H1: Bamba's names, attention beside the mixer
    out, unknown, source = {}, [], {}  # source: our key -> the key it came from
    for key, value in state.items():
        if layout in ("nemotron_h", "qwen3_5") and key.startswith("mtp.") or \
                layout == "qwen3_5" and key.startswith("model.visual.") or \
                layout == "bailing_hybrid" and _layer_index(key) >= config.n_layer:
            continue  # multi-token prediction (Ling 3's: layers after the last) and the vision tower
        new = _rename(key, layout, parallel)
        if new is None:
            unknown.append(key)
        elif new.endswith(".mlp.input_linear.weight"):
            if value.shape[0] != 2 * config.d_ff:
                raise ValueError(f"{key!r} has {value.shape[0]} rows; expected 2 * shared_intermediate_size = "
                                 f"{2 * config.d_ff} (gate then up)")
            gate, up = value.float().chunk(2, dim=0)
            stem = new.removesuffix("input_linear.weight")
            out[stem + "gate_proj.weight"], out[stem + "up_proj.weight"] = gate, up
        else:
            out[new] = value.float() if value.is_floating_point() else value
            source[new] = key
    if layout in _STACKERS:  # experts saved one tensor each -> our stacks
        _STACKERS[layout](out, config)
    if layout in _REGROUPERS:  # weights whose place depends on the config, or saved fused / apart
        _REGROUPERS[layout](out, config, source)
    _tie(out, config)

    layout = _label(layout, config)  # as the errors below name it
    with torch.device("meta"):
        want = set(HybridLM(config).state_dict())
    extra = sorted(set(out) - want)
    if unknown or extra:
        names = unknown + [source.get(k, k) for k in extra]
        raise ValueError(f"state dict ({layout} layout) has keys this HybridConfig has no place for: "
                         f"{names[:8]}{' ...' if len(names) > 8 else ''} ({len(names)} keys)")
    missing = sorted(want - set(out))
    if missing:
        named = [_as_theirs(k, source, layout, parallel) for k in missing[:8]]
        raise ValueError(f"state dict ({layout} layout) lacks {named}{' ...' if len(missing) > 8 else ''} "
                         f"({len(missing)} keys) for this HybridConfig")
    return out


def _layer_index(key: str) -> int:
    """i of `model.layers.{i}.…`, or -1."""
    parts = key.split(".", 3)
    return int(parts[2]) if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit() else -1


def _label(layout: str, config: HybridConfig) -> str:
    """The layout as errors name it: Bamba's key names are Falcon-H1's and Jamba's too."""
    if layout == "bamba" and "parallel" in config.layer_types:
        return "falcon_h1"
    if layout == "lfm2" and (config.sandwich_norm or config.attention_head_gate or config.sliding_window_layers):
        return "lfm3"
    return "jamba" if layout == "bamba" and "mamba" in config.layer_types else layout


def _as_theirs(missing: str, source: dict[str, str], layout: str, parallel: bool) -> str:
    """Our missing key as the checkpoint would have named it, e.g. `model.layers.0.mamba.D
    (layers.0.mixer.D)`: a key the checkpoint has of the same module gives the prefix, the name
    under it is ours or the layout's for it (LFM2's `w3` for `up_proj`), and it is kept only if
    it reads back as ours. Our key alone when none is found."""
    if layout == "ours":
        return missing
    stem = missing
    while "." in stem:
        stem = stem.rsplit(".", 1)[0]
        head, _, rest = missing[len(stem) + 1:].partition(".")
        tails = [f"{t}.{rest}" if rest else t for t in _THEIR_NAMES.get(head, ())] + [missing[len(stem) + 1:]]
        for ours, theirs in source.items():
            if not ours.startswith(stem + "."):
                continue
            prefix = theirs.rsplit(".", ours[len(stem) + 1:].count(".") + 1)[0]  # theirs, less our tail's parts
            for tail in tails:
                if _rename(f"{prefix}.{tail}", layout, parallel) == missing:  # (falcon_h1 / granite: bamba's names)
                    return f"{prefix}.{tail} ({missing})"
    return missing


# our module name -> the names a layout gives it where they differ (for `_as_theirs`)
_THEIR_NAMES = {ours: [theirs for theirs, o in {**_LFM2_MLP, **_LFM2_ATTENTION, **_QWEN3_5_DELTANET}.items()
                       if o == ours != theirs]
                for ours in {**_LFM2_MLP, **_LFM2_ATTENTION, **_QWEN3_5_DELTANET}.values()}
