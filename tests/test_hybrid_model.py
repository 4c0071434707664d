"""models/hybrid.py and families/hybrid/layouts.py: parity with transformers' own
`BambaForCausalLM`, `GraniteMoeHybridForCausalLM` (dense, and with experts) and `NemotronHForCausalLM` torch paths
loaded from their saved checkpoints (logits over a whole decode and every layer's cache), rows at
different positions in one call, forward / step / continuation agreement, the chunked scan, and
the refusals (MoE, bad fields)."""

import json
import math
import re
from functools import partial

import pytest
import torch
from safetensors.torch import load_file
from seqexport.models.hybrid import HybridConfig, HybridLM, append_kv
from seqexport.models.mamba2 import ssd_chunked, ssd_sequential

from seqexport.families.hybrid.layouts import (
    convert_state_dict,
    hybrid_config_from_json,
    is_hybrid_config,
)

transformers = pytest.importorskip("transformers")

VOCAB = 100


def _max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


# ---- transformers' models, made to disagree loudly with a wrong implementation ----

def _bamba():
    return transformers.BambaForCausalLM(transformers.BambaConfig(
        hidden_size=64, num_hidden_layers=5, attn_layer_indices=[0, 2, 4], vocab_size=VOCAB, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
        mamba_d_state=16, mamba_chunk_size=16, attention_bias=True, mlp_bias=True, mamba_proj_bias=True,
    ))  # RoPE on half of each head (BambaConfig's partial_rotary_factor 0.5)


def _granite(rope: bool):
    return transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, shared_intermediate_size=96, num_local_experts=0,
        layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=16, mamba_chunk_size=16, position_embedding_type="rope" if rope else None,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.5,
    ))


def _granite_moe():
    # 6 experts, 2 a token, beside the shared MLP; NoPE, Granite's multipliers
    return transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, shared_intermediate_size=96, num_local_experts=6,
        num_experts_per_tok=2, intermediate_size=48,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
        mamba_d_state=16, mamba_chunk_size=16, position_embedding_type=None,
        embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.5,
    ))


def _nemotron_h():
    # Mamba-2 width 6 * 16 = 96, not a multiple of d_model: the mixer adapter's case.
    return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        hidden_size=64, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, mamba_num_heads=6, mamba_head_dim=16, n_groups=2, ssm_state_size=16, chunk_size=16,
        layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention", "full_attention"],
    ))


def _nemotron_h_moe():
    # 8 squared-ReLU experts in 4 groups, 3 a token from the best 2 groups, scaled by 2.5; a shared
    # expert MLP of its own width
    return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        hidden_size=64, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, mamba_num_heads=6, mamba_head_dim=16, n_groups=2, ssm_state_size=16, chunk_size=16,
        layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "moe"], n_routed_experts=8,
        num_experts_per_tok=3, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=4,
        topk_group=2, routed_scaling_factor=2.5,
    ))


def _falcon_h1():
    # every layer attention beside a Mamba-2 mixer (96 wide: 6 heads of 16, not a multiple of
    # d_model), the mixer's output SiLU-gated without a norm; every μP multiplier away from 1
    return transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
        hidden_size=64, num_hidden_layers=3, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=16, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        embedding_multiplier=3.0, lm_head_multiplier=0.4, key_multiplier=0.6, attention_in_multiplier=1.5,
        attention_out_multiplier=0.7, ssm_in_multiplier=1.3, ssm_out_multiplier=0.5,
        ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.6], mlp_multipliers=[1.4, 0.6],
    ))


def _falcon_h1_gated():
    # the mixer's grouped gated RMSNorm (norm before the gate), biases everywhere, tied embeddings
    return transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
        hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, mamba_d_ssm=128, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=True, mamba_proj_bias=True,
        projectors_bias=True, attention_bias=True, mlp_bias=True, tie_word_embeddings=True, lm_head_multiplier=4.0,
    ))


def _lfm2():
    # LFM2: gated short convolutions (biases, 4 wide) beside attention whose queries and keys are
    # RMS-normed per head; the MLP width as given (no auto-adjust); an untied head
    return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["full_attention", "conv", "full_attention", "conv", "full_attention"],
        conv_L_cache=4, conv_bias=True, block_auto_adjust_ff_dim=False, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    ))


def _lfm2_tied():
    # as LiquidAI's configs: attention at `full_attn_idxs`, the MLP width adjusted (2/3 of 200,
    # times 1.5, rounded up to 32: 224), the head tied to a larger-scale embedding, RoPE theta 1e6
    return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, intermediate_size=200, num_attention_heads=4,
        num_key_value_heads=1, full_attn_idxs=[1, 3], block_ffn_dim_multiplier=1.5, block_multiple_of=32,
        initializer_range=0.3,
    ))


def _lfm2_moe():
    # LFM2-MoE: a dense first layer, then 6 experts (2 a token) instead of the MLP, a sigmoid
    # router whose choice adds expert_bias, weights normalised and scaled by 2.5
    return transformers.Lfm2MoeForCausalLM(transformers.Lfm2MoeConfig(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, intermediate_size=96, moe_intermediate_size=32,
        num_experts=6, num_experts_per_tok=2, num_dense_layers=1, routed_scaling_factor=2.5, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["conv", "full_attention", "conv", "full_attention"], tie_word_embeddings=False,
    ))


def _jamba():
    # Jamba, dense: Mamba-1 mixers (their Δ input, B and C RMS-normed with weights, biases in
    # in_proj / out_proj) around attention without positions at layers 1 and 4, GQA 4:2
    return transformers.JambaForCausalLM(transformers.JambaConfig(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_period=3, attn_layer_offset=1, num_experts=1, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=6, mamba_proj_bias=True,
    ))


def _jamba_moe():
    # Jamba with experts in layers 1 and 3 (4 of them, 2 a token: the top 2 of the softmax over
    # all 4, not renormalised), a dense MLP in 0 and 2; attention at layer 2
    return transformers.JambaForCausalLM(transformers.JambaConfig(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_period=4, attn_layer_offset=2, num_experts=4, num_experts_per_tok=2,
        expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=6,
    ))


def _qwen3_5():
    # Qwen3.5's text model: Gated DeltaNets (2 query/key heads of 24 serving 4 value heads of 16)
    # around gated attention (q and k RMS-normed per head, RoPE on half of each head), GQA 4:2;
    # every RMSNorm but the DeltaNet's zero-centred (x̂ * (1 + w))
    return transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=24,
        linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
    ))


def _qwen3_5_moe():
    # Qwen3.5-MoE: the same layers, 6 experts in every layer (2 a token, the softmax over the top 2)
    # beside a shared expert MLP gated by sigmoid(shared_expert_gate(h))
    return transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=24, linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"], num_experts=6,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
    ))


def _qwen3_next():
    # Qwen3-Next: Qwen3.5-MoE's layers with the DeltaNet's projections fused (in_proj_qkvz,
    # in_proj_ba: grouped by key head); experts (4, 2 a token, not renormalised) beside a gated
    # shared expert in every second layer but layer 3, a dense MLP in the others
    return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=80, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=24,
        linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[3],
        moe_intermediate_size=32, shared_expert_intermediate_size=48,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
    ))


def _olmo_hybrid():
    # OLMo-hybrid: pre-norm Gated DeltaNets (q, k, v projected apart; β = 2 sigmoid(b), so writes
    # can reflect the state; 2 key heads serving 4 value heads) around post-norm attention whose
    # queries and keys are RMS-normed across all heads, with RoPE (the released ones have none)
    return transformers.OlmoHybridForCausalLM(transformers.OlmoHybridConfig(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=24,
        linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, pad_token_id=None, eos_token_id=None,
    ))


def _olmo_hybrid_nope():
    # as released: no positions (rope_theta null), q/k/v heads alike (every derived size left to
    # the config), and β = sigmoid(b) (linear_allow_neg_eigval false)
    return transformers.OlmoHybridForCausalLM(transformers.OlmoHybridConfig(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        linear_allow_neg_eigval=False, rope_parameters={"rope_type": "default", "rope_theta": None},
        pad_token_id=None, eos_token_id=None,
    ))


def _lfm3():
    # LFM3: short convs (biases, 4 wide) beside sliding-window attention (the last 5 positions,
    # RoPE over the whole head at theta 500) and full attention (proportional RoPE: a quarter of
    # each half-head turns), each head's output gated by sigmoid(g_proj(x)), every branch's output
    # normed too (sandwich norms), an untied head
    return transformers.Lfm3ForCausalLM(transformers.Lfm3Config(
        hidden_size=64, num_hidden_layers=6, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, conv_L_cache=4, conv_bias=True, sliding_window=5,
        layer_types=["conv", "sliding_attention", "conv", "full_attention", "sliding_attention", "conv"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": {"rope_type": "proportional", "rope_theta": 1e4,
                                            "partial_rotary_factor": 0.25}},
        tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    ))


def _lfm3_plain():
    # LFM3 without its sandwich norms and head gates, its layers and RoPE as Lfm3Config derives
    # them (attention at 2, a 3-wide window at 4), tied
    return transformers.Lfm3ForCausalLM(transformers.Lfm3Config(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, sliding_window=3, use_sandwich_norm=False, use_attention_gate=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, initializer_range=0.3,
    ))


