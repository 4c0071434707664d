"""Hybrid checkpoints: ours and transformers' Bamba, GraniteMoeHybrid (dense) and Nemotron-H
layouts (see `layouts`)."""

from torch import Tensor

from seqexport.families.hybrid.layouts import convert_state_dict as _convert
from seqexport.families.hybrid.layouts import hybrid_config_from_json
from seqexport.models.hybrid import HybridConfig, HybridLM

Config = HybridConfig


def config_from_dict(d: dict) -> HybridConfig:
    # the loader hands ours over without its "family" key (it chose the family by it)
    return hybrid_config_from_json(d if "model_type" in d or "family" in d else {"family": "hybrid", **d})


def build_model(config: HybridConfig) -> HybridLM:
    return HybridLM(config)


def convert_state_dict(state: dict[str, Tensor], config: HybridConfig) -> dict[str, Tensor]:
    return _convert(state, config)
