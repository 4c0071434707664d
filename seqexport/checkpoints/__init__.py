"""Checkpoint folders (config.json + weights): reading, writing, presets, bundled models."""

from seqexport.checkpoints.io import Checkpoint, checkpoint_extra, load_checkpoint, save_checkpoint
from seqexport.checkpoints.presets import build_preset, bundled, resolve_model

__all__ = ["Checkpoint", "build_preset", "bundled", "checkpoint_extra", "load_checkpoint", "resolve_model",
           "save_checkpoint"]
