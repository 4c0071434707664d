"""Mamba-2 checkpoints in three layouts (ours, state-spaces, transformers' `Mamba2ForCausalLM`):
see `layouts`."""

from torch import Tensor

from seqexport.families.mamba2.layouts import convert_state_dict as _convert
from seqexport.families.mamba2.layouts import mamba2_config_from_json
from seqexport.models.mamba2 import Mamba2Config, Mamba2LM

Config = Mamba2Config


def config_from_dict(d: dict) -> Mamba2Config:
    return mamba2_config_from_json(d)


def build_model(config: Mamba2Config) -> Mamba2LM:
    return Mamba2LM(config)


def convert_state_dict(state: dict[str, Tensor], config: Mamba2Config) -> dict[str, Tensor]:
    return _convert(state, config)
