"""Shared fixtures: tiny exports made once per test session (exporting is the slow part)."""

import pytest
import torch

from seqexport.presets import build_preset


@pytest.fixture(scope="session")
def transformer_tiny(tmp_path_factory):
    """(checkpoint, exported folder) of the tiny transformer preset."""
    from seqexport.export.transformer import export_transformer

    torch.manual_seed(0)
    ckpt = build_preset("transformer", "tiny", seed=0)
    out = tmp_path_factory.mktemp("export") / "transformer-tiny"
    export_transformer(ckpt, "tiny", out)
    return ckpt, out
