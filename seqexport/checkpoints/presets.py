"""Named model shapes with random weights (fixed seed), for users without a checkpoint,
and the bundled trained checkpoints used when neither is given. Each family declares its
presets and bundled checkpoint (`seqexport.families`)."""

from pathlib import Path

import torch

import seqexport.models
from seqexport import families
from seqexport.checkpoints.io import Checkpoint, build_model, load_checkpoint
from seqexport.errors import UsageError

PRETRAINED = Path(seqexport.models.__file__).resolve().parent / "pretrained"


def bundled(family: str) -> Path | None:
    """The folder of the family's bundled trained checkpoint, if it declares one."""
    name = families.get(family, UsageError).bundled
    return PRETRAINED / name if name else None


def preset_names(family: str) -> list[str]:
    return list(families.get(family, UsageError).presets)


def preset_config(family: str, name: str):
    presets = families.get(family, UsageError).presets
    if name not in presets:
        raise UsageError(f"unknown {family} preset {name!r}; expected one of {list(presets)}")
    return families.get(family).checkpoints.Config(**presets[name])


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
    folder = bundled(family)
    if folder is not None and (folder / "config.json").exists():
        return load_checkpoint(folder, family=family), None
    return build_preset(family, "tiny", seed), "tiny"
