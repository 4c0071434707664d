"""Earlier import path of `seqexport.checkpoints` (the README's first Python example used it)."""

from seqexport.checkpoints.presets import build_preset, resolve_model

__all__ = ["build_preset", "resolve_model"]
