"""The hybrid family's published-shape presets, each built on the meta device (no memory): its
parameters equal, tensor for tensor, those of transformers' own model class of that checkpoint's
config, and our reading of that config.json gives the preset. `bamba-9b` against
`BambaForCausalLM` of Bamba-9B's config, `falcon-h1-tiny` against `FalconH1ForCausalLM` of
Falcon-H1-Tiny-90M's, `lfm2-350m` against `Lfm2ForCausalLM` of LFM2-350M's, `lfm2-8b-a1b`
against `Lfm2MoeForCausalLM` of LFM2-8B-A1B's, `jamba-mini` against `JambaForCausalLM` of Jamba 1.5
Mini's, `qwen3.5-0.8b` against `Qwen3_5ForCausalLM` of Qwen3.5-0.8B's text model, `lfm3-1.7b`
against `Lfm3ForCausalLM` of LFM3-1.7B's (seqexport/families/hybrid/presets.py says where each
number comes from)."""

from collections import Counter

import pytest
import torch

from seqexport.checkpoints.io import build_model
from seqexport.checkpoints.presets import preset_config
from seqexport.families.hybrid.layouts import hybrid_config_from_json

transformers = pytest.importorskip("transformers")

# The fields each checkpoint's config.json sets beyond its transformers config class's defaults.
# ibm-fms/Bamba-9.8b-2.2T-hf
BAMBA_9B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, mamba_d_state=128,
                attn_layer_indices=[9, 18, 27])
# tiiuae/Falcon-H1-Tiny-90M-Base
FALCON_H1_TINY = dict(num_hidden_layers=24, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=64, intermediate_size=768, vocab_size=32768, tie_word_embeddings=True, mamba_d_ssm=768,
                      mamba_d_head=32, mamba_n_heads=24, mamba_d_state=64, mamba_n_groups=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
# LiquidAI/LFM2-350M (its language model's)
LFM2_350M = dict(num_hidden_layers=16, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=6656, vocab_size=65536, full_attn_idxs=[2, 5, 8, 10, 12, 14],
                 block_ffn_dim_multiplier=1.0, block_multiple_of=256, conv_L_cache=3,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})
# LiquidAI/LFM2-8B-A1B: its layers (Lfm2MoeConfig's defaults give the rest)
LFM2_8B_A1B = dict(num_hidden_layers=24,
                   layer_types=["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)])

# ai21labs/AI21-Jamba-1.5-Mini: JambaConfig's defaults (Jamba-v0.1's), its dt rank as quoted
JAMBA_MINI = dict(mamba_dt_rank=256)

# Qwen/Qwen3.5-0.8B's text model (presets.py says which numbers are quoted where)
QWEN3_5_0_8B = dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=8, num_key_value_heads=2,
                    intermediate_size=3584, linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})

# preset -> (config class, model class, that config's fields, the parameter count: (low, high) bounds)
PRESETS = {
    "bamba-9b": ("BambaConfig", "BambaForCausalLM", BAMBA_9B, (9.7e9, 9.9e9)),  # the "9.8b" of its name
    "falcon-h1-tiny": ("FalconH1Config", "FalconH1ForCausalLM", FALCON_H1_TINY, (89e6, 92e6)),  # "90M"
    "lfm2-350m": ("Lfm2Config", "Lfm2ForCausalLM", LFM2_350M, (354_483_968, 354_483_968)),  # its published count
    "lfm2-8b-a1b": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", LFM2_8B_A1B, (8.2e9, 8.5e9)),  # "8B"
    "jamba-mini": ("JambaConfig", "JambaForCausalLM", JAMBA_MINI, (51.4e9, 51.8e9)),  # AI21's "52B total"
    "qwen3.5-0.8b": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", QWEN3_5_0_8B, (0.7e9, 0.9e9)),  # "0.8B"
    "lfm3-1.7b": ("Lfm3Config", "Lfm3ForCausalLM", {}, (1.7e9, 1.75e9)),  # "1.7B": Lfm3Config's defaults are its
}


def shapes(model: torch.nn.Module) -> Counter:
    return Counter(tuple(p.shape) for p in model.parameters())


@pytest.mark.parametrize("preset", list(PRESETS))
def test_a_preset_has_the_parameters_of_transformers_model_of_that_checkpoint(preset):
    config_class, model_class, fields, (low, high) = PRESETS[preset]
    with torch.device("meta"):
        ours = build_model("hybrid", preset_config("hybrid", preset))
        theirs = getattr(transformers, model_class)(getattr(transformers, config_class)(**fields))
    n_ours = sum(p.numel() for p in ours.parameters())
    assert n_ours == sum(p.numel() for p in theirs.parameters())
    assert low <= n_ours <= high, n_ours
    assert shapes(ours) == shapes(theirs)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_that_checkpoints_config_json_reads_as_the_preset(preset):
    config_class, _, fields, _ = PRESETS[preset]
    read = hybrid_config_from_json(getattr(transformers, config_class)(**fields).to_dict())
    want = preset_config("hybrid", preset)
    assert {k: (getattr(read, k), v) for k, v in vars(want).items() if getattr(read, k) != v} == {}
    if preset == "bamba-9b":
        assert [i for i, t in enumerate(read.layer_types) if t == "attention"] == [9, 18, 27]