def _zamba2():
    # Zamba2: Mamba-2 layers, and hybrid layers that first call one of 2 shared transformer
    # blocks in turn (attention 128 wide over cat(x, embedding), heads of 32 scaled by 16^-0.5,
    # RoPE; a gated GELU MLP) with each layer's own LoRA on q/k/v and the MLP, its output through
    # the layer's own linear into the Mamba-2 input; 3 hybrid layers, so block 0 serves two
    return transformers.Zamba2ForCausalLM(transformers.Zamba2Config(
        hidden_size=64, num_hidden_layers=6, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"], n_mamba_heads=8,
        mamba_d_state=16, mamba_ngroups=2, chunk_size=16, num_mem_blocks=2, use_shared_attention_adapter=True,
        adapter_rank=4, use_mem_rope=True, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    ))


def _zamba2_plain():
    # one shared block, adapters on its MLP only, no positions, biases (add_bias_linear), GQA 4:2, tied
    return transformers.Zamba2ForCausalLM(transformers.Zamba2Config(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, layers_block_type=["hybrid", "mamba", "hybrid", "mamba"], n_mamba_heads=8,
        mamba_d_state=16, chunk_size=16, adapter_rank=4, add_bias_linear=True, pad_token_id=None, bos_token_id=None,
        eos_token_id=None,
    ))


def _kimi_linear():
    # Kimi-Linear: KDA layers (the gated delta rule with a decay per head and key channel, 4 heads
    # of 16) beside latent attention (MLA without positions: a 24-wide cached latent and an 8-wide
    # shared key part; keys 16 + 8 and values 12 a head), the first layer's MLP dense, the others'
    # 8 experts in 2 groups (2 a token from the best group, sigmoid scores with a choice bias,
    # renormalised, times 2.446) beside a shared expert added as it is
    return transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=4, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        num_local_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, linear_num_heads=4, linear_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
    ))


def _kimi_linear_q():
    # latent attention whose queries go through a 20-wide normed bottleneck (q_lora_rank), two
    # shared experts, every MLP dense below layer 2 (first_k_dense_replace), layers as
    # KimiLinearConfig derives them (attention at 4)
    return transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(
        hidden_size=64, num_hidden_layers=6, vocab_size=VOCAB, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=2, kv_lora_rank=16, q_lora_rank=20, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
        num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=2,
        linear_num_heads=2, linear_head_dim=24, first_k_dense_replace=2, pad_token_id=None, bos_token_id=None,
        eos_token_id=None,
    ))


def _ling3():
    # Ling 3 (BailingHybrid): KDA layers with one projection for each gate and a bounded decay
    # (in (-5, 0) a token), beside latent attention with DeepSeek's interleaved RoPE on its 8
    # shared key dims (theta 500) and a gate per head; attention every 3rd layer; one dense MLP,
    # then 8 experts in 4 groups (2 a token from the best 2 groups) beside a shared expert
    return transformers.BailingHybridForCausalLM(transformers.BailingHybridConfig(
        hidden_size=64, num_hidden_layers=6, vocab_size=VOCAB, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=4, head_dim=16, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        num_local_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, layer_group_size=3,
        first_k_dense_replace=1, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
    ))


def _ling3_softplus():
    # its decay unbounded (kda_safe_gate false: Kimi's softplus form), queries through a bottleneck
    return transformers.BailingHybridForCausalLM(transformers.BailingHybridConfig(
        hidden_size=64, num_hidden_layers=4, vocab_size=VOCAB, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=2, head_dim=24, kv_lora_rank=16, q_lora_rank=20, qk_nope_head_dim=8, qk_rope_head_dim=8,
        v_head_dim=16, num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, layer_group_size=2,
        first_k_dense_replace=2, kda_safe_gate=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    ))


def _ling3_clipped():
    # Ling 3.0-flash's clipped SwiGLU (transformers' post-activation form): the experts' at layers 2
    # and 4, the shared expert's at 1 and 4, at limits the random activations cross (a limit on the
    # dense layer 0, whose MLP transformers never clips)
    return transformers.BailingHybridForCausalLM(transformers.BailingHybridConfig(
        hidden_size=64, num_hidden_layers=5, vocab_size=VOCAB, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=4, head_dim=16, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, layer_group_size=3,
        first_k_dense_replace=1, expert_swiglu_limit_list=[0.2, 0, CLIP, 0, CLIP],
        share_expert_swiglu_limit_list=[0, CLIP, 0, 0, CLIP], pad_token_id=None, bos_token_id=None, eos_token_id=None,
    ))


CLIP = 0.3  # (bites: see test_swiglu_clipping_bites_and_follows_transformers)

HF_MODELS = {"bamba": _bamba, "granite-rope": partial(_granite, True), "granite-nope": partial(_granite, False),
             "granite-moe": _granite_moe, "nemotron_h": _nemotron_h, "nemotron_h-moe": _nemotron_h_moe,
             "falcon_h1": _falcon_h1, "falcon_h1-gated": _falcon_h1_gated, "lfm2": _lfm2, "lfm2-tied": _lfm2_tied,
             "lfm2-moe": _lfm2_moe, "jamba": _jamba, "jamba-moe": _jamba_moe, "qwen3_5": _qwen3_5,
             "qwen3_5-moe": _qwen3_5_moe, "qwen3_next": _qwen3_next, "olmo_hybrid": _olmo_hybrid,
             "olmo_hybrid-nope": _olmo_hybrid_nope, "lfm3": _lfm3, "lfm3-plain": _lfm3_plain,
             "zamba2": _zamba2, "zamba2-plain": _zamba2_plain, "kimi_linear": _kimi_linear,
             "kimi_linear-q": _kimi_linear_q, "ling3": _ling3, "ling3-softplus": _ling3_softplus,
             "ling3-clipped": _ling3_clipped}


def _hf(name: str, seed: int):
    """transformers' model `name`, built and randomised from `seed` alone (its init draws too)."""
    torch.manual_seed(seed)
    return _randomize(HF_MODELS[name](), seed)


@torch.no_grad()
def _randomize(model, seed: int):
    """Weights that make every part count: linears ~ N(0, 1/fan_in) (peaked attention, logits of
    order 1), random biases and norm weights, Δ ≈ 0.5-2 and decays exp(ΔA) over a wide range."""
    gen = torch.Generator().manual_seed(seed)
    zero_centred = getattr(model.config, "model_type", "").startswith(("qwen3_5", "qwen3_next"))
    for name, p in model.named_parameters():
        if name.endswith("dt_bias"):
            dt = torch.rand(p.shape, generator=gen) * 1.5 + 0.5
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1
        elif name.endswith("A_log"):
            p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 0.5 + 0.05))
        elif name.endswith(".D"):
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
        elif p.dim() == 1 and "norm" in name:  # scales near 1 (Qwen3.5's zero-centred norms: x̂ * (1 + w))
            centre = 0.0 if zero_centred and "linear_attn.norm" not in name else 1.0
            p.copy_(centre + 0.2 * torch.randn(p.shape, generator=gen))
        elif p.dim() == 1:  # biases
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif p.dim() == 2 and "embed" not in name:
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
        elif name.endswith("linear_attn.conv1d.weight"):  # a Gated DeltaNet's q / k of order 1 before their
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))  # L2 norm, as trained ones
        elif "experts" in name:  # (E, out, in) stacks of linears
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[2]))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias") or name.endswith("expert_bias"):  # a router's choice bias, of the scores' order
            b.copy_(0.2 * torch.randn(b.shape, generator=gen))
    # Zamba2's later calls of a shared block hold copies that transformers 5 does not tie in memory
    # (a published checkpoint saves each block once, and loads it into every call): tied here
    for copy, first in (getattr(getattr(model, "model", None), "_tied_weights_keys", None) or {}).items():
        model.model.get_submodule(copy).load_state_dict(model.model.get_submodule(first).state_dict())
    return model.eval()


def _load_ours(path) -> HybridLM:
    config = hybrid_config_from_json(json.loads((path / "config.json").read_text()))
    model = HybridLM(config).eval()
    model.load_state_dict(convert_state_dict(load_file(path / "model.safetensors"), config), strict=True)
    return model


def hf_kinds(config) -> list[str]:
    """A transformers hybrid's layer kinds: `layers_block_type` (Jamba's "mamba" / "attention" as
    "linear_attention" / "full_attention"), or LFM2's `layer_types` ("conv" / "full_attention")."""
    kinds = list(getattr(config, "layers_block_type", None) or config.layer_types)
    return [{"mamba": "linear_attention", "attention": "full_attention"}.get(k, k) for k in kinds]


def _hf_states(model, cache) -> list[tuple]:
    """transformers' cache as our per-layer tuples (copies): mamba (conv (b, c, k), ssm (b, h, p, n)),
    attention (keys, values) (b, nkv, T, hd), Falcon-H1's both (keys, values, conv, ssm), LFM2's
    short conv (conv (b, d, ks),), mlp ()."""
    states = []
    for i, kind in enumerate(hf_kinds(model.config)):
        layer = cache.layers[i]
        if kind == "conv":
            states.append((layer.conv_states[0].clone(),))
        elif kind == "linear_attention":
            states.append((layer.conv_states[0].clone(), layer.recurrent_states[0].clone()))
        elif kind in ("full_attention", "sliding_attention"):  # (a sliding layer: its window's last positions)
            states.append((layer.keys.clone(), layer.values.clone()))
        elif kind == "hybrid":
            states.append((layer.keys.clone(), layer.values.clone(), layer.conv_states[0].clone(),
                           layer.recurrent_states[0].clone()))
        else:
            states.append(())
    return states


