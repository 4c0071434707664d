"""Mamba checkpoints in three layouts (ours, state-spaces, Hugging Face): see `layouts`."""

from torch import Tensor

from seqexport.families.mamba.layouts import convert_mamba_state_dict, mamba_config_from_json
from seqexport.models.mamba import MambaConfig, MambaLM

Config = MambaConfig


def config_from_dict(d: dict) -> MambaConfig:
    return mamba_config_from_json(d)


def build_model(config: MambaConfig) -> MambaLM:
    return MambaLM(config)


def convert_state_dict(state: dict[str, Tensor], config: MambaConfig) -> dict[str, Tensor]:
    return convert_mamba_state_dict(state, config)
