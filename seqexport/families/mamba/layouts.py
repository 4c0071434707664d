"""Read the public Mamba checkpoint layouts into `models.mamba.MambaLM`.

Three config layouts are understood:

- ours: the keys of `MambaConfig` (plus `"family": "mamba"`), as `save_checkpoint` writes;
- the original state-spaces `config.json`: `d_model`, `n_layer`, `vocab_size`,
  `ssm_cfg` {`d_state`, `d_conv`, `expand`, `dt_rank`, `bias`, `conv_bias`, ...},
  `rms_norm`, `residual_in_fp32`, `fused_add_norm`, `pad_vocab_size_multiple`,
  `tie_embeddings` (state-dict keys are already ours);
- Hugging Face `MambaConfig` (`model_type: "mamba"`): `hidden_size`,
  `num_hidden_layers`, `state_size`, `conv_kernel`, `expand`, `intermediate_size`,
  `time_step_rank`, `use_bias`, `use_conv_bias`, `layer_norm_epsilon`,
  `tie_word_embeddings` (state-dict key `backbone.embeddings.weight`);
  and its `FalconMambaConfig` (`model_type: "falcon_mamba"`), the same keys plus
  `mixer_rms_eps` (default 1e-6): a weightless RMSNorm on Δ's input, B and C. There
  `intermediate_size` decides the mixer's width: tiiuae/falcon-mamba-7b's config says
  `expand: 16` beside `intermediate_size: 8192` for a 4096-wide model, and its weights
  are 8192 wide.

Keys of a public layout that do not change the eager float32 computation
(`residual_in_fp32`, `fused_add_norm`, initialisation ranges, token ids...) are
ignored; keys that select a different architecture (Mamba-2 layers, attention
layers, an MLP, LayerNorm) are refused.
"""

from dataclasses import fields

import torch
from torch import Tensor

from seqexport.families.mamba import HF_MODEL_TYPES
from seqexport.models.mamba import MambaConfig

_OURS = {f.name for f in fields(MambaConfig)}
_ORIGINAL_REQUIRED = ("d_model", "n_layer", "vocab_size")
_HF_REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size")
_FALCON_MIXER_RMS_EPS = 1e-6  # FalconMambaConfig's default, absent from falcon-mamba-7b's config
# ssm_cfg keys of mamba_simple.Mamba -> MambaConfig fields; other ssm_cfg keys
# (dt_min, dt_max, dt_init, dt_scale, dt_init_floor, use_fast_path) only shape the init.
_ORIGINAL_SSM_KEYS = {
    "d_state": "d_state",
    "d_conv": "d_conv",
    "expand": "expand",
    "dt_rank": "dt_rank",
    "bias": "bias",
    "conv_bias": "conv_bias",
}


def mamba_config_from_json(d: dict) -> MambaConfig:
    """A `MambaConfig` from any of the three config.json layouts (see module docstring).

    Raises ValueError for a dict that matches no layout (listing the keys each
    layout expects), for values that contradict each other, and for settings
    that select an architecture `MambaLM` does not implement.
    """
    if not isinstance(d, dict):
        raise ValueError(f"a Mamba config must be a dict, got {type(d).__name__}")
    if "family" in d:
        if d["family"] != "mamba":
            raise ValueError(f"config names family {d['family']!r}; expected 'mamba'")
        return MambaConfig.from_dict({k: v for k, v in d.items() if k != "family"})
    if "model_type" in d:
        if d["model_type"] not in HF_MODEL_TYPES:
            raise ValueError(
                f"Hugging Face model_type {d['model_type']!r} is not supported; expected one of "
                f"{list(HF_MODEL_TYPES)} (Mamba-1, Falcon-Mamba)"
            )
        return _from_hf(d)
    if set(d) <= _OURS and "d_model" in d:
        return MambaConfig.from_dict(d)
    if "ssm_cfg" in d or all(k in d for k in _ORIGINAL_REQUIRED):
        return _from_original(d)
    raise ValueError(
        f"config keys {sorted(d)} match no Mamba layout; expected one of: "
        f"ours ({{'family': 'mamba'}} plus some of {sorted(_OURS)}), "
        f"state-spaces ({list(_ORIGINAL_REQUIRED)} plus optional 'ssm_cfg', 'rms_norm', "
        "'pad_vocab_size_multiple', 'tie_embeddings'), "
        f"Hugging Face ({{'model_type': 'mamba' or 'falcon_mamba'}} with {list(_HF_REQUIRED)}, 'state_size', 'conv_kernel', "
        "'expand', 'intermediate_size', 'time_step_rank', 'use_bias', 'use_conv_bias', "
        "'layer_norm_epsilon', 'tie_word_embeddings')"
    )


