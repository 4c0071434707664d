"""Read the public Mamba-2 checkpoint layouts into `models.mamba2.Mamba2LM`.

Three config layouts are understood:

- ours: the keys of `Mamba2Config` (plus `"family": "mamba2"`), as `save_checkpoint` writes;
- state-spaces' `config.json` (mamba_ssm/models/config_mamba.py): `d_model`, `n_layer`,
  `vocab_size`, `ssm_cfg` {`layer: "Mamba2"`, `d_state`, `d_conv`, `expand`, `headdim`,
  `ngroups`, `chunk_size`, `bias`, `conv_bias`, `norm_before_gate`, `dt_limit`, ...},
  `d_intermediate`, `attn_layer_idx`, `rms_norm`, `pad_vocab_size_multiple`,
  `tie_embeddings`; keys `ssm_cfg` leaves out take `mamba_ssm.modules.mamba2.Mamba2`'s
  defaults (d_state 128, headdim 64, chunk_size 256...), not ours. State-dict keys are ours.
- transformers' `Mamba2Config` (`model_type: "mamba2"`): `hidden_size`, `num_hidden_layers`,
  `vocab_size`, `state_size`, `conv_kernel`, `expand`, `head_dim`, `num_heads`, `n_groups`,
  `chunk_size`, `use_bias`, `use_conv_bias`, `layer_norm_epsilon`, `time_step_limit`,
  `tie_word_embeddings`; absent keys take transformers' defaults. State-dict key
  `backbone.embeddings.weight`; the embedding has exactly `vocab_size` rows.

What transformers' torch path does, which this follows:
- its gated norm is always norm(y * SiLU(z)) (`norm_before_gate` is not a field of its config
  and is not read; a stale key in an old config.json is ignored, as transformers does);
- `time_step_limit` (default (0, inf), saved as `{"__float__": "Infinity"}` by transformers 5,
  bare `Infinity` by older versions) clamps Δ in the chunked prefill. Its single-token path
  (`mamba2_selective_state_update`) does not clamp; ours clamps in both, so that `step`
  equals `forward` with l = 1.

Keys that do not change the eager float32 computation (`residual_in_fp32`, `fused_add_norm`,
initialisation ranges, token ids, `time_step_rank`...) are ignored; keys that select a
different architecture (Mamba-1 layers, attention layers, an MLP, LayerNorm, a per-channel D,
a partial SSM width) are refused with a ValueError naming the key, its value and what is
expected.
"""

import math
from dataclasses import fields

import torch
from torch import Tensor

from seqexport.families.mamba2 import is_mamba2_config as is_public_mamba2
from seqexport.models.mamba2 import Mamba2Config

_OURS = {f.name for f in fields(Mamba2Config)}
_STATE_SPACES_REQUIRED = ("d_model", "n_layer", "vocab_size")
_HF_REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size")

# mamba_ssm.modules.mamba2.Mamba2's defaults for the ssm_cfg keys that shape the model.
_STATE_SPACES_SSM_DEFAULTS = dict(
    d_state=128, d_conv=4, expand=2, headdim=64, ngroups=1, chunk_size=256, bias=False, conv_bias=True,
    norm_before_gate=False,
)
# ssm_cfg keys that only shape the init or the kernels chosen: ignored.
_STATE_SPACES_SSM_IGNORED = {
    "layer", "dt_limit", "d_ssm", "rmsnorm", "D_has_hdim", "conv_init", "A_init_range", "dt_min", "dt_max",
    "dt_init_floor", "learnable_init_states", "activation", "use_mem_eff_path", "layer_idx",
    "process_group", "sequence_parallel", "device", "dtype",
}
# transformers.Mamba2Config's defaults (5.24, unchanged since 4.44) for keys config.json may omit.
_HF_DEFAULTS = dict(
    state_size=128, conv_kernel=4, expand=2, head_dim=64, num_heads=128, n_groups=8, chunk_size=256,
    use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
    time_step_limit=(0.0, math.inf), hidden_act="silu",
)


