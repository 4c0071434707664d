"""Presets of the hybrid family: `tiny`; `bamba-9b`, the published shape of IBM's Bamba-9B
(ibm-fms/Bamba-9.8b-2.2T-hf, ibm-ai-platform/Bamba-9B); and `falcon-h1-tiny`, the shape of TII's
Falcon-H1-Tiny-90M (tiiuae/Falcon-H1-Tiny-90M-Base); `lfm2-350m`, the shape of Liquid AI's LFM2-350M (LiquidAI/LFM2-350M); and
`lfm2-8b-a1b`, the shape of its mixture of experts LFM2-8B-A1B (LiquidAI/LFM2-8B-A1B); and
`jamba-mini`, the shape of AI21's Jamba 1.5 Mini (ai21labs/AI21-Jamba-1.5-Mini, Jamba-v0.1's shape);
`qwen3.5-0.8b`, the shape of Qwen3.5-0.8B's text model (Qwen/Qwen3.5-0.8B); and `lfm3-1.7b`,
the shape of Liquid AI's LFM3-1.7B (LiquidAI/LFM3-1.7B).

Where the numbers come from (no model hub here, so no config.json was read):
- 32 layers, width 4096, 32 query heads, d_state 128, attention at layers 9, 18 and 27: the
  published config.json as two independent projects quote it (`num_hidden_layers` 32,
  `hidden_size` 4096, `num_attention_heads` 32, `mamba_d_state` 128, `attn_layer_indices`
  [9, 18, 27]);
- the rest from transformers' `BambaConfig` defaults, whose docstring names that checkpoint
  (transformers 5.24, models/bamba/configuration_bamba.py): 8 KV heads, MLP 14336 (SwiGLU),
  vocabulary 128000, 128 SSM heads of 64 channels (`mamba_d_head` "auto" = 2 * 4096 / 128),
  1 group, conv 4, chunk 256, RoPE on half of each head (`partial_rotary_factor` 0.5, θ 10000),
  untied embeddings.
Checked by tests/test_hybrid_presets.py: the preset's parameters equal transformers'
`BambaForCausalLM` of that config, tensor for tensor (9.78 B, the "9.8b" of the name), and
our reading of that config.json gives the preset.

The 9.8 B preset needs ~39 GB to build in float32: not on a 24 GB machine.

Falcon-H1-Tiny-90M, from its config.json as two independent projects quote it (an evaluation
script's model contract and a Swift sizing test): 24 layers, width 512, 8 query heads and 2 KV
heads of 64, MLP 768, vocabulary 32768, tied embeddings; the mixer 768 wide in 24 heads of 32,
d_state 64, 1 group, conv 4. The rest from transformers' `FalconH1Config` defaults (chunk 256,
RoPE over the whole head; θ set to 10000 here, its rope_parameters not quoted). Its μP multipliers
are not quoted either: the preset's are neutral, which changes no shape nor any time. Checked by
tests/test_hybrid_presets.py: transformers' `FalconH1ForCausalLM` of that config has the
preset's parameters tensor for tensor (91.0 M).

LFM2-350M, from its language model's config as two independent projects quote it (the text_config
of Liquid AI models built on it, in an MLX port's test fixture and in another project's): 16
layers, width 1024, 16 query heads and 8 KV heads (head 64), short convolutions 3 wide except
attention at layers 2, 5, 8, 10, 12 and 14, `intermediate_size` 6656 (`block_ffn_dim_multiplier`
1.0, `block_multiple_of` 256: transformers' Lfm2MLP makes it 4608 wide), vocabulary 65536, RoPE θ
1e6. The rest from transformers' `Lfm2Config` defaults (tied embeddings, no conv biases, norm eps
1e-5). Checked by tests/test_hybrid_presets.py: transformers' `Lfm2ForCausalLM` of that config has
the preset's parameters tensor for tensor (354.5 M, the published 354,483,968).

LFM2-8B-A1B, from transformers' `Lfm2MoeConfig` defaults, whose docstring names that checkpoint
(width 2048, 32 query and 8 KV heads, dense MLP 7168 in the first 2 layers, then 32 experts of
1792, 4 a token, a sigmoid router with an expert bias, vocabulary 65536, tied embeddings), and
its 24 layers with attention at 2, 6, 10, 14, 18 and 21 as another project's test quotes its
config.json (which agrees with those defaults). Checked by tests/test_hybrid_presets.py against
transformers' `Lfm2MoeForCausalLM` of that config, tensor for tensor (8.34 B, the "8B" of the
name); it needs ~33 GB to build in float32: not on a 24 GB machine.

Jamba 1.5 Mini, from its config.json as another project quotes it (naming its address) and
transformers' `JambaConfig` defaults, whose docstring names ai21labs/Jamba-v0.1 and which agree
with it field for field: 32 layers of width 4096, attention (32 query, 8 KV heads, no positions)
at every 8th layer from layer 4, Mamba-1 mixers elsewhere (expand 2, d_state 16, conv 4, dt rank
256), a dense MLP of 14336 in even layers and 16 experts of 14336, 2 a token, in odd ones,
vocabulary 65536, untied embeddings. Checked by tests/test_hybrid_presets.py against transformers'
`JambaForCausalLM` of that config, tensor for tensor (51.6 B: the "52B total" AI21 gives); it
needs ~206 GB to build in float32.

Qwen3.5-0.8B's text model: 24 layers of width 1024, attention (8 query and 2 KV heads) in 6 of
them, as a model-sizing page quotes its config; every 4th layer (Qwen3_5TextConfig's
`full_attention_interval` 4, which gives those 6); Gated DeltaNets of 16 heads with keys and
values of 128, as a study's benchmark of that checkpoint's DeltaNet layer quotes them; vocabulary
248320 and head 256 (transformers' `Qwen3_5TextConfig` defaults, as another project quotes for
Qwen3.5-9B); RoPE θ 1e7 on a quarter of each head (as a training framework's Qwen3.5-27B recipe
gives); tied embeddings. `intermediate_size` 3584 is not quoted by any source here: it is as
recalled, and the parameter count it gives (about 0.75 B without the vision tower) fits the
published "0.8B". Checked by tests/test_hybrid_presets.py against transformers'
`Qwen3_5ForCausalLM` of that config, tensor for tensor.

LFM3-1.7B, from transformers' `Lfm3Config` defaults, whose docstring names that checkpoint (no
other source here quotes its config.json): 24 layers of width 2048, short convolutions 7 wide,
full attention at layers 2, 6, …, 22 and sliding-window attention (256 positions) at 4, 8, …,
20, 16 query and 4 KV heads of 128, MLP 7680, vocabulary 128000, proportional RoPE (θ 1e6, half
the pairs) on the full layers and θ 1e4 on the sliding ones, per-head output gates, sandwich
norms, tied embeddings. Checked by tests/test_hybrid_presets.py against transformers'
`Lfm3ForCausalLM` of that config, tensor for tensor (1.73 B, the "1.7B" of the name).
"""