@torch.no_grad()
def _hf_decode(model, prompt, steps):
    """transformers' prefill then single steps, feeding its cache back, positions given explicitly
    (Bamba's forward would put every call at 0 .. l-1 without them)."""
    b, length = prompt.shape
    out = model(prompt, position_ids=torch.arange(length)[None].expand(b, -1), use_cache=True)
    cache, logits = out.cache, [out.logits.float()]
    prefill_states = _hf_states(model, cache)
    for t, token in enumerate(steps.T):
        out = model(token[:, None], cache=cache, position_ids=torch.full((b, 1), length + t), use_cache=True)
        cache = out.cache
        logits.append(out.logits.float())
    return torch.cat(logits, 1), prefill_states, _hf_states(model, cache)


@torch.no_grad()
def _our_decode(model, prompt, steps, scan):
    b, length = prompt.shape
    logits, new = model(prompt, scan=scan)
    past, windowed = torch.zeros(b, dtype=torch.long), model.config.sliding_window_layers
    state = append_kv(model.allocate_inference_cache(b), new, past, windowed)
    prefill_state, out = state, [logits]
    for t, token in enumerate(steps.T):
        past = torch.full((b,), length + t)
        logits, new = model.step(token, state, past)
        state = append_kv(state, new, past, windowed)
        out.append(logits[:, None])
    return torch.cat(out, 1), prefill_state, state


def _states_err(ours, theirs, relative: bool = False, sliding=()) -> float:
    """Max abs difference over every layer's tensors (relative: each divided by max(1, max |theirs|)).
    Layers in `sliding` hold a window (its last slots the latest positions), transformers' only
    its last ones: ours compared on those."""
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert len(a) == len(b), i
        for x, y in zip(a, b, strict=True):
            if i in sliding:  # (b, nkv, T, hd): the last positions transformers keeps
                assert x.shape[2] >= y.shape[2], (i, x.shape, y.shape)
                x = x[:, :, x.shape[2] - y.shape[2]:]
            assert x.shape == y.shape, (i, x.shape, y.shape)
            scale = max(1.0, y.abs().max().item()) if relative and y.numel() else 1.0
            worst = max(worst, _max_err(x, y) / scale)
    return worst


MEASURED = {}  # layout -> (max logits error, max state error), printed with -s


@pytest.mark.parametrize("name", list(HF_MODELS))
def test_parity_with_transformers(tmp_path, name):
    hf = _hf(name, seed=len(name))
    hf.save_pretrained(tmp_path)
    ours = _load_ours(tmp_path)
    gen = torch.Generator().manual_seed(7)
    worst_logits = worst_state = 0.0
    for length in (1, 17, 300):
        prompt = torch.randint(0, VOCAB, (2, length), generator=gen)
        steps = torch.randint(0, VOCAB, (2, 20), generator=gen)
        want, want_prefill, want_state = _hf_decode(hf, prompt, steps)
        assert want.abs().max() > 0.5  # logits of order 1: an absolute 1e-4 means something
        for scan in (partial(ssd_chunked, chunk=16), ssd_sequential):
            got, prefill_state, state = _our_decode(ours, prompt, steps, scan)
            assert got.shape == want.shape == (2, length + 20, VOCAB)
            sliding = ours.config.sliding_window_layers
            errs = (_max_err(got, want), _states_err(prefill_state, want_prefill, sliding=sliding),
                    _states_err(state, want_state, sliding=sliding))
            assert max(errs) <= 1e-4, (name, length, errs)
            worst_logits, worst_state = max(worst_logits, errs[0]), max(worst_state, *errs[1:])
    MEASURED[name] = (worst_logits, worst_state)
    print(f"{name}: logits {worst_logits:.2e}, state {worst_state:.2e}")


def test_layouts_read_what_transformers_means(tmp_path):
    bamba = hybrid_config_from_json(_bamba().config.to_dict())
    assert bamba.layer_types == ["attention", "mamba2", "attention", "mamba2", "attention"]
    assert bamba.rotary_dim == 8 and bamba.mlp_in_layer and bamba.mlp_act == "silu_gated"
    # a config.json with no rope_parameters (older transformers): BambaConfig's own 0.5 of the
    # head, which transformers puts in when it reads that file
    old = {k: v for k, v in _bamba().config.to_dict().items() if k != "rope_parameters"}
    read_by_transformers = transformers.BambaConfig(**{k: v for k, v in old.items() if k != "model_type"})
    assert read_by_transformers.rope_parameters["partial_rotary_factor"] == 0.5
    assert hybrid_config_from_json(old).rotary_dim == 8 and hybrid_config_from_json(old).rope_theta == 10000.0
    granite = hybrid_config_from_json(_granite(False).config.to_dict())
    assert not granite.rope and granite.attention_multiplier == 0.2 and granite.logits_scaling == 2.5
    assert hybrid_config_from_json(_granite(True).config.to_dict()).rotary_dim == 16
    nemo = hybrid_config_from_json(_nemotron_h().config.to_dict())
    assert nemo.layer_types == ["mamba2", "attention", "mlp", "mamba2", "attention"]
    assert not nemo.mlp_in_layer and nemo.mlp_act == "relu2" and not nemo.rope and nemo.mamba_d_inner == 96
    assert nemo.dt_min_limit == 0.001  # its mixer clamps Δ at time_step_min
    # Older spellings: Nemotron-H's pattern string, Granite's "mamba" / "attention".
    d = {k: v for k, v in _nemotron_h().config.to_dict().items() if k != "layers_block_type"}
    assert hybrid_config_from_json({**d, "hybrid_override_pattern": "M*-M*"}) == nemo
    g = _granite(False).config.to_dict()
    legacy = ["attention", "mamba", "attention", "mamba", "attention"]
    assert hybrid_config_from_json({**g, "layer_types": legacy}) == granite
    falcon = hybrid_config_from_json(_falcon_h1().config.to_dict())
    assert falcon.layer_types == ["parallel"] * 3 and falcon.mlp_in_layer and falcon.mamba_d_inner == 96
    assert not falcon.mamba_gated_norm and falcon.rotary_dim == 16 and falcon.logits_scaling == 1 / 0.4
    assert (falcon.key_multiplier, falcon.ssm_multipliers, falcon.mlp_multipliers) == (0.6, [0.5, 1.5, 0.8, 1.2, 0.6],
                                                                                       [1.4, 0.6])
    for name in ("lfm2", "lfm2-tied"):  # the MLP's width, as transformers' Lfm2MLP makes it
        hf = HF_MODELS[name]()
        lfm2 = hybrid_config_from_json(hf.config.to_dict())
        assert lfm2.d_ff == hf.model.layers[0].feed_forward.w1.out_features
        assert lfm2.qk_norm and lfm2.rotary_dim == 16 and lfm2.mlp_in_layer
    lfm2 = hybrid_config_from_json(_lfm2_tied().config.to_dict())
    assert lfm2.layer_types == ["conv", "attention", "conv", "attention"] and lfm2.d_ff == 224
    assert lfm2.tie_embeddings and lfm2.rope_theta == 1e6 and lfm2.short_conv_kernel == 3
    # LiquidAI's own config.json spellings: block_ff_dim, tie_embedding, rope_theta at the top, no layer_types
    liquid = {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": VOCAB,
              "num_attention_heads": 4, "num_key_value_heads": 1, "full_attn_idxs": [1, 3], "block_ff_dim": 200,
              "block_ffn_dim_multiplier": 1.5, "block_multiple_of": 32, "tie_embedding": True, "rope_theta": 1e6}
    read_by_transformers = transformers.Lfm2Config(**{k: v for k, v in liquid.items() if k != "model_type"})
    assert hybrid_config_from_json(read_by_transformers.to_dict()) == hybrid_config_from_json(liquid) == lfm2
    bare = {k: v for k, v in liquid.items() if k != "rope_theta"}  # no RoPE key at all: LFM2's own 1e6
    theta = transformers.Lfm2Config(**{k: v for k, v in bare.items() if k != "model_type"}).rope_parameters["rope_theta"]
    assert hybrid_config_from_json(bare).rope_theta == theta == 1e6
    jamba = hybrid_config_from_json(_jamba().config.to_dict())
    assert jamba.layer_types == ["mamba", "attention", "mamba", "mamba", "attention"] and not jamba.rope
    assert (jamba.mamba1_expand, jamba.mamba1_dt_rank, jamba.mamba1_dt_norm, jamba.d_state) == (2, 6, True, 8)
    jmoe = hybrid_config_from_json(_jamba_moe().config.to_dict())
    assert (jmoe.expert_layers, jmoe.n_experts, jmoe.d_ff_expert, jmoe.normalize_expert_weights) == ([1, 3], 4, 48, False)
    auto = {k: v for k, v in _jamba().config.to_dict().items() if k != "mamba_dt_rank"}  # "auto": ceil(64 / 16)
    assert hybrid_config_from_json(auto).mamba1_dt_rank == transformers.JambaConfig(
        **{k: v for k, v in auto.items() if k != "model_type"}).mamba_dt_rank == 4
    moe = hybrid_config_from_json(_lfm2_moe().config.to_dict())
    assert (moe.expert_layers, moe.n_experts, moe.d_ff, moe.d_ff_expert, moe.expert_routing) == ([1, 2, 3], 6, 96, 32, "sigmoid")
    assert hybrid_config_from_json({**moe.to_dict(), "family": "hybrid"}) == moe
    # Ours round-trips.
    assert hybrid_config_from_json({**lfm2.to_dict(), "family": "hybrid"}) == lfm2
    assert hybrid_config_from_json({**falcon.to_dict(), "family": "hybrid"}) == falcon
    assert hybrid_config_from_json({**nemo.to_dict(), "family": "hybrid"}) == nemo
    assert all(is_hybrid_config(c) for c in ({"family": "hybrid"}, {"model_type": "bamba"},
                                             {"model_type": "nemotron_h"}))
    assert not is_hybrid_config({"model_type": "mamba2"})