def _require(d: dict, keys: tuple[str, ...], layout: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{layout} Mamba config lacks {missing}; got keys {sorted(d)}")


def _dt_rank(value, key: str):
    """'auto' (or absent) -> None, i.e. ceil(d_model / 16)."""
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an int or 'auto', got {value!r}")
    return value


def _from_original(d: dict) -> MambaConfig:
    """The state-spaces `MambaConfig` (mamba_ssm/models/config_mamba.py)."""
    _require(d, _ORIGINAL_REQUIRED, "state-spaces")
    misplaced = sorted((set(_ORIGINAL_SSM_KEYS) | {"rms_norm_eps"}) & set(d))
    if misplaced:
        raise ValueError(
            f"state-spaces Mamba config has {misplaced} at top level; the layout keeps them in 'ssm_cfg'"
        )
    ssm_cfg = d.get("ssm_cfg") or {}
    if not isinstance(ssm_cfg, dict):
        raise ValueError(f"ssm_cfg must be a dict, got {ssm_cfg!r}")
    if ssm_cfg.get("layer", "Mamba1") != "Mamba1":
        raise ValueError(f"ssm_cfg.layer={ssm_cfg['layer']!r} is not supported; only 'Mamba1' is")
    if d.get("d_intermediate", 0):
        raise ValueError(f"d_intermediate={d['d_intermediate']!r} (an MLP per block) is not supported; expected 0")
    if d.get("attn_layer_idx"):
        raise ValueError(f"attn_layer_idx={d['attn_layer_idx']!r} (attention layers) is not supported; expected []")
    if d.get("rms_norm", True) is not True:
        raise ValueError(f"rms_norm={d['rms_norm']!r} (LayerNorm) is not supported; expected true")
    kwargs = {ours: ssm_cfg[theirs] for theirs, ours in _ORIGINAL_SSM_KEYS.items() if theirs in ssm_cfg}
    if "dt_rank" in kwargs:
        kwargs["dt_rank"] = _dt_rank(kwargs["dt_rank"], "ssm_cfg.dt_rank")
    for key in ("pad_vocab_size_multiple", "tie_embeddings"):
        if key in d:
            kwargs[key] = d[key]
    # The original MixerModel always uses norm_epsilon=1e-5 (not in its config).
    return MambaConfig(d_model=d["d_model"], n_layer=d["n_layer"], vocab_size=d["vocab_size"], **kwargs)


def _from_hf(d: dict) -> MambaConfig:
    """Hugging Face `transformers.MambaConfig` (model_type "mamba")."""
    _require(d, _HF_REQUIRED, "Hugging Face")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={d['hidden_act']!r} is not supported; expected 'silu'")
    renames = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "vocab_size": "vocab_size",
        "state_size": "d_state",
        "conv_kernel": "d_conv",
        "expand": "expand",
        "use_bias": "bias",
        "use_conv_bias": "conv_bias",
        "layer_norm_epsilon": "rms_norm_eps",
        "tie_word_embeddings": "tie_embeddings",
        "pad_vocab_size_multiple": "pad_vocab_size_multiple",
    }
    kwargs = {ours: d[theirs] for theirs, ours in renames.items() if theirs in d}
    kwargs["dt_rank"] = _dt_rank(d.get("time_step_rank"), "time_step_rank")
    if d["model_type"] == "falcon_mamba":
        kwargs["mixer_rms_eps"] = d.get("mixer_rms_eps", _FALCON_MIXER_RMS_EPS)
        if "intermediate_size" in d:
            kwargs["expand"] = _expand_of(d["intermediate_size"], d["hidden_size"])
    config = MambaConfig(**kwargs)

    # Legacy duplicates (converted checkpoints carry the state-spaces names too)
    # and derived sizes must agree with what we built.
    checks = {
        "intermediate_size": ("expand * hidden_size", config.d_inner),
        "d_inner": ("expand * hidden_size", config.d_inner),
        "d_model": ("hidden_size", config.d_model),
        "n_layer": ("num_hidden_layers", config.n_layer),
    }
    bad = [
        f"{key}={d[key]!r} but {what}={want}"
        for key, (what, want) in checks.items()
        if key in d and d[key] != want
    ]
    if bad:
        raise ValueError(f"inconsistent Hugging Face Mamba config: {'; '.join(bad)}")
    return config