def is_mamba2_config(d: dict) -> bool:
    """True for transformers' `model_type: "mamba2"`, a state-spaces config whose `ssm_cfg`
    names the `Mamba2` layer (with `d_model` and `n_layer`), and ours (`"family": "mamba2"`);
    False for Mamba-1 configs of either public layout."""
    return isinstance(d, dict) and (d.get("family") == "mamba2" or (is_public_mamba2(d) and (
        d.get("model_type") == "mamba2" or {"d_model", "n_layer"} <= set(d))))


def mamba2_config_from_json(d: dict) -> Mamba2Config:
    """A `Mamba2Config` from any of the three config.json layouts (see module docstring).

    Raises ValueError for a dict that matches no layout, for values that contradict each
    other, and for settings that select an architecture `Mamba2LM` does not implement.
    """
    if not isinstance(d, dict):
        raise ValueError(f"a Mamba-2 config must be a dict, got {type(d).__name__}")
    if "family" in d:
        if d["family"] != "mamba2":
            raise ValueError(f"config names family {d['family']!r}; expected 'mamba2'")
        return Mamba2Config.from_dict({k: v for k, v in d.items() if k != "family"})
    if "model_type" in d:
        if d["model_type"] != "mamba2":
            raise ValueError(
                f"transformers model_type={d['model_type']!r} is not supported here; expected 'mamba2'"
            )
        return _from_hf(d)
    if "ssm_cfg" not in d and set(d) <= _OURS:
        return Mamba2Config.from_dict(d)
    if "ssm_cfg" in d or all(k in d for k in _STATE_SPACES_REQUIRED):
        return _from_state_spaces(d)
    raise ValueError(
        f"config keys {sorted(d)} match no Mamba-2 layout; expected one of: "
        f"ours (some of {sorted(_OURS)}), "
        f"state-spaces ({list(_STATE_SPACES_REQUIRED)} and 'ssm_cfg' with layer 'Mamba2'), "
        f"transformers ({{'model_type': 'mamba2'}} with {list(_HF_REQUIRED)}, 'state_size', 'head_dim', "
        "'num_heads', 'n_groups', ...)"
    )