def test_tied_embeddings_load(tmp_path):
    config = _granite(False).config
    config.tie_word_embeddings = True
    torch.manual_seed(5)
    hf = _randomize(transformers.GraniteMoeHybridForCausalLM(config), seed=5)
    hf.tie_weights()
    hf.save_pretrained(tmp_path)
    ours = _load_ours(tmp_path)
    assert ours.config.tie_embeddings and ours.lm_head.weight is ours.embed_tokens.weight
    prompt = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hf(prompt).logits
        got, _ = ours(prompt, scan=partial(ssd_chunked, chunk=16))
    assert _max_err(got, want) <= 1e-4


# ---- our own model: entry points agree ----

def _ours(mlp_in_layer: bool, seed: int = 0) -> HybridLM:
    torch.manual_seed(seed)
    config = HybridConfig(
        layer_types=["attention", "mamba2", "mlp", "mamba2", "attention"], mlp_in_layer=mlp_in_layer,
        mlp_act="silu_gated" if mlp_in_layer else "relu2", partial_rotary_factor=0.5, ngroups=2, chunk_size=8,
        residual_multiplier=0.7, embedding_multiplier=3.0, logits_scaling=1.5, attention_multiplier=0.3,
    )
    return _randomize(HybridLM(config), seed)


@pytest.mark.parametrize("mlp_in_layer", [True, False])
def test_forward_step_and_continuation_agree(mlp_in_layer):
    model = _ours(mlp_in_layer)
    ids = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    zeros = torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        ref, ref_new = model(ids)
        ref_state = append_kv(model.allocate_inference_cache(2), ref_new, zeros)
        chunked, chunked_new = model(ids, scan=partial(ssd_chunked, chunk=8))
        # float32 through 21 tokens: states of magnitude ~10 agree to ~1e-6 relative
        assert _max_err(chunked, ref) <= 1e-5 and _states_err(chunked_new, ref_new, relative=True) <= 1e-5

        state, past, steps = model.allocate_inference_cache(2), zeros, []
        for t in range(ids.shape[1]):
            logits, new = model.step(ids[:, t], state, past)
            state, past = append_kv(state, new, past), past + 1
            steps.append(logits)
        assert _max_err(torch.stack(steps, 1), ref) <= 1e-5
        assert _states_err(state, ref_state, relative=True) <= 1e-5

        head, new = model(ids[:, :9], scan=partial(ssd_chunked, chunk=4))
        mid = append_kv(model.allocate_inference_cache(2), new, zeros)
        tail, new = model(ids[:, 9:], mid, torch.full((2,), 9), scan=partial(ssd_chunked, chunk=4))
        assert _max_err(torch.cat([head, tail], 1), ref) <= 1e-5
        assert _states_err(append_kv(mid, new, torch.full((2,), 9)), ref_state, relative=True) <= 1e-5
    # attention layers return only the new positions; the state handed in is never written
    assert ref_new[0][0].shape == (2, 2, 21, 16) and new[0][0].shape == (2, 2, 12, 16)
    assert ref_new[2] == () and ref.dtype == torch.float32 and ref.shape == (2, 21, VOCAB)
    assert all(not s.any() for layer in model.allocate_inference_cache(2) for s in layer)


@pytest.mark.parametrize("name", ["bamba", "nemotron_h"])
def test_rows_at_different_positions(tmp_path, name):
    """A batched step (and a 3-token continuation) over rows at different past_lengths equals each
    row alone; the slots past a row's length hold garbage and must not be read."""
    hf = _hf(name, seed=3)
    hf.save_pretrained(tmp_path)
    model = _load_ours(tmp_path)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, VOCAB, (1, n), generator=gen) for n in (5, 12, 1)]
    nxt = torch.randint(0, VOCAB, (3, 3), generator=gen)
    with torch.no_grad():
        alone = []
        for prompt in prompts:
            _, new = model(prompt, scan=partial(ssd_chunked, chunk=16))
            alone.append(append_kv(model.allocate_inference_cache(1), new, torch.zeros(1, dtype=torch.long)))
        capacity = 12

        def garbage_after(t):  # (1, nkv, P, hd) -> (1, nkv, capacity, hd), invalid slots far from zero
            pad = 50 * torch.randn(1, t.shape[1], capacity - t.shape[2], t.shape[3], generator=gen)
            return torch.cat([t, pad], dim=2)

        joint = []
        for layer, rows in zip(model.layers, zip(*alone, strict=True), strict=True):
            fill = garbage_after if layer.kind == "attention" else (lambda t: t)
            joint.append(tuple(torch.cat([fill(t) for t in parts]) for parts in zip(*rows, strict=True)))
        past = torch.tensor([5, 12, 1])

        logits, new = model.step(nxt[:, 0], joint, past)
        for r in range(3):
            want, _ = model.step(nxt[r:r + 1, 0], alone[r], past[r:r + 1])
            assert _max_err(logits[r], want[0]) <= 1e-5, r
        state = append_kv(joint, new, past)
        cont, _ = model(nxt[:, 1:], state, past + 1, scan=partial(ssd_chunked, chunk=16))
        for r in range(3):
            one = append_kv(alone[r], model.step(nxt[r:r + 1, 0], alone[r], past[r:r + 1])[1], past[r:r + 1])
            want, _ = model(nxt[r:r + 1, 1:], one, past[r:r + 1] + 1)
            assert _max_err(cont[r], want[0]) <= 1e-5, r


def test_append_kv_writes_at_each_rows_length():
    key = torch.arange(2 * 1 * 3 * 1, dtype=torch.float32).reshape(2, 1, 3, 1)
    new = -torch.ones(2, 1, 2, 1)
    out = append_kv([(key, key), (torch.zeros(2, 4, 3),)], [(new, new), (torch.ones(2, 4, 3),)],
                    torch.tensor([1, 3]))
    assert out[0][0].shape == (2, 1, 5, 1)
    assert out[0][0][0, 0, :, 0].tolist() == [0, -1, -1, 0, 0]  # row 0: slot 0 kept, 1-2 written, 3-4 grown
    assert out[0][0][1, 0, :, 0].tolist() == [3, 4, 5, -1, -1]
    assert torch.equal(out[1][0], torch.ones(2, 4, 3))  # a mamba2 state passes as it is
    assert key[0, 0, 1, 0] == 1  # nothing handed in is written
    with pytest.raises(ValueError, match="past_lengths"):
        append_kv([(key, key)], [(new, new)], torch.tensor([4, 0]))


# ---- refusals ----

