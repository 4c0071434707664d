"""Transformer checkpoints: our config.json (the fields of `TransformerConfig`) and state dict."""

from torch import Tensor

from seqexport.models.transformer import Transformer, TransformerConfig

Config = TransformerConfig


def config_from_dict(d: dict) -> TransformerConfig:
    """ValueError/TypeError (turned into CheckpointError by the caller) for unknown or bad keys."""
    return TransformerConfig.from_dict(d)


def build_model(config: TransformerConfig) -> Transformer:
    return Transformer(config)


def convert_state_dict(state: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    return state  # one layout: ours