def _require(d: dict, keys: tuple[str, ...], layout: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{layout} Mamba-2 config lacks {missing}; got keys {sorted(d)}")


def _number(value, key: str) -> float:
    """A JSON number, inf included: bare `Infinity` (Python's json), or transformers 5's
    `{"__float__": "Infinity"}`."""
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
    """(min, max) Δ clamp -> Mamba2Config's dt_min_limit / dt_max_limit (inf -> None)."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"{key}={value!r}; expected a pair [min, max]")
    lo, hi = _number(value[0], f"{key}[0]"), _number(value[1], f"{key}[1]")
    if math.isinf(lo):
        raise ValueError(f"{key}[0]={lo}; expected a finite lower limit >= 0")
    return dict(dt_min_limit=lo, dt_max_limit=None if hi == math.inf else hi)


def _from_state_spaces(d: dict) -> Mamba2Config:
    """state-spaces' `MambaConfig` with `ssm_cfg.layer == "Mamba2"`."""
    _require(d, _STATE_SPACES_REQUIRED, "state-spaces")
    ssm_cfg = d.get("ssm_cfg") or {}
    if not isinstance(ssm_cfg, dict):
        raise ValueError(f"ssm_cfg={ssm_cfg!r}; expected a dict")
    if ssm_cfg.get("layer", "Mamba1") != "Mamba2":
        raise ValueError(
            f"ssm_cfg.layer={ssm_cfg.get('layer', 'Mamba1 (absent)')!r} is not a Mamba-2 layer; expected 'Mamba2' "
            "(a Mamba-1 config belongs to the 'mamba' family)"
        )
    misplaced = sorted(set(_STATE_SPACES_SSM_DEFAULTS) & set(d))
    if misplaced:
        raise ValueError(f"state-spaces config has {misplaced} at top level; the layout keeps them in 'ssm_cfg'")
    unknown = sorted(set(ssm_cfg) - set(_STATE_SPACES_SSM_DEFAULTS) - _STATE_SPACES_SSM_IGNORED)
    if unknown:
        raise ValueError(f"ssm_cfg keys {unknown} are not understood; expected some of "
                         f"{sorted(set(_STATE_SPACES_SSM_DEFAULTS) | _STATE_SPACES_SSM_IGNORED)}")
    _refuse_unsupported(d, ssm_cfg)

    kwargs = {key: ssm_cfg.get(key, default) for key, default in _STATE_SPACES_SSM_DEFAULTS.items()}
    if "dt_limit" in ssm_cfg:
        kwargs.update(_dt_limits(ssm_cfg["dt_limit"], "ssm_cfg.dt_limit"))
    # state-spaces' MambaConfig defaults: pad_vocab_size_multiple 8, tie_embeddings true;
    # MixerModel's norm epsilon is always 1e-5 (not in its config).
    config = Mamba2Config(
        d_model=d["d_model"], n_layer=d["n_layer"], vocab_size=d["vocab_size"],
        pad_vocab_size_multiple=d.get("pad_vocab_size_multiple", 8), tie_embeddings=d.get("tie_embeddings", True),
        **kwargs,
    )
    d_ssm = ssm_cfg.get("d_ssm")
    if d_ssm is not None and d_ssm != config.d_inner:
        raise ValueError(
            f"ssm_cfg.d_ssm={d_ssm!r} (an SSM over part of the channels, a gated MLP on the rest) is not "
            f"supported; expected null or d_inner = expand * d_model = {config.d_inner}"
        )
    return config


def _refuse_unsupported(d: dict, ssm_cfg: dict) -> None:
    """ValueError naming a state-spaces option this Mamba-2 does not have (MLPs, attention
    layers, LayerNorm, no gated norm, D per channel)."""
    if d.get("d_intermediate", 0):
        raise ValueError(f"d_intermediate={d['d_intermediate']!r} (an MLP per block) is not supported; expected 0")
    if d.get("attn_layer_idx"):
        raise ValueError(
            f"attn_layer_idx={d['attn_layer_idx']!r} (attention layers: a hybrid) is not supported; expected []"
        )
    if d.get("rms_norm", True) is not True:
        raise ValueError(f"rms_norm={d['rms_norm']!r} (LayerNorm) is not supported; expected true")
    if ssm_cfg.get("rmsnorm", True) is not True:
        raise ValueError(f"ssm_cfg.rmsnorm={ssm_cfg['rmsnorm']!r} (no gated norm) is not supported; expected true")
    if ssm_cfg.get("D_has_hdim", False) is not False:
        raise ValueError(
            f"ssm_cfg.D_has_hdim={ssm_cfg['D_has_hdim']!r} (D per channel) is not supported; expected false"
        )


def _from_hf(d: dict) -> Mamba2Config:
    """transformers' `Mamba2Config` (model_type "mamba2")."""
    _require(d, _HF_REQUIRED, "transformers")
    d = {**_HF_DEFAULTS, **d}
    if d["hidden_act"] != "silu":
        raise ValueError(f"hidden_act={d['hidden_act']!r} is not supported; expected 'silu'")
    if d.get("rms_norm", True) is not True:
        raise ValueError(f"rms_norm={d['rms_norm']!r} is not supported; expected true (the gated RMSNorm)")
    if d["num_heads"] * d["head_dim"] != d["expand"] * d["hidden_size"]:
        raise ValueError(
            f"num_heads * head_dim = {d['num_heads']} * {d['head_dim']} must equal expand * hidden_size = "
            f"{d['expand']} * {d['hidden_size']}"
        )
    return Mamba2Config(
        d_model=d["hidden_size"], n_layer=d["num_hidden_layers"], vocab_size=d["vocab_size"],
        d_state=d["state_size"], d_conv=d["conv_kernel"], expand=d["expand"], headdim=d["head_dim"],
        ngroups=d["n_groups"], chunk_size=d["chunk_size"], bias=d["use_bias"], conv_bias=d["use_conv_bias"],
        rms_norm_eps=d["layer_norm_epsilon"], norm_before_gate=False,
        tie_embeddings=d["tie_word_embeddings"],
        # transformers' embedding has exactly vocab_size rows: a multiple of 1 pads nothing.
        pad_vocab_size_multiple=1,
        **_dt_limits(d["time_step_limit"], "time_step_limit"),
    )


def _required_keys(config: Mamba2Config) -> list[str]:
    per_layer = ["norm.weight", "mixer.in_proj.weight", "mixer.conv1d.weight", "mixer.dt_bias", "mixer.A_log",
                 "mixer.D", "mixer.norm.weight", "mixer.out_proj.weight"]
    if config.bias:
        per_layer += ["mixer.in_proj.bias", "mixer.out_proj.bias"]
    if config.conv_bias:
        per_layer += ["mixer.conv1d.bias"]
    layers = [f"backbone.layers.{i}.{key}" for i in range(config.n_layer) for key in per_layer]
    return ["backbone.embedding.weight", *layers, "backbone.norm_f.weight"]


def convert_state_dict(state: dict[str, Tensor], config: Mamba2Config) -> dict[str, Tensor]:
    """A state dict of transformers' or state-spaces' layout -> the keys of `Mamba2LM(config)`, float32.

    - `backbone.embeddings.weight` (transformers) -> `backbone.embedding.weight`; every other
      name is the same in both layouts;
    - a missing `lm_head.weight` is filled from the embedding when tied;
    - embedding / lm_head rows are zero-padded up to `config.padded_vocab_size`.

    Returns a new dict (the input is not modified). Raises ValueError naming a missing
    required key, an in_proj wider than z, xBC and dt (a d_mlp part: a gated MLP beside the
    SSM), both embedding names at once, or a tied lm_head that differs from the embedding.
    """
    out = {key: value.float() for key, value in state.items()}
    if "backbone.embeddings.weight" in out:
        if "backbone.embedding.weight" in out:
            raise ValueError(
                "state dict holds both 'backbone.embeddings.weight' (transformers) and "
                "'backbone.embedding.weight' (state-spaces); expected one"
            )
        out["backbone.embedding.weight"] = out.pop("backbone.embeddings.weight")
    missing = [key for key in _required_keys(config) if key not in out]
    if missing:
        raise ValueError(f"state dict lacks {missing[:8]}{' ...' if len(missing) > 8 else ''} "
                         f"({len(missing)} keys) for this Mamba2Config")

    want = 2 * config.d_inner + 2 * config.ngroups * config.d_state + config.nheads
    for i in range(config.n_layer):
        key = f"backbone.layers.{i}.mixer.in_proj.weight"
        rows = out[key].shape[0]
        if rows > want:
            raise ValueError(
                f"{key!r} has {rows} rows, more than z, xBC and dt need (2*d_inner + 2*ngroups*d_state + nheads "
                f"= {want}): a d_mlp part (a gated MLP beside the SSM, d_ssm < d_inner) is not supported"
            )

    for key in ("backbone.embedding.weight", "lm_head.weight"):
        if key in out:
            out[key] = _pad_vocab_rows(key, out[key], config)
    _tie_head(out, config)
    return out


def _tie_head(out: dict[str, Tensor], config: Mamba2Config) -> None:
    """lm_head.weight filled from the embedding when tied (and checked equal where both are given)."""
    emb = out["backbone.embedding.weight"]
    if config.tie_embeddings:
        head = out.get("lm_head.weight")
        if head is not None and (head.shape != emb.shape or not torch.equal(head, emb)):
            raise ValueError(
                "config ties lm_head to the embedding (tie_embeddings / tie_word_embeddings is true), "
                "but 'lm_head.weight' differs from 'backbone.embedding.weight'"
            )
        out["lm_head.weight"] = emb
    elif "lm_head.weight" not in out:
        raise ValueError("state dict lacks 'lm_head.weight' and the config does not tie it to the embedding")


def _pad_vocab_rows(key: str, w: Tensor, config: Mamba2Config) -> Tensor:
    rows, want = w.shape[0], config.padded_vocab_size
    if w.dim() != 2 or rows >= want:
        return w  # a wrong shape (or too many rows) is reported by the strict load
    if rows < config.vocab_size:
        raise ValueError(
            f"{key!r} has {rows} rows, fewer than vocab_size={config.vocab_size} (expected {want} rows)"
        )
    pad = torch.zeros(want - rows, w.shape[1], dtype=w.dtype, device=w.device)
    return torch.cat([w, pad], dim=0)  # (padded_vocab_size, d)
