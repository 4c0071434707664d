"""The hybrid family's published-shape presets: `bamba-9b` is Bamba-9B's shape: built on the meta
device (no memory), its parameters equal transformers' own `BambaForCausalLM` of Bamba-9B's
config tensor for tensor, and our reading of that config.json gives the preset; `falcon-h1-tiny`
likewise against `FalconH1ForCausalLM` of Falcon-H1-Tiny-90M's config."""

from collections import Counter

import pytest
import torch

from seqexport.checkpoints.io import build_model
from seqexport.checkpoints.presets import preset_config
from seqexport.families.hybrid.layouts import hybrid_config_from_json

transformers = pytest.importorskip("transformers")

# ibm-fms/Bamba-9.8b-2.2T-hf: the fields its config.json sets beyond transformers' BambaConfig
# defaults (see seqexport/families/hybrid/presets.py for where each number comes from)
BAMBA_9B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, mamba_d_state=128,
                attn_layer_indices=[9, 18, 27])


def shapes(model: torch.nn.Module) -> Counter:
    return Counter(tuple(p.shape) for p in model.parameters())


def test_bamba_9b_preset_has_transformers_bamba_9b_parameters():
    with torch.device("meta"):
        ours = build_model("hybrid", preset_config("hybrid", "bamba-9b"))
        theirs = transformers.BambaForCausalLM(transformers.BambaConfig(**BAMBA_9B))
    n_ours = sum(p.numel() for p in ours.parameters())
    n_theirs = sum(p.numel() for p in theirs.parameters())
    assert n_ours == n_theirs
    assert 9.7e9 < n_ours < 9.9e9  # the "9.8b" of the checkpoint's name
    assert shapes(ours) == shapes(theirs)


def test_bamba_9b_config_json_reads_as_the_preset():
    read = hybrid_config_from_json(transformers.BambaConfig(**BAMBA_9B).to_dict())
    preset = preset_config("hybrid", "bamba-9b")
    differ = {k: (getattr(read, k), v) for k, v in vars(preset).items() if getattr(read, k) != v}
    assert not differ
    assert [i for i, t in enumerate(read.layer_types) if t == "attention"] == [9, 18, 27]


# tiiuae/Falcon-H1-Tiny-90M-Base: the fields its config.json sets beyond transformers' FalconH1Config
# defaults (see seqexport/families/hybrid/presets.py)
FALCON_H1_TINY = dict(num_hidden_layers=24, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=64, intermediate_size=768, vocab_size=32768, tie_word_embeddings=True, mamba_d_ssm=768,
                      mamba_d_head=32, mamba_n_heads=24, mamba_d_state=64, mamba_n_groups=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def test_falcon_h1_tiny_preset_has_transformers_falcon_h1_tiny_parameters():
    with torch.device("meta"):
        ours = build_model("hybrid", preset_config("hybrid", "falcon-h1-tiny"))
        theirs = transformers.FalconH1ForCausalLM(transformers.FalconH1Config(**FALCON_H1_TINY))
    n_ours = sum(p.numel() for p in ours.parameters())
    assert n_ours == sum(p.numel() for p in theirs.parameters())
    assert 89e6 < n_ours < 92e6  # the "90M" of the checkpoint's name
    assert shapes(ours) == shapes(theirs)


def test_falcon_h1_tiny_config_json_reads_as_the_preset():
    read = hybrid_config_from_json(transformers.FalconH1Config(**FALCON_H1_TINY).to_dict())
    preset = preset_config("hybrid", "falcon-h1-tiny")
    assert {k: (getattr(read, k), v) for k, v in vars(preset).items() if getattr(read, k) != v} == {}


# LiquidAI/LFM2-350M: the fields its language model's config sets beyond transformers' Lfm2Config
# defaults (see seqexport/families/hybrid/presets.py)
LFM2_350M = dict(num_hidden_layers=16, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=6656, vocab_size=65536, full_attn_idxs=[2, 5, 8, 10, 12, 14],
                 block_ffn_dim_multiplier=1.0, block_multiple_of=256, conv_L_cache=3,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def test_lfm2_350m_preset_has_transformers_lfm2_350m_parameters():
    with torch.device("meta"):
        ours = build_model("hybrid", preset_config("hybrid", "lfm2-350m"))
        theirs = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**LFM2_350M))
    n_ours = sum(p.numel() for p in ours.parameters())
    assert n_ours == sum(p.numel() for p in theirs.parameters())
    assert n_ours == 354_483_968  # LFM2-350M's published parameter count
    assert shapes(ours) == shapes(theirs)


def test_lfm2_350m_config_json_reads_as_the_preset():
    read = hybrid_config_from_json(transformers.Lfm2Config(**LFM2_350M).to_dict())
    preset = preset_config("hybrid", "lfm2-350m")
    assert {k: (getattr(read, k), v) for k, v in vars(preset).items() if getattr(read, k) != v} == {}


# LiquidAI/LFM2-8B-A1B: its layers (transformers' Lfm2MoeConfig defaults give the rest; see presets.py)
LFM2_8B_A1B = dict(num_hidden_layers=24,
                   layer_types=["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)])


def test_lfm2_8b_a1b_preset_has_transformers_lfm2_8b_a1b_parameters():
    with torch.device("meta"):
        ours = build_model("hybrid", preset_config("hybrid", "lfm2-8b-a1b"))
        theirs = transformers.Lfm2MoeForCausalLM(transformers.Lfm2MoeConfig(**LFM2_8B_A1B))
    n_ours = sum(p.numel() for p in ours.parameters())
    assert n_ours == sum(p.numel() for p in theirs.parameters())
    assert 8.2e9 < n_ours < 8.5e9, n_ours  # the "8B" of the checkpoint's name
    assert shapes(ours) == shapes(theirs)


def test_lfm2_8b_a1b_config_json_reads_as_the_preset():
    read = hybrid_config_from_json(transformers.Lfm2MoeConfig(**LFM2_8B_A1B).to_dict())
    preset = preset_config("hybrid", "lfm2-8b-a1b")
    assert {k: (getattr(read, k), v) for k, v in vars(preset).items() if getattr(read, k) != v} == {}