BAMBA_9B_ATTENTION = (9, 18, 27)
LFM2_350M_ATTENTION = (2, 5, 8, 10, 12, 14)
LFM2_8B_A1B_ATTENTION = (2, 6, 10, 14, 18, 21)

PRESETS = {
    # three Mamba-2 layers around one attention layer (GQA 4:2, RoPE), MLPs in every layer
    "tiny": dict(d_model=64, vocab_size=100, layer_types=["mamba2", "mamba2", "attention", "mamba2"],
                 d_ff=128, n_heads=4, n_kv_heads=2, head_dim=16, mamba_nheads=8, headdim=16, d_state=16,
                 chunk_size=16),
    "bamba-9b": dict(d_model=4096, vocab_size=128000,
                     layer_types=["attention" if i in BAMBA_9B_ATTENTION else "mamba2" for i in range(32)],
                     d_ff=14336, n_heads=32, n_kv_heads=8, head_dim=128, rope=True, rope_theta=10000.0,
                     partial_rotary_factor=0.5, mamba_nheads=128, headdim=64, ngroups=1, d_state=128, d_conv=4,
                     chunk_size=256, tie_embeddings=False),
    "falcon-h1-tiny": dict(d_model=512, vocab_size=32768, layer_types=["parallel"] * 24, d_ff=768, n_heads=8,
                           n_kv_heads=2, head_dim=64, rope=True, rope_theta=10000.0, mamba_nheads=24, headdim=32,
                           ngroups=1, d_state=64, d_conv=4, chunk_size=256, mamba_gated_norm=False,
                           mamba_norm_before_gate=True, tie_embeddings=True),
    "lfm2-350m": dict(d_model=1024, vocab_size=65536,
                      layer_types=["attention" if i in LFM2_350M_ATTENTION else "conv" for i in range(16)],
                      d_ff=4608, n_heads=16, n_kv_heads=8, head_dim=64, rope=True, rope_theta=1e6, qk_norm=True,
                      short_conv_kernel=3, short_conv_bias=False, tie_embeddings=True),
    "lfm2-8b-a1b": dict(d_model=2048, vocab_size=65536,
                        layer_types=["attention" if i in LFM2_8B_A1B_ATTENTION else "conv" for i in range(24)],
                        d_ff=7168, n_experts=32, experts_per_token=4, d_ff_expert=1792, expert_routing="sigmoid",
                        expert_weights_eps=1e-6, expert_layers=list(range(2, 24)), n_heads=32, n_kv_heads=8, head_dim=64,
                        rope=True, rope_theta=1e6, qk_norm=True, short_conv_kernel=3, short_conv_bias=False,
                        tie_embeddings=True),
    "jamba-mini": dict(d_model=4096, vocab_size=65536, layer_types=["attention" if i % 8 == 4 else "mamba" for i in range(32)],
                       d_ff=14336, n_experts=16, experts_per_token=2, d_ff_expert=14336, expert_routing="softmax",
                       normalize_expert_weights=False, expert_layers=list(range(1, 32, 2)), n_heads=32, n_kv_heads=8,
                       head_dim=128, rope=False, mamba1_expand=2, mamba1_dt_rank=256, mamba1_dt_norm=True, d_state=16,
                       d_conv=4, conv_bias=True, mamba_bias=False, rms_norm_eps=1e-6, tie_embeddings=False),
    "qwen3.5-0.8b": dict(d_model=1024, vocab_size=248320,
                         layer_types=["attention" if i % 4 == 3 else "deltanet" for i in range(24)],
                         d_ff=3584, n_heads=8, n_kv_heads=2, head_dim=256, rope=True, rope_theta=1e7,
                         partial_rotary_factor=0.25, qk_norm=True, attention_output_gate=True, d_conv=4,
                         delta_k_heads=16, delta_v_heads=16, delta_k_dim=128, delta_v_dim=128, rms_norm_eps=1e-6,
                         tie_embeddings=True),
    "lfm3-1.7b": dict(d_model=2048, vocab_size=128000,
                      layer_types=["attention" if i % 4 == 2 or (i % 4 == 0 and i > 0) else "conv" for i in range(24)],
                      d_ff=7680, n_heads=16, n_kv_heads=4, head_dim=128, rope=True, rope_theta=1e6,
                      partial_rotary_factor=0.5, rope_proportional=True, sliding_window_layers=list(range(4, 24, 4)),
                      sliding_window=256, sliding_rope_theta=1e4, qk_norm=True, attention_head_gate=True,
                      sandwich_norm=True, short_conv_kernel=7, short_conv_bias=False, tie_embeddings=True),
}