def _expand_of(intermediate_size, hidden_size) -> int:
    """Falcon-Mamba's width factor, read from intermediate_size (see the module docstring)."""
    if isinstance(intermediate_size, bool) or not isinstance(intermediate_size, int) or intermediate_size < 1:
        raise ValueError(f"intermediate_size must be a positive int, got {intermediate_size!r}")
    if intermediate_size % hidden_size:
        raise ValueError(
            f"intermediate_size={intermediate_size} is not a multiple of hidden_size={hidden_size}; "
            "expected expand * hidden_size"
        )
    return intermediate_size // hidden_size


def convert_mamba_state_dict(sd: dict[str, Tensor], config: MambaConfig) -> dict[str, Tensor]:
    """A state dict of any layout -> the keys and shapes of `MambaLM(config)`.

    - `backbone.embeddings.weight` (Hugging Face) -> `backbone.embedding.weight`;
      the mixer, norm and norm_f names are the same in all layouts;
    - a missing `lm_head.weight` is filled from the embedding when tied;
    - embedding / lm_head rows are zero-padded up to `config.padded_vocab_size`
      (e.g. 50277 -> 50280) when the checkpoint holds fewer.

    The input dict is not modified. Raises ValueError when both embedding names
    are present, when a vocabulary matrix has fewer rows than `config.vocab_size`,
    or when a tied lm_head differs from the embedding. Other missing or
    mis-shaped keys are left for the caller's strict load to report.
    """
    out = dict(sd)
    if "backbone.embeddings.weight" in out:
        if "backbone.embedding.weight" in out:
            raise ValueError(
                "state dict holds both 'backbone.embeddings.weight' (Hugging Face) and "
                "'backbone.embedding.weight' (state-spaces); expected one"
            )
        out["backbone.embedding.weight"] = out.pop("backbone.embeddings.weight")

    for key in ("backbone.embedding.weight", "lm_head.weight"):
        if key in out:
            out[key] = _pad_vocab_rows(key, out[key], config)

    emb = out.get("backbone.embedding.weight")
    if config.tie_embeddings and emb is not None:
        head = out.get("lm_head.weight")
        if head is not None and (head.shape != emb.shape or not torch.equal(head, emb)):
            raise ValueError(
                "config ties lm_head to the embedding (tie_embeddings / tie_word_embeddings is true), "
                "but 'lm_head.weight' differs from 'backbone.embedding.weight'"
            )
        out["lm_head.weight"] = emb
    return out


def _pad_vocab_rows(key: str, w: Tensor, config: MambaConfig) -> Tensor:
    rows, want = w.shape[0], config.padded_vocab_size
    if w.dim() != 2 or rows >= want:
        return w  # a wrong shape (or too many rows) is reported by the strict load
    if rows < config.vocab_size:
        raise ValueError(
            f"{key!r} has {rows} rows, fewer than vocab_size={config.vocab_size} (expected {want} rows)"
        )
    pad = torch.zeros(want - rows, w.shape[1], dtype=w.dtype, device=w.device)
    return torch.cat([w, pad], dim=0)  # (padded_vocab_size, d)
