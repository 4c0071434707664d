"""Shared fixtures: tiny exports made once per test session (exporting is the slow part)."""

import pytest
import torch

from seqexport.checkpoints.presets import build_preset


@pytest.fixture(scope="session")
def transformer_tiny(tmp_path_factory):
    """(checkpoint, exported folder) of the tiny transformer preset."""
    from seqexport.families.transformer.export import export_transformer

    torch.manual_seed(0)
    ckpt = build_preset("transformer", "tiny", seed=0)
    out = tmp_path_factory.mktemp("export") / "transformer-tiny"
    export_transformer(ckpt, "tiny", out)
    return ckpt, out


UNROLLED_LEN = 7


@pytest.fixture(scope="session")
def mamba_exports(tmp_path_factory):
    """lowering -> (checkpoint, exported folder) of the tiny Mamba preset, exported on first use."""
    from seqexport.families.mamba.export import export_mamba

    ckpt = build_preset("mamba", "tiny", seed=0)
    made = {}

    def get(lowering):
        if lowering not in made:
            out = tmp_path_factory.mktemp("export") / f"mamba-tiny-{lowering}"
            seq_len = UNROLLED_LEN if lowering == "unrolled" else None
            export_mamba(ckpt, "tiny", out, scan=lowering, seq_len=seq_len)
            made[lowering] = (ckpt, out)
        return made[lowering]

    return get


@pytest.fixture(scope="session")
def bundled_exports(tmp_path_factory):
    """family -> (checkpoint, exported folder) of the bundled trained models."""
    from seqexport.checkpoints import bundled
    from seqexport.checkpoints.io import load_checkpoint
    from seqexport.families.mamba.export import export_mamba
    from seqexport.families.transformer.export import export_transformer

    made = {}

    def get(family):
        if family not in made:
            ckpt = load_checkpoint(bundled(family))
            out = tmp_path_factory.mktemp("bundled") / family
            tokenizer = __import__("json").loads((bundled(family) / "config.json").read_text())["tokenizer"]
            if family == "transformer":
                export_transformer(ckpt, None, out, tokenizer=tokenizer)
            else:
                export_mamba(ckpt, None, out, scan="loop", tokenizer=tokenizer)
            made[family] = (ckpt, out)
        return made[family]

    return get