def test_granite_experts_read_as_transformers_means_them():
    config = hybrid_config_from_json(_granite_moe().config.to_dict())
    assert (config.n_experts, config.experts_per_token, config.d_ff_expert, config.d_ff) == (6, 2, 48, 96)
    dense = hybrid_config_from_json(_granite(False).config.to_dict())
    assert dense.n_experts == 0 and all(layer.experts is None for layer in HybridLM(dense).layers)
    no_key = {k: v for k, v in _granite_moe().config.to_dict().items() if k != "num_local_experts"}
    assert hybrid_config_from_json(no_key).n_experts == 8  # transformers' default is 8 experts


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 7}, "experts_per_token=7 must be <= n_experts=6"),
    ({"num_local_experts": -1}, "num_local_experts=-1"),
    ({"num_local_experts": True}, "num_local_experts=True"),
    ({"num_experts_per_tok": 0}, "experts_per_token must be an int >= 1, got 0"),
])
def test_bad_expert_counts_are_refused_naming_them(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        hybrid_config_from_json({**_granite_moe().config.to_dict(), **change})


def test_nemotron_h_experts_read_as_transformers_means_them():
    config = hybrid_config_from_json(_nemotron_h_moe().config.to_dict())
    assert config.layer_types == ["mamba2", "moe", "attention", "mlp", "moe"] and not config.mlp_in_layer
    assert (config.n_experts, config.experts_per_token, config.d_ff_expert, config.d_ff_shared_expert) == (8, 3, 32, 48)
    assert (config.expert_routing, config.n_expert_groups, config.expert_groups_per_token) == ("sigmoid", 4, 2)
    assert config.routed_scaling_factor == 2.5 and config.normalize_expert_weights and config.mlp_act == "relu2"
    pattern = {k: v for k, v in _nemotron_h_moe().config.to_dict().items() if k != "layers_block_type"}
    assert hybrid_config_from_json({**pattern, "hybrid_override_pattern": "ME*-E"}) == config
    with pytest.raises(ValueError, match="moe_latent_size=16"):
        hybrid_config_from_json({**_nemotron_h_moe().config.to_dict(), "moe_latent_size": 16})
    with pytest.raises(ValueError, match="cannot hold experts_per_token=5"):
        hybrid_config_from_json({**_nemotron_h_moe().config.to_dict(), "num_experts_per_tok": 5})


_BAMBA = {"model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "mamba_n_heads": 8}


@pytest.mark.parametrize("config, key", [
    ({**_BAMBA, "hidden_act": "gelu"}, "hidden_act"),
    ({**_BAMBA, "attn_layer_indices": [2]}, "attn_layer_indices"),
    ({**_BAMBA, "mamba_d_head": 4}, "mamba_d_head"),
    ({**_BAMBA, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type"),
    # an older config.json's scaling, which transformers 5 reads into rope_parameters
    ({"model_type": "falcon_h1", "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type='linear'"),
    ({**_BAMBA, "mamba_n_groups": 3}, "ngroups"),
    ({"model_type": "granitemoehybrid", "num_local_experts": 0, "position_embedding_type": "alibi"},
     "position_embedding_type"),
    ({"model_type": "nemotron_h", "layers_block_type": ["mamba2"]}, "layers_block_type"),
    ({"model_type": "nemotron_h", "layers_block_type": ["mlp"], "mlp_hidden_act": "silu"}, "mlp_hidden_act"),
    ({"model_type": "jamba", "expert_layer_offset": 2}, "expert_layer_offset=2"),
    ({"model_type": "jamba", "num_experts": 1, "attn_layer_offset": 8}, "attn_layer_offset=8"),
    ({"model_type": "jamba", "num_experts": 1, "hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "falcon_h1", "mamba_proj_bias": True}, "projectors_bias"),
    ({"model_type": "falcon_h1", "mamba_d_ssm": 1000}, "mamba_d_ssm"),
    ({"model_type": "falcon_h1", "lm_head_multiplier": 0}, "lm_head_multiplier"),
    ({"model_type": "falcon_h1", "ssm_multipliers": [1.0, 1.0]}, "ssm_multipliers"),
    ({"model_type": "falcon_h1", "mlp_multipliers": [1.0, "x"]}, r"mlp_multipliers\[1\]"),
    ({"model_type": "lfm2", "num_hidden_layers": 2, "layer_types": ["conv", "sliding_attention"]}, "layer_types"),
    ({"model_type": "lfm2", "num_hidden_layers": 2, "full_attn_idxs": [2]}, "full_attn_idxs"),
    ({"model_type": "lfm2", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type='yarn'"),
    ({"model_type": "lfm2", "block_multiple_of": 0}, "block_multiple_of"),
    ({"model_type": "lfm2", "conv_L_cache": 0}, "short_conv_kernel"),
    ({"model_type": "lfm2_moe"}, "no 'layer_types'"),
    ({"model_type": "lfm2_moe", "num_hidden_layers": 2, "layer_types": ["conv"] * 2, "num_dense_layers": 3},
     "num_dense_layers"),
    ({"model_type": "qwen3_5_text", "num_hidden_layers": 2, "layer_types": ["linear_attention", "sliding_attention"]},
     "layer_types"),
    ({"model_type": "qwen3_5_text", "full_attention_interval": 0}, "full_attention_interval"),
    ({"model_type": "qwen3_5_text", "hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "qwen3_5_text", "linear_num_key_heads": 3}, "delta_k_heads=3"),
    ({"model_type": "qwen3_5_text", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7}}, "rope_type='yarn'"),
    ({"model_type": "qwen3_5", "text_config": None}, "text_config"),
    ({"model_type": "qwen3_next", "decoder_sparse_step": 0}, "decoder_sparse_step=0"),
    ({"model_type": "qwen3_next", "mlp_only_layers": "3"}, "mlp_only_layers='3'"),
    ({"model_type": "minimax"}, "model_type='minimax'"),
    ({"model_type": "kimi_linear", "hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "kimi_linear", "mla_use_nope": False}, "mla_use_nope"),
    ({"model_type": "kimi_linear", "moe_router_activation_func": "softmax"}, "moe_router_activation_func"),
    ({"model_type": "kimi_linear", "num_hidden_layers": 2, "layer_types": ["linear_attention", "sliding_attention"]},
     "layer_types"),
    ({"model_type": "kimi_linear", "num_hidden_layers": 2, "mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types"),
    ({"model_type": "kimi_linear", "num_hidden_layers": 2, "linear_attn_config": {"full_attn_layers": [0],
                                                                                   "kda_layers": [2]}},
     r"linear_attn_config.full_attn_layers holds 0"),
    ({"model_type": "kimi_linear", "first_k_dense_replace": -1}, "first_k_dense_replace"),
    ({"model_type": "kimi_linear", "num_shared_experts": 1.5}, "num_shared_experts"),
    ({"model_type": "kimi_linear", "q_lora_rank": 0}, "mla_q_rank"),
    ({"model_type": "bailing_hybrid", "kda_safe_gate": "yes"}, "kda_safe_gate"),
    ({"model_type": "bailing_hybrid", "hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "bailing_hybrid", "layer_group_size": 0}, "layer_group_size"),
    ({"model_type": "bailing_hybrid", "kda_lower_bound": 1.0}, "kda_gate_lower_bound"),
    ({"model_type": "bailing_hybrid", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type='yarn'"),
    ({"model_type": "bailing_hybrid", "num_hidden_layers": 2, "swiglu_limits": [0, -7]}, "expert_swiglu_limit_list"),
    ({"model_type": "bailing_hybrid", "num_hidden_layers": 2, "share_expert_swiglu_limit_list": [7]},
     "share_expert_swiglu_limit_list"),
    ({"model_type": "olmo_hybrid", "hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "zamba2", "rms_norm_eps": 1e-6}, "rms_norm_eps"),
    ({"model_type": "zamba2", "hidden_act": "relu"}, "hidden_act"),
    ({"model_type": "zamba2", "use_mem_rope": True, "use_long_context": True}, "use_long_context"),
    ({"model_type": "zamba2", "n_mamba_heads": 7}, "n_mamba_heads=7"),
    ({"model_type": "zamba2", "num_hidden_layers": 2, "layers_block_type": ["mamba", "attention"]},
     "layers_block_type"),
    ({"model_type": "olmo_hybrid", "num_hidden_layers": 2, "layer_types": ["linear_attention", "sliding_attention"]},
     "layer_types"),
    ({"model_type": "olmo_hybrid", "linear_allow_neg_eigval": "yes"}, "linear_allow_neg_eigval"),
    ({"model_type": "qwen3_5_moe", "text_config": [1]}, "qwen3_5_moe config's text_config"),
    ({"family": "hybrid", "d_modle": 64}, "d_modle"),
])
def test_config_refusals_name_the_key(config, key):
    with pytest.raises(ValueError, match=key):
        hybrid_config_from_json(config)


@pytest.mark.parametrize("field, value", [
    ("layer_types", ["mamba2", "moe"]), ("layer_types", []), ("n_kv_heads", 3), ("mlp_act", "gelu"),
    ("partial_rotary_factor", 0.1), ("ngroups", 3), ("dt_max_limit", math.inf), ("logits_scaling", 0),
    ("attention_multiplier", -1.0), ("d_model", 0), ("rope", 1), ("layer_types", ["hybrid"]),
    ("ssm_multipliers", [1.0] * 4), ("key_multiplier", math.nan), ("mamba_gated_norm", "yes"),
    ("delta_k_heads", 3), ("delta_v_dim", 0), ("attention_output_gate", 1), ("qk_norm_across_heads", 1),
    ("attention_post_norm", "yes"), ("delta_negative_eigenvalues", 0), ("delta_norm_eps", 0.0),
    ("shared_blocks", 0), ("shared_adapter_rank", -1), ("shared_attention_adapters", 1),
    ("mlp_act", "gelu"), ("expert_swiglu_limits", [1.0]), ("expert_swiglu_limits", [0, -1, 0]),
    ("expert_swiglu_limits", [0, math.inf, 0]), ("shared_swiglu_limits", [0, True, 0]),
    ("expert_swiglu_limits", "7"),
])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        HybridConfig(**{field: value})


def test_convert_state_dict_refusals(tmp_path):
    hf = _nemotron_h()
    config = hybrid_config_from_json(hf.config.to_dict())
    sd = {f"backbone.{k.removeprefix('model.')}": v for k, v in hf.state_dict().items()}
    assert set(convert_state_dict(sd, config)) == set(HybridLM(config).state_dict())
    # a missing tensor is named as the checkpoint names it, then as ours
    with pytest.raises(ValueError, match=r"lacks \['backbone.layers.3.mixer.dt_bias \(layers.3.mixer.dt_bias\)'\]"):
        convert_state_dict({k: v for k, v in sd.items() if k != "backbone.layers.3.mixer.dt_bias"}, config)
    for name, theirs, ours in (("falcon_h1", "model.layers.1.mamba.D", "layers.1.mixer.D"),
                               ("falcon_h1", "model.layers.0.self_attn.k_proj.weight", "layers.0.attention.k_proj.weight"),
                               ("lfm2", "model.layers.1.conv.conv.bias", "layers.1.mixer.conv.bias"),
                               ("lfm2", "model.layers.2.feed_forward.w3.weight", "layers.2.mlp.up_proj.weight"),
                               ("lfm2", "model.layers.0.self_attn.q_layernorm.weight", "layers.0.mixer.q_norm.weight"),
                               ("qwen3_5", "model.layers.2.linear_attn.in_proj_qkv.weight", "layers.2.mixer.in_proj.weight"),
                               ("qwen3_5", "model.layers.0.linear_attn.A_log", "layers.0.mixer.A_log")):
        model = HF_MODELS[name]()
        state = {k: v for k, v in model.state_dict().items() if k != theirs}
        with pytest.raises(ValueError, match=rf"lacks \['{re.escape(theirs)} \({re.escape(ours)}\)'\]"):
            convert_state_dict(state, hybrid_config_from_json(model.config.to_dict()))
    with pytest.raises(ValueError, match="backbone.layers.2.mixer.experts.0.up_proj.weight"):
        convert_state_dict({**sd, "backbone.layers.2.mixer.experts.0.up_proj.weight": torch.zeros(1)}, config)
    granite = _granite(True)
    gconfig = hybrid_config_from_json(granite.config.to_dict())
    gsd = dict(granite.state_dict())
    gsd["model.layers.0.shared_mlp.input_linear.weight"] = torch.zeros(96, 64)
    with pytest.raises(ValueError, match="input_linear"):
        convert_state_dict(gsd, gconfig)
    moe = _granite_moe()
    mconfig = hybrid_config_from_json(moe.config.to_dict())
    msd = dict(moe.state_dict())  # transformers 5's names in memory (experts.gate_up_proj, router.weight)
    assert set(convert_state_dict(msd, mconfig)) == set(HybridLM(mconfig).state_dict())
    dense = hybrid_config_from_json({**moe.config.to_dict(), "num_local_experts": 0})
    with pytest.raises(ValueError, match="no place for: .*model.layers.0.block_sparse_moe"):
        convert_state_dict(msd, dense)
    nemo = _nemotron_h_moe()
    nconfig = hybrid_config_from_json(nemo.config.to_dict())
    nemo.save_pretrained(tmp_path / "nemo")
    saved = load_file(tmp_path / "nemo" / "model.safetensors")  # one tensor per expert, as saved
    assert "backbone.layers.1.mixer.experts.7.up_proj.weight" in saved
    assert set(convert_state_dict(saved, nconfig)) == set(HybridLM(nconfig).state_dict())
    with pytest.raises(ValueError, match="layers.4.mixer.experts holds down_proj .* missing \\[5\\]"):
        convert_state_dict({k: v for k, v in saved.items() if k != "backbone.layers.4.mixer.experts.5.down_proj.weight"},
                           nconfig)


@pytest.mark.parametrize("expert_bias", [True, False])
def test_lfm2_moe_experts_read_as_saved_and_as_held(tmp_path, expert_bias):
    """LFM2-MoE's experts as saved (one w1 / w3 / w2 each) and as transformers holds them in
    memory (stacked gate_up_proj / down_proj) load to the same model, which gives transformers'
    logits; without `use_expert_bias` the experts are chosen by their scores alone."""
    torch.manual_seed(0)
    hf = _randomize(transformers.Lfm2MoeForCausalLM(transformers.Lfm2MoeConfig(
        **{**_lfm2_moe().config.to_dict(), "use_expert_bias": expert_bias})), 0)
    hf.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "model.layers.1.feed_forward.experts.5.w3.weight" in saved
    config = hybrid_config_from_json(json.loads((tmp_path / "config.json").read_text()))
    as_saved, as_held = convert_state_dict(saved, config), convert_state_dict(dict(hf.state_dict()), config)
    assert as_saved.keys() == as_held.keys() and all(torch.equal(as_saved[k], as_held[k]) for k in as_saved)
    ours = HybridLM(config).eval()
    ours.load_state_dict(as_saved, strict=True)
    ids = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert _max_err(ours(ids)[0], hf(ids).logits) < 1e-4
    # the router's weights as its own router makes them (normalised with its + 1e-6), to float32's last bits
    h = torch.randn(64, 64, generator=torch.Generator().manual_seed(2))
    bias = hf.model.layers[1].feed_forward.expert_bias if expert_bias else None
    _, want_weights, want_experts = hf.model.layers[1].feed_forward.gate(h, bias)
    weights, experts = ours.layers[1].experts.route(h)
    assert torch.equal(experts, want_experts)
    torch.testing.assert_close(weights, want_weights, atol=2e-7, rtol=0)
    with pytest.raises(ValueError, match=r"layer 2's MoE block holds 17 of the 18 expert weights w1 / w3 / w2 "
                                         r"of experts 0 \.\. 5 \(num_experts\); missing \['experts.4.w2.weight'\]"):
        convert_state_dict({k: v for k, v in saved.items() if k != "model.layers.2.feed_forward.experts.4.w2.weight"},
                           config)


def test_a_steps_weight_floor_counts_only_the_experts_a_token_takes(tmp_path):
    """`seqexport bench`'s bound for an MoE hybrid: the bytes of the weights one step's output
    depends on, found by a gradient (an expert a token did not take gets none), equal what the
    bench counts; the dense model's floor is every weight."""
    from seqexport.families.hybrid.bench import step_weight_bytes

    for name in ("granite-moe", "granite-rope"):
        _hf(name, 0).save_pretrained(tmp_path / name)
        ours = _load_ours(tmp_path / name)
        logits, _ = ours.step(torch.tensor([7]), ours.allocate_inference_cache(1), torch.zeros(1, dtype=torch.long))
        logits.sum().backward()
        used = 0
        for name, p in ours.named_parameters():
            if name.startswith("embed_tokens.") or p.grad is None:
                continue
            if p.dim() == 3 and "experts." in name:  # count the experts (slices) that got a gradient
                used += sum(p[e].numel() for e in range(p.shape[0]) if p.grad[e].abs().sum() > 0)
            else:
                used += p.numel()
        assert step_weight_bytes(ours, "float32") == 4 * used, name


@pytest.mark.parametrize("tied", [True, False])
def test_qwen3_5_image_text_checkpoint_gives_its_text_model(tmp_path, tied):
    """Qwen3.5's checkpoints are `Qwen3_5ForConditionalGeneration`: the text model under
    `model.language_model.`, a vision tower (not read: text in, text out) and the head tied by
    the top-level `tie_word_embeddings` (the text_config's says otherwise here). On text alone its
    logits are ours."""
    text = _qwen3_5().config.to_dict()
    torch.manual_seed(0)
    vl = _randomize(transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(
        text_config={**text, "tie_word_embeddings": not tied}, tie_word_embeddings=tied,
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64))), 3)
    vl.save_pretrained(tmp_path)
    ours = _load_ours(tmp_path)
    assert ours.config.tie_embeddings == tied and ours.config.layer_types == hybrid_config_from_json(text).layer_types
    ids = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = vl(input_ids=ids).logits.float()
        got, _ = ours(ids)
    assert _max_err(got, want) <= 1e-4


def test_qwen3_5_layers_without_layer_types_are_those_transformers_derives():
    """A config.json without `layer_types` (every `full_attention_interval`-th layer attends, 4
    unless given): read as transformers' Qwen3_5TextConfig derives them."""
    for interval in (None, 3):
        fields = {"num_hidden_layers": 7, **({"full_attention_interval": interval} if interval else {})}
        theirs = transformers.Qwen3_5TextConfig(**fields).layer_types
        ours = hybrid_config_from_json({"model_type": "qwen3_5_text", **fields}).layer_types
        assert ours == ["attention" if t == "full_attention" else "deltanet" for t in theirs]
        assert ours.count("attention") == 7 // (interval or 4)


def test_qwen3_next_fused_projections_read_apart_and_a_wrong_one_is_named(tmp_path):
    """Qwen3-Next's `in_proj_qkvz` / `in_proj_ba` as saved read into our separate projections
    (the parity test checks the numbers); one of the wrong size is refused naming it and the
    shape the config implies."""
    hf = _hf("qwen3_next", 0)
    hf.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    config = hybrid_config_from_json(json.loads((tmp_path / "config.json").read_text()))
    assert config.expert_layers == [1] and config.d_ff == 80 and not config.normalize_expert_weights
    ours = convert_state_dict(saved, config)
    assert "layers.0.mixer.in_proj_qkvz.weight" not in ours and ours["layers.0.mixer.z_proj.weight"].shape == (64, 64)
    bad = dict(saved)
    bad["model.layers.2.linear_attn.in_proj_ba.weight"] = bad["model.layers.2.linear_attn.in_proj_ba.weight"][:-1]
    with pytest.raises(ValueError, match=r"model.layers.2.linear_attn.in_proj_ba.weight has shape \(7, 64\); "
                                         r"expected \(2 key heads x 4, hidden_size\)"):
        convert_state_dict(bad, config)


def test_olmo_hybrid_read_as_saved_and_as_held_and_a_missing_piece_is_named(tmp_path):
    """OLMo-hybrid as saved (OLMo-core's names: `attention_layer_norm`, `feedforward_layer_norm`,
    the DeltaNet's conv split into q/k/v_conv1d, as transformers' save splits it or as OLMo-core
    sizes it) and as transformers holds it in memory (`input_layernorm`,
    `post_attention_layernorm`, one `conv1d`) load to the same weights; a piece missing is named
    as saved."""
    hf = _hf("olmo_hybrid", 0)
    hf.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "model.layers.0.linear_attn.q_conv1d.weight" in saved and "model.layers.1.feedforward_layer_norm.weight" in saved
    config = hybrid_config_from_json(json.loads((tmp_path / "config.json").read_text()))
    held = convert_state_dict(hf.state_dict(), config)
    assert set(held) == set(HybridLM(config).state_dict())
    for key, value in convert_state_dict(saved, config).items():
        assert torch.equal(value, held[key]), key
    # OLMo-core's own split: q and k key_dim rows each, v value_dim
    conv = hf.state_dict()["model.layers.2.linear_attn.conv1d.weight"]
    core = {k: v for k, v in saved.items() if not k.startswith("model.layers.2.linear_attn.") or "conv1d" not in k}
    for name, part in zip("qkv", conv.split([48, 48, 64]), strict=True):
        core[f"model.layers.2.linear_attn.{name}_conv1d.weight"] = part
    assert torch.equal(convert_state_dict(core, config)["layers.2.mixer.conv1d.weight"], held["layers.2.mixer.conv1d.weight"])
    for missing in ("model.layers.3.linear_attn.k_conv1d.weight", "model.layers.0.linear_attn.v_proj.weight"):
        with pytest.raises(ValueError, match=rf"lacks \['{re.escape(missing)}'\]"):
            convert_state_dict({k: v for k, v in saved.items() if k != missing}, config)


def test_kimi_linear_read_as_saved_and_as_held_and_a_missing_piece_is_named(tmp_path):
    """Kimi-Linear as saved (Moonshot's names: the KDA's forget gate's weights directly under
    `self_attn`, its conv split into q/k/v_conv1d, `block_sparse_moe` with one tensor per expert
    w1 / w3 / w2, `A_log` (1, 1, h, 1); its dense MLP under `mlp` as published or under
    `block_sparse_moe` as transformers' save writes it) and as transformers holds it in memory
    (`forget_gate.`, one `conv1d`, stacked experts) load to the same weights; a piece missing is
    named as saved."""
    hf = _hf("kimi_linear", 0)
    hf.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "model.layers.0.self_attn.q_conv1d.weight" in saved and "model.layers.2.block_sparse_moe.experts.7.w3.weight" \
        in saved and saved["model.layers.0.self_attn.A_log"].shape == (1, 1, 4, 1)
    config = hybrid_config_from_json(json.loads((tmp_path / "config.json").read_text()))
    assert config.layer_types == ["kda", "mla", "kda", "kda", "mla"] and config.expert_layers == [1, 2, 3, 4]
    held = convert_state_dict(hf.state_dict(), config)
    assert set(held) == set(HybridLM(config).state_dict())
    published = {k.replace("layers.0.block_sparse_moe.", "layers.0.mlp."): v for k, v in saved.items()}
    for layout in (saved, published):
        for key, value in convert_state_dict(layout, config).items():
            assert torch.equal(value, held[key]), key
    for missing in ("model.layers.3.self_attn.k_conv1d.weight", "model.layers.0.self_attn.v_proj.weight"):
        with pytest.raises(ValueError, match=rf"lacks \['{re.escape(missing)}'\]"):
            convert_state_dict({k: v for k, v in saved.items() if k != missing}, config)
    with pytest.raises(ValueError, match=r"experts 0 \.\. 7 .*missing \['experts\.5\.w2\.weight'\]"):
        convert_state_dict({k: v for k, v in saved.items() if k != "model.layers.2.block_sparse_moe.experts.5.w2.weight"},
                           config)


def test_kimi_linear_config_reads_as_transformers_derives_it():
    """Moonshot's published config.json form (`linear_attn_config` with 1-indexed
    `full_attn_layers` / `kda_layers`, its head size, heads and conv; `first_k_dense_replace`;
    `num_experts_per_token`, `num_shared_experts`) and a config without layer lists read as
    KimiLinearConfig derives them."""
    published = {"hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4, "vocab_size": VOCAB,
                 "linear_attn_config": {"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7], "head_dim": 24,
                                        "num_heads": 2, "short_conv_kernel_size": 3},
                 "first_k_dense_replace": 2, "num_experts": 8, "num_experts_per_token": 3, "num_shared_experts": 2,
                 "moe_intermediate_size": 16, "mla_use_nope": True, "moe_router_activation_func": "sigmoid"}
    for fields in (published, {k: v for k, v in published.items() if k not in ("linear_attn_config",
                                                                                  "first_k_dense_replace")}):
        theirs = transformers.KimiLinearConfig(**fields, pad_token_id=None, bos_token_id=None, eos_token_id=None)
        ours = hybrid_config_from_json({"model_type": "kimi_linear", **fields})
        assert ours.layer_types == ["mla" if t == "full_attention" else "kda" for t in theirs.layer_types]
        assert ours.expert_layers == [i for i, t in enumerate(theirs.mlp_layer_types) if t == "sparse"]
        assert (ours.delta_v_heads, ours.delta_k_dim, ours.d_conv) == (
            theirs.linear_num_heads, theirs.linear_head_dim, theirs.linear_conv_kernel_dim)
        assert (ours.n_experts, ours.experts_per_token, ours.d_ff_shared_expert) == (
            theirs.num_local_experts, theirs.num_experts_per_tok, 16 * theirs.n_shared_experts)
    assert hybrid_config_from_json({"model_type": "kimi_linear", **published}).layer_types == \
        ["kda"] * 3 + ["mla"] + ["kda"] * 3 + ["mla"]


def test_ling3_read_as_saved_and_as_held_its_mtp_layer_left_out(tmp_path):
    """Ling 3 as saved (its own names: `word_embeddings`, `attention` with `dense` for o_proj, the
    forget gate's f_proj / dt_bias / A_log under it, q/k/v_conv1d, `gate.expert_bias`, one
    tensor per expert) and as transformers holds it load to the same weights; a multi-token-
    prediction layer saved after the last (`model.layers.{num_hidden_layers}`, which
    transformers does not load) is left out; a missing piece is named as saved."""
    hf = _hf("ling3", 0)
    hf.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "model.word_embeddings.weight" in saved and "model.layers.0.attention.k_conv1d.weight" in saved
    config = hybrid_config_from_json(json.loads((tmp_path / "config.json").read_text()))
    assert config.layer_types == ["kda", "kda", "mla"] * 2 and config.rope and config.head_dim == 8
    held = convert_state_dict(hf.state_dict(), config)
    assert set(held) == set(HybridLM(config).state_dict())
    mtp = {f"model.layers.6.{k.split('.', 3)[3]}": v for k, v in saved.items() if k.startswith("model.layers.2.")}
    for layout in (saved, {**saved, **mtp}):
        for key, value in convert_state_dict(layout, config).items():
            assert torch.equal(value, held[key]), key
    for missing in ("model.layers.3.attention.q_conv1d.weight", "model.layers.2.attention.g_proj.weight"):
        with pytest.raises(ValueError, match=rf"lacks \['{re.escape(missing)}"):
            convert_state_dict({k: v for k, v in saved.items() if k != missing}, config)


def test_ling3_config_reads_as_transformers_derives_it():
    """A config.json without layer lists (attention every `layer_group_size`-th layer, dense MLPs
    below `first_k_dense_replace`), its published `head_dim` the KDA heads' size, RoPE on the
    latent attention's `qk_rope_head_dim` dims at `rope_theta`; the SwiGLU limits as transformers
    holds them (none: not clipped)."""
    fields = {"hidden_size": 64, "num_hidden_layers": 7, "num_attention_heads": 4, "vocab_size": VOCAB,
              "head_dim": 24, "qk_rope_head_dim": 8, "layer_group_size": 3, "first_k_dense_replace": 3,
              "rope_theta": 1000.0, "kda_lower_bound": -3.0, "num_experts": 8, "num_expert_group": 2,
              "topk_group": 1, "num_experts_per_tok": 2}
    theirs = transformers.BailingHybridConfig(**fields, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    ours = hybrid_config_from_json({"model_type": "bailing_hybrid", **fields})
    assert ours.layer_types == ["mla" if t == "full_attention" else "kda" for t in theirs.layer_types]
    assert ours.expert_layers == [i for i, t in enumerate(theirs.mlp_layer_types) if t == "sparse"] == [3, 4, 5, 6]
    assert (ours.delta_v_heads, ours.delta_k_dim, ours.d_conv) == (
        theirs.linear_num_heads, theirs.linear_head_dim, theirs.linear_conv_kernel_dim) == (4, 24, 4)
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 1000.0 and ours.rotary_dim == 8
    assert ours.kda_gate_lower_bound == -3.0 and not ours.kda_low_rank_gates and ours.attention_head_gate
    assert hybrid_config_from_json({"model_type": "bailing_hybrid", **fields, "kda_safe_gate": False}
                                   ).kda_gate_lower_bound is None
    assert ours.expert_swiglu_limits is ours.shared_swiglu_limits is None
    assert theirs.swiglu_limits == theirs.swiglu_limits_shared == [0] * 7
    limits = {"expert_swiglu_limit_list": [0, 0, 0, 7.0, 0, 0, 5], "share_expert_swiglu_limit_list": [0] * 6 + [4]}
    theirs = transformers.BailingHybridConfig(**fields, **limits, pad_token_id=None, bos_token_id=None,
                                              eos_token_id=None)
    ours = hybrid_config_from_json({"model_type": "bailing_hybrid", **fields, **limits})
    assert ours.expert_swiglu_limits == theirs.swiglu_limits and ours.shared_swiglu_limits == theirs.swiglu_limits_shared


@torch.no_grad()
def test_swiglu_clipping_bites_and_follows_transformers(tmp_path):
    """Ling 3's clipped SwiGLU: with its limits our model gives transformers' logits, and without
    them both give logits far from those (the limits the tests use clip; a model that ignored
    them would fail the parity tests of `ling3-clipped`); a dense layer's limit clips nothing."""
    hf = _hf("ling3-clipped", 0)
    hf.save_pretrained(tmp_path / "clipped")
    ours = _load_ours(tmp_path / "clipped")
    assert ours.config.expert_swiglu_limits == [0.2, 0, CLIP, 0, CLIP]
    assert [layer.experts.limit if layer.experts else None for layer in ours.layers] == [None, 0, CLIP, 0, CLIP]
    assert [layer.shared.limit if layer.experts else None for layer in ours.layers] == [None, CLIP, 0, 0, CLIP]
    prompt = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    want = hf(prompt).logits
    assert (ours(prompt)[0] - want).abs().max() < 1e-4
    config = json.loads((tmp_path / "clipped" / "config.json").read_text())
    config.pop("expert_swiglu_limit_list"), config.pop("share_expert_swiglu_limit_list")
    (tmp_path / "clipped" / "config.json").write_text(json.dumps(config))
    unclipped = transformers.BailingHybridForCausalLM.from_pretrained(tmp_path / "clipped")(prompt).logits
    assert (unclipped - want).abs().max() > 0.5
    assert (_load_ours(tmp_path / "clipped")(prompt)[0] - unclipped).abs().max() < 1e-4
    with pytest.raises(ValueError, match="expert_swiglu_limits clips a gated SiLU"):  # (Nemotron-H's experts)
        HybridConfig(n_experts=4, mlp_act="relu2", expert_swiglu_limits=[0, 1, 0])


def test_olmo_hybrid_config_without_derived_keys_reads_as_transformers_derives_them():
    """A config.json without layer_types or the DeltaNet's sizes: read as OlmoHybridConfig
    derives them (every 4th layer attends, the last when none would; heads and head sizes from
    num_attention_heads and hidden_size); no rope_parameters is RoPE at theta 10000 in their
    model, and rope_theta null none."""
    for layers in (3, 8):
        fields = {"hidden_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4, "vocab_size": VOCAB}
        theirs = transformers.OlmoHybridConfig(**fields, pad_token_id=None, eos_token_id=None)
        ours = hybrid_config_from_json({"model_type": "olmo_hybrid", **fields})
        assert ours.layer_types == ["attention" if t == "full_attention" else "deltanet" for t in theirs.layer_types]
        assert (ours.delta_k_heads, ours.delta_v_heads, ours.delta_k_dim, ours.delta_v_dim) == (
            theirs.linear_num_key_heads, theirs.linear_num_value_heads, theirs.linear_key_head_dim,
            theirs.linear_value_head_dim)
        assert ours.rope and ours.rope_theta == theirs.rope_parameters["rope_theta"] == 10000.0
        assert ours.delta_negative_eigenvalues == theirs.linear_allow_neg_eigval is True
    nope = hybrid_config_from_json({"model_type": "olmo_hybrid", "rope_parameters": {"rope_theta": None}})
    assert not nope.rope and nope.delta_norm_eps == 1e-5 and nope.attention_post_norm and nope.qk_norm_across_heads


def test_lfm3_config_reads_as_transformers_derives_it():
    """A config.json with nothing but sizes: Lfm3Config's own layers (attention at i % 4 == 2,
    sliding at i % 4 == 0 past 0), RoPE per kind (sliding: theta 1e4 over the whole head; full:
    proportional, theta 1e6, half the pairs turning: its frequencies equal theirs), window 256,
    sandwich norms and head gates on, tied."""
    from seqexport.models.hybrid import rope_frequencies
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fields = {"hidden_size": 64, "num_hidden_layers": 9, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "vocab_size": VOCAB}
    theirs = transformers.Lfm3Config(**fields, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    ours = hybrid_config_from_json({"model_type": "lfm3", **fields})
    assert ours.layer_types == ["conv" if t == "conv" else "attention" for t in theirs.layer_types]
    assert ours.sliding_window_layers == [i for i, t in enumerate(theirs.layer_types) if t == "sliding_attention"]
    assert ours.sliding_window == theirs.sliding_window == 256 and ours.sliding_rope_theta == 1e4
    full, _ = ROPE_INIT_FUNCTIONS["proportional"](theirs, layer_type="full_attention")
    assert ours.rope_proportional and torch.equal(rope_frequencies(ours), full)
    assert ours.sandwich_norm and ours.attention_head_gate and ours.tie_embeddings and ours.short_conv_kernel == 7
    with pytest.raises(ValueError, match="holds every attention layer"):  # (refused, not exported wrong)
        hybrid_config_from_json({"model_type": "lfm3", **fields, "num_hidden_layers": 2,
                                 "layer_types": ["conv", "sliding_attention"]})


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["conv", "local_attention"], "num_hidden_layers": 2}, "layer_types"),
    ({"sliding_window": 0}, "sliding_window=0"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     r"rope_parameters\['full_attention'\].rope_type='yarn'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "proportional", "rope_theta": 1e4}}},
     r"rope_parameters\['sliding_attention'\].rope_type='proportional'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, r"rope_parameters\['full_attention'\]=None"),
    ({"rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "factor": 2.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "factor=2.0"),
    ({"use_sandwich_norm": "yes"}, "use_sandwich_norm"),
])
def test_lfm3_refusals_name_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        hybrid_config_from_json({"model_type": "lfm3", "num_hidden_layers": 5, **change})


@pytest.mark.parametrize("fields, name", [
    ({"layer_types": ["conv", "attention"], "sliding_window_layers": [0]}, "sliding_window_layers"),
    ({"layer_types": ["attention"], "sliding_window_layers": [1]}, "sliding_window_layers"),
    ({"layer_types": ["conv", "attention"], "sliding_window_layers": [1]}, "holds every attention layer"),
    ({"sliding_window": 0}, "sliding_window"), ({"sliding_rope_theta": -1.0}, "sliding_rope_theta"),
    ({"rope_proportional": True, "partial_rotary_factor": 0.1}, "rope_proportional"),
    ({"sandwich_norm": 1}, "sandwich_norm"), ({"attention_head_gate": "no"}, "attention_head_gate"),
    ({"mlp_act": "gelu_gated", "n_experts": 2, "experts_per_token": 1}, "no experts form"),
    ({"layer_types": ["zamba", "mamba2"]}, "expected mlp_in_layer=False"),
])
def test_window_and_rope_fields_are_checked(fields, name):
    with pytest.raises(ValueError, match=name):
        HybridConfig(**fields)


def test_zamba2_shared_blocks_read_as_published_and_untied_copies_are_named(tmp_path):
    """Zamba2's shared blocks as a published checkpoint saves them (once, under the first hybrid
    layer of each block, with every hybrid layer's adapters there) and as transformers holds them
    (a copy under every hybrid layer) load to the same weights; copies that differ are refused
    naming both keys (they would be two models)."""
    hf = _hf("zamba2", 0)
    config = hybrid_config_from_json(hf.config.to_dict())
    held = convert_state_dict(hf.state_dict(), config)
    assert set(held) == set(HybridLM(config).state_dict())
    published = {k: v for k, v in hf.state_dict().items() if not k.startswith("model.layers.4.shared_transformer.")
                 or "adapter_list.2." in k}  # layer 4 calls block 0 again: only its adapters of its own
    moved = {k.replace("layers.4.", "layers.1.") if "adapter_list.2." in k else k: v for k, v in published.items()}
    for key, value in convert_state_dict(moved, config).items():
        assert torch.equal(value, held[key]), key
    untied = dict(hf.state_dict())
    key = "model.layers.4.shared_transformer.self_attn.o_proj.weight"
    untied[key] = untied[key] + 1
    with pytest.raises(ValueError, match=rf"{re.escape(key)} and model.layers.1.shared_transformer.self_attn.o_proj"
                                         r".weight are the same weight"):
        convert_state_dict(untied, config)


def test_a_latent_attention_prefill_expands_its_new_positions_and_reads_its_past_in_the_latent():
    """A prefill's new positions meet each other through keys and values expanded per head
    (nope + rd and dv products a pair and head), not in the latent (2r + rd): counted by torch's
    own FLOP counter, the whole forward of 128 new positions costs less than the latent form's
    pair products alone. With 128 positions cached (read in the latent, as a step reads them) and
    without, it equals the plain attention over every head's expanded keys and values."""
    import torch.nn.functional as F
    from seqexport.models.hybrid import LatentAttention
    from torch.utils.flop_counter import FlopCounterMode

    config = HybridConfig(layer_types=["mla", "mlp"], d_model=32, n_heads=4, mla_kv_rank=64, mla_nope_dim=8,
                          mla_rope_dim=4, mla_v_dim=8, rope=False)  # (no positions: Kimi-Linear's)
    torch.manual_seed(0)
    mla = LatentAttention(config).eval()
    nh, r, nope, rd, dv, length = 4, 64, 8, 4, 8, 128

    def flops(past: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        x = torch.randn(1, length, 32)
        latent, rope = torch.randn(1, 1, past, r), torch.randn(1, 1, past, rd)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            out, _ = mla(x, latent, rope, torch.tensor([past]))
        # the reference: every head's keys [W_uk c; k_r] and values W_uv c, cached and new alike
        with torch.no_grad():
            q = mla.queries(x)  # (1, nh, l, nope + rd)
            c, k_r = mla.kv_a_proj(x).split([r, rd], dim=-1)
            c = torch.cat([latent[:, 0], mla.kv_a_norm(c)], dim=1)  # (1, P + l, r)
            k_r = torch.cat([rope[:, 0], k_r], dim=1)  # (1, P + l, rd)
            kv = mla.kv_b_proj(c).view(1, past + length, nh, nope + dv).transpose(1, 2)  # (1, nh, P + l, nope + dv)
            keys = torch.cat([kv[..., :nope], k_r[:, None].expand(1, nh, past + length, rd)], dim=-1)
            mask = torch.ones(length, past + length, dtype=torch.bool).tril(past)
            want = F.scaled_dot_product_attention(q, keys, kv[..., nope:], attn_mask=mask, scale=mla.scale)
            want = mla.o_proj(want.transpose(1, 2).reshape(1, length, nh * dv))
        return counter.get_total_flops(), out, want

    fresh, out, want = flops(0)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert fresh < 2 * length * length * nh * (2 * r + rd)  # below the latent form's pair products alone
    # exactly: the pairs' products, and per position its projections (queries, latent and shared
    # key part, queries into the latent, keys; values, the past's weighted latents through W_uv;
    # output), 2 flops a multiply-add
    per_position = 32 * nh * (nope + rd) + 32 * (r + rd) + 2 * nh * nope * r + 2 * nh * dv * r + nh * dv * 32
    assert fresh == 2 * length * length * nh * (nope + rd + dv) + 2 * length * per_position
    _, out, want = flops(128)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
