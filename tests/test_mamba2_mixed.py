"""`seqexport export mamba2 --ssd mixed` (the default): the prefill of `--ssd linear-attention`
and the lean step of `lean_step` (the conv as CausalConvWithState, the SSM update as one
LinearAttention node on the state in its own (b, h, p, n) layout, the read-out a MatMul, the
RMSNorms in the form ORT fuses), against transformers on the tiny random configs of
tests/test_mamba2_export.py (n_groups 1 and 2); the lean step against the model's own step in
torch; and the runtime's rule that a one-token graph packs the weights it shares."""

import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from seqexport.models.mamba2 import Mamba2Config, Mamba2LM

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.families.mamba2 import lean_step
from tests.test_mamba2_export import (
    V,
    assert_decode_equals_transformers,
    export,
    hf_model,
)


@pytest.fixture(scope="module", params=[1, 2], ids=["ngroups1", "ngroups2"])
def exported(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"mamba2-mixed-g{request.param}")
    hf = hf_model(request.param)
    hf.save_pretrained(tmp / "hf")
    return hf, export(tmp / "hf", tmp / "export"), tmp / "export"  # the default --ssd


def _graph(path) -> onnx.GraphProto:
    return onnx.load(str(path), load_external_data=False).graph


def test_the_default_is_mixed_and_the_step_never_transposes_the_state(exported):
    _, _, out = exported
    assert json.loads((out / "manifest.json").read_text())["export_options"]["ssd"] == "mixed"
    prefill, step = _graph(out / "prefill.onnx"), _graph(out / "step.onnx")
    for graph in (prefill, step):
        ops = [(n.domain, n.op_type) for n in graph.node]
        assert ops.count(("com.microsoft", "LinearAttention")) == 3
        assert ops.count(("com.microsoft", "CausalConvWithState")) == 3
    # the step's LinearAttention reads each past SSM state as it is and writes the present one
    attention = [n for n in step.node if n.op_type == "LinearAttention"]
    assert sorted(n.input[3] for n in attention) == [f"past_ssm_state.{i}" for i in range(3)]
    assert sorted(n.output[1] for n in attention) == [f"present_ssm_state.{i}" for i in range(3)]
    assert not [n.op_type for n in step.node if n.op_type in ("Transpose", "Where", "Greater", "Reciprocal")]
    # the prefill's kernels see the state transposed: (b, h, n, p)
    assert [n.op_type for n in prefill.node].count("Transpose") >= 6


@pytest.mark.parametrize("length", [1, 17, 300])
def test_prefill_then_20_steps_equal_transformers(exported, length):
    hf, m, _ = exported
    assert_decode_equals_transformers(hf, m, length, seed=200 + length)


def test_validate_passes(exported):
    _, _, out = exported
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "result: PASS" in result.output


@pytest.mark.parametrize("ngroups, norm_before_gate, vocab, fused", [
    (1, False, 100, False), (2, False, 100, True), (2, True, 90, False), (1, True, 90, True)])
def test_the_lean_step_equals_the_model_step(ngroups, norm_before_gate, vocab, fused):
    """In torch (the custom ops' eager forms): every branch of `lean_step` — groups, the gate
    before or after the norm, a head padded past the vocabulary, plain or fused ops."""
    torch.manual_seed(ngroups)
    config = Mamba2Config(d_model=64, n_layer=2, d_state=16, headdim=16, expand=2, ngroups=ngroups, d_conv=4,
                          vocab_size=vocab, pad_vocab_size_multiple=16, dt_max_limit=2.5)
    model = Mamba2LM(config).eval()
    for layer in model.backbone.layers:
        layer.mixer.norm.norm_before_gate = norm_before_gate
    state = [(torch.randn_like(c), torch.randn_like(s)) for c, s in model.allocate_inference_cache(3)]
    ids = torch.randint(0, vocab, (3, 1))
    with torch.no_grad():
        want, want_state = model.step(ids, state)
        got, got_state = lean_step.step(model, ids, state, fused)
    assert got.shape == (3, 1, vocab)
    torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=0)
    for (c1, s1), (c2, s2) in zip(got_state, want_state, strict=True):
        torch.testing.assert_close(c1, c2, atol=1e-5, rtol=0)
        torch.testing.assert_close(s1, s2, atol=1e-5, rtol=0)


def _packs(graph) -> bool:
    try:
        return graph.session.get_session_options().get_session_config_entry("session.disable_prepacking") != "1"
    except Exception:  # noqa: BLE001 - never set: packing is on
        return True


def test_a_large_models_step_packs_the_weights_it_shares_and_its_prefill_reads_the_pages(exported, monkeypatch):
    """Prefill and step share every weight. Past PACK_SHARED_BYTES only the one-token graph packs
    (its MatMuls are matrix-vector products, re-packed every call otherwise), up to
    PACK_STEP_BYTES; past that neither does. The numbers are the same either way."""
    import seqexport.runtime.session as session

    _, _, out = exported
    ids, token = np.arange(9)[None] % V, np.array([3])

    def decode(model):
        _, state = model.step(ids, model.start(1), last_only=True)
        return model.step(token, state)[0]

    small = rt.load(out, provider="cpu", threads=1)
    assert _packs(small.graphs["prefill"]) and _packs(small.graphs["step"])  # a few KB: both pack
    monkeypatch.setattr(session, "PACK_SHARED_BYTES", 0)  # as if the weights were large
    large = rt.load(out, provider="cpu", threads=1)
    assert not _packs(large.graphs["prefill"]) and _packs(large.graphs["step"])
    monkeypatch.setattr(session, "PACK_STEP_BYTES", 0)  # as if past the step's limit too
    huge = rt.load(out, provider="cpu", threads=1)
    assert not _packs(huge.graphs["prefill"]) and not _packs(huge.graphs["step"])
    want = decode(small)
    np.testing.assert_allclose(decode(large), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(decode(huge), want, atol=1e-5, rtol=0)
