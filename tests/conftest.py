"""Shared fixtures: tiny exports made once per test session (exporting is the slow part)."""

import signal

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


def mamba_tiny_that_depends_on_everything(seed: int = 0):
    """The tiny Mamba preset with weights perturbed so that its outputs depend on every part.

    At its default init (tied embeddings, out_proj scaled down, conv bias 0, Δ ≈ 1e-3) the
    residual stream is the input embedding, so greedy decoding just repeats the last token
    and a state fed to the wrong layer changes no token. A larger out_proj, a random conv bias
    and Δ in softplus(U(-3, 0)) ≈ 0.05..0.7 make every layer, the conv and the scan matter.
    """
    ckpt = build_preset("mamba", "tiny", seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in ckpt.model.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.5, generator=g)
            layer.mixer.dt_proj.bias.uniform_(-3.0, 0.0, generator=g)
            layer.mixer.out_proj.weight.mul_(5.0)
    return ckpt


@pytest.fixture(scope="session")
def mamba_exports(tmp_path_factory):
    """lowering -> (checkpoint, exported folder) of the tiny Mamba preset, exported on first use."""
    from seqexport.families.mamba.export import export_mamba

    ckpt = mamba_tiny_that_depends_on_everything()
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
def rwkv_tiny(tmp_path_factory):
    """(checkpoint, exported folder) of the tiny RWKV-7 preset."""
    from seqexport.families.rwkv.export import export_rwkv

    ckpt = build_preset("rwkv", "tiny", seed=0)
    out = tmp_path_factory.mktemp("export") / "rwkv-tiny"
    export_rwkv(ckpt, "tiny", out)
    return ckpt, out


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
            elif family == "mamba":
                export_mamba(ckpt, None, out, scan="loop", tokenizer=tokenizer)
            else:
                from seqexport.export import export_model

                export_model(ckpt, None, out, tokenizer=tokenizer)
            made[family] = (ckpt, out)
        return made[family]

    return get


def sigint_as_a_terminal_sends_it() -> None:
    """Child side, before exec: SIGINT handled by default, also when the test run itself was
    started in the background (a shell starts background jobs with SIGINT ignored, and a
    Python started with it ignored never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
