"""A hand-built graph with transformers.js' recurrent state names (past_conv.{i} with a k-1 conv
window, past_ssm.{i} transposed, present_conv/present_ssm), made from a tiny random transformers
Mamba by our exporter and onnx.helper (tests/foreign_graphs.py), validated through its adapter
against transformers' MambaForCausalLM; a copy with one weight moved by +-1e-2 fails."""

import json
import shutil

import pytest
from click.testing import CliRunner

from seqexport.cli import cli
from tests.foreign_graphs import TRANSFORMERS_JS, our_prefill, perturbed_copy, rewire, shared_root


@pytest.fixture(scope="module")
def tjs(tmp_path_factory, worker_id):
    """(reference checkpoint, the transformers.js-style folder: model.onnx + config.json)."""
    root = shared_root(tmp_path_factory, worker_id, "foreign-mamba")
    ckpt, ours = our_prefill(root)
    folder = rewire(ours / "prefill.onnx", tmp_path_factory.mktemp("tjs") / "mamba-tjs", TRANSFORMERS_JS)
    shutil.copy(ckpt / "config.json", folder / "config.json")
    return ckpt, folder


def test_inspect_names_the_adapter_kinds_and_layouts(tjs):
    _, folder = tjs
    result = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 0, result.output
    assert "adapter transformers_js (decoder)" in result.output
    assert "past_conv.1 <- present_conv.1 (replaced, conv_window)" in result.output
    assert "past_ssm.0 <- present_ssm.0 (replaced, ssm_transposed)" in result.output


def test_passes_against_transformers_mamba(tjs, tmp_path):
    ckpt, folder = tjs
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(ckpt), "--steps", "12",
                                      "--report", str(report_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert "MambaForCausalLM" in report["family"]
    case = report["checks"]["teacher_forced"]["cases"][0]
    assert "calls [3, 1, 4, 1, 2, 3" in case["label"]  # several tokens a call from a past
    outs = {o["name"]: o for o in case["outputs"]}
    for i in range(2):  # the state through its layout: the conv's last k-1 positions, the SSM transposed back
        assert outs[f"final past_conv.{i}"]["shape"] == [2, 64, 3] and outs[f"final past_conv.{i}"]["passed"]
        assert outs[f"final past_ssm.{i}"]["shape"] == [2, 64, 8] and outs[f"final past_ssm.{i}"]["passed"]
    print({n: o["max_abs"] for n, o in outs.items()})


def test_without_the_config_the_transposed_state_is_not_taken_for_transformers(tjs, tmp_path):
    """No config.json: the adapter cannot tell the SSM state is transposed and says it differs (the
    layout is what makes the state comparable)."""
    ckpt, folder = tjs
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare, ignore=shutil.ignore_patterns("config.json"))
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["validate", str(bare), "--reference", str(ckpt), "--steps", "4",
                                      "--report", str(report_path)])
    assert result.exit_code == 1, result.output
    outs = {o["name"]: o for o in json.loads(report_path.read_text())["checks"]["teacher_forced"]["cases"][0]["outputs"]}
    assert outs["logits (all positions)"]["passed"]  # the graph is right ...
    assert not outs["final past_ssm.0"]["passed"] and outs["final past_ssm.0"]["shape"] == [2, 8, 64]  # ... its layout unknown


def test_a_perturbed_copy_fails(tjs, tmp_path):
    ckpt, folder = tjs
    bad = perturbed_copy(folder, tmp_path / "bad")
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["validate", str(bad), "--reference", str(ckpt), "--steps", "12",
                                      "--report", str(report_path)])
    assert result.exit_code == 1, result.output
    report = json.loads(report_path.read_text())
    assert not report["checks"]["teacher_forced"]["passed"]
    assert "first diverging position 0: call 0" in result.output
    print({o["name"]: o["max_abs"] for o in report["checks"]["teacher_forced"]["cases"][0]["outputs"]})


def test_nan_fails(tjs, tmp_path):
    """A weight of NaN: the logits compare as NaN (a failure whatever the tolerance) and the
    free-running rows stop at their first NaN logits."""
    ckpt, folder = tjs
    bad = perturbed_copy(folder, tmp_path / "nan", delta=float("nan"))
    result = CliRunner().invoke(cli, ["validate", str(bad), "--reference", str(ckpt), "--steps", "4",
                                      "--atol", "1e9"])
    assert result.exit_code == 1, result.output
    assert "NaN/Inf" in result.output and "artifact NaN/Inf logits" in result.output
