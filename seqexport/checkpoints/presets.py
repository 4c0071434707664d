"""Named model shapes with random weights (fixed seed), for users without a checkpoint,
and the bundled trained checkpoints used when neither is given."""

from pathlib import Path

import torch

import seqexport.models
from seqexport.checkpoints.io import Checkpoint, build_model, load_checkpoint
from seqexport.errors import UsageError

PRETRAINED = Path(seqexport.models.__file__).resolve().parent / "pretrained"
BUNDLED = {"transformer": PRETRAINED / "transformer-dates", "mamba": PRETRAINED / "mamba-dates"}

PRESETS = {
    "transformer": {
        "tiny": dict(src_vocab_size=100, tgt_vocab_size=100, d_model=64, n_heads=4, d_ff=128,
                     num_layers=2, max_len=512),
        # the notes' sizes (Transformer-base)
        "base": dict(src_vocab_size=10000, tgt_vocab_size=10000, d_model=512, n_heads=8,
                     d_ff=2048, num_layers=6, max_len=5000),
    },
    "mamba": {
        "tiny": dict(d_model=64, n_layer=2, d_state=16, vocab_size=100),
        # the mamba-130m shape
        "130m": dict(d_model=768, n_layer=24, d_state=16, vocab_size=50280),
    },
}


def preset_names(family: str) -> list[str]:
    return list(PRESETS[family])


def preset_config(family: str, name: str):
    if name not in PRESETS[family]:
        raise UsageError(f"unknown {family} preset {name!r}; expected one of {preset_names(family)}")
    if family == "transformer":
        from seqexport.models.transformer import TransformerConfig

        return TransformerConfig(**PRESETS[family][name])
    from seqexport.models.mamba import MambaConfig

    return MambaConfig(**PRESETS[family][name])


def build_preset(family: str, name: str, seed: int = 0) -> Checkpoint:
    """A randomly initialised model of a preset shape (reproducible from `seed`)."""
    config = preset_config(family, name)
    torch.manual_seed(seed)
    model = build_model(family, config).float().eval()
    return Checkpoint(family, config, model, path=None, sha256=None)


def resolve_model(family: str, checkpoint: str | None, preset: str | None, seed: int = 0) -> tuple[Checkpoint, str | None]:
    """The model an export starts from: --checkpoint, --preset, else the bundled one (else tiny).

    Returns the checkpoint and the preset name (None when loaded from a folder).
    """
    if checkpoint and preset:
        raise UsageError("give --checkpoint or --preset, not both")
    if checkpoint:
        return load_checkpoint(checkpoint, family=family), None
    if preset:
        return build_preset(family, preset, seed), preset
    if (BUNDLED[family] / "config.json").exists():
        return load_checkpoint(BUNDLED[family], family=family), None
    return build_preset(family, "tiny", seed), "tiny"
