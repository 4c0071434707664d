"""`seqexport export mamba2 --ssd linear-attention`: the conv and the SSD as ONNX
Runtime's com.microsoft CausalConvWithState and LinearAttention(update_rule="gated") kernels,
against transformers' own `Mamba2ForCausalLM` (its torch path) on the random tiny configs of
tests/test_mamba2_export.py (n_groups 1 and 2, softplus(Δ) ≈ 1–3): prompts of 1, 17 and 300
tokens then 20 single steps, right-padded rows in one prefill, the artifact's state layout
unchanged, validate, and a bad --ssd. `--ssd matmul` (plain ONNX ops) against transformers
too."""

import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from seqexport.cli import cli
from seqexport.errors import UsageError
from tests.test_mamba2_export import (
    TOL,
    V,
    assert_decode_equals_transformers,
    export,
    hf_decode,
    hf_model,
)


@pytest.fixture(scope="module", params=[1, 2], ids=["ngroups1", "ngroups2"])
def exported(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"mamba2-la-g{request.param}")
    hf = hf_model(request.param)
    hf.save_pretrained(tmp / "hf")
    return hf, export(tmp / "hf", tmp / "export", "--ssd", "linear-attention"), tmp / "export"


def _ops(path) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_both_graphs_use_the_fused_kernels_and_keep_the_state_layout(exported):
    _, m, out = exported
    for graph in ("prefill", "step"):
        ops = _ops(out / f"{graph}.onnx")
        assert ops.count(("com.microsoft", "LinearAttention")) == 3, graph  # one per layer
        assert ops.count(("com.microsoft", "CausalConvWithState")) == 3, graph
        assert not [op for _, op in ops if op in ("Scan", "Loop", "Conv")], graph
    c = m.config
    h, conv_dim = c["expand"] * c["d_model"] // c["headdim"], c["expand"] * c["d_model"] + 2 * c["ngroups"] * c["d_state"]
    for graph in ("prefill", "step"):
        spec = m.specs[graph]
        assert spec.input("past_conv_state.1").dims == ("batch", conv_dim, c["d_conv"])
        assert spec.input("past_ssm_state.1").dims == ("batch", h, c["headdim"], c["d_state"])
        assert spec.output("present_ssm_state.1").dtype == "float32"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["export_options"]["ssd"] == "linear-attention"


@pytest.mark.parametrize("length", [1, 17, 300])
def test_prefill_then_20_steps_equal_transformers(exported, length):
    hf, m, _ = exported
    assert_decode_equals_transformers(hf, m, length, seed=100 + length)


def test_right_padded_rows_in_one_prefill_equal_each_row_alone(exported):
    hf, m, _ = exported
    g = np.random.default_rng(6)
    rows = [list(map(int, g.integers(0, V, n))) for n in (17, 3, 70, 2, 33)]
    logits, state = m.begin(rows)  # one prefill run, right-padded
    for r, row in enumerate(rows):
        want, want_states = hf_decode(hf, torch.tensor([row]), torch.zeros((1, 0), dtype=torch.long))
        np.testing.assert_allclose(logits[r], want[0, -1], atol=TOL, rtol=0)
        for i, (conv, ssm) in enumerate(want_states):
            np.testing.assert_allclose(state.arrays[f"past_conv_state.{i}"][r], conv[0], atol=TOL, rtol=0)
            np.testing.assert_allclose(state.arrays[f"past_ssm_state.{i}"][r], ssm[0], atol=TOL, rtol=0)


def test_validate_passes(exported):
    _, _, out = exported
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "result: PASS" in result.output


def test_the_fused_mixers_equal_the_model_and_leave_it_as_it_was():
    from seqexport.models.mamba2 import Mamba2Config, Mamba2LM

    from seqexport.families.mamba2.linear_attention import linear_attention_mixers

    torch.manual_seed(0)
    model = Mamba2LM(Mamba2Config(n_layer=2, ngroups=2)).eval()
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        want, _ = model(ids)
        with linear_attention_mixers(model.backbone.layers):
            fused, _ = model(ids)
        after, _ = model(ids)
    assert all("forward" not in layer.mixer.__dict__ and "step" not in layer.mixer.__dict__
               for layer in model.backbone.layers)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(after, want, atol=0, rtol=0)


def test_a_bad_ssd_form_is_one_line_exit_2(tmp_path):
    hf_model(1).save_pretrained(tmp_path / "hf")
    result = CliRunner().invoke(cli, ["export", "mamba2", "--checkpoint", str(tmp_path / "hf"),
                                      "--out", str(tmp_path / "o"), "--ssd", "scan"])
    assert result.exit_code == 2 and "scan" in result.output and "linear-attention" in result.output
    assert not (tmp_path / "o").exists()
    from seqexport.checkpoints.io import load_checkpoint
    from seqexport.families.mamba2.export import export_mamba2

    with pytest.raises(UsageError, match="'scan'.*matmul, linear-attention"):
        export_mamba2(load_checkpoint(tmp_path / "hf"), None, tmp_path / "o", ssd="scan")
    assert not (tmp_path / "o").exists()


def test_the_matmul_form_has_no_fused_kernel_and_equals_transformers(tmp_path):
    hf = hf_model(2)
    hf.save_pretrained(tmp_path / "hf")
    m = export(tmp_path / "hf", tmp_path / "export", "--ssd", "matmul")
    for graph in ("prefill", "step"):
        assert not [op for domain, op in _ops(tmp_path / "export" / f"{graph}.onnx") if domain], graph
    assert_decode_equals_transformers(hf, m, 150, seed=7)
    rows = [list(map(int, np.random.default_rng(8).integers(0, V, n))) for n in (70, 3, 20)]
    logits, state = m.begin(rows)  # right-padded in one prefill
    for r, row in enumerate(rows):
        want, _ = hf_decode(hf, torch.tensor([row]), torch.zeros((1, 0), dtype=torch.long))
        np.testing.assert_allclose(logits[r], want[0, -1], atol=TOL, rtol=0)

