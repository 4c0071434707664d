"""validate --runtime openvino: the same checks with every graph compiled by OpenVINO's CPU plugin.

Every bundled model and the tiny preset of every family, float32, against the eager model. A graph
OpenVINO computes wrongly must fail: OpenVINO 2026.4.1 computes Mul -> ReduceSum(last axis) ->
Add(bias) wrongly for a batch above 1 (`miscompiles_conv_window`, judged against numpy on a
three-node graph), and Mamba's, Mamba-2's and the hybrid's step graphs compute their conv window
so: their step cases at batch 2 must fail there, and pass once OpenVINO computes it right.
"""

import functools
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from seqexport.checkpoints.presets import build_preset
from seqexport.cli import cli
from seqexport.errors import ArtifactError
from seqexport.manifest import sha256_file
from seqexport.parity.validate import validate
from seqexport.runtime.models import load
from tests.damage import damaged_copy

pytest.importorskip("openvino", reason="the openvino extra (make setup installs it)")

FAMILIES = ("transformer", "mamba", "rwkv", "mamba2", "hybrid")
# Mamba-2's default export uses ONNX Runtime's com.microsoft LinearAttention and CausalConvWithState,
# which OpenVINO cannot convert (refused: test_mamba2_default_export_is_refused_by_name); its plain-op
# form is what OpenVINO runs.
OPENVINO_FORM = {"mamba2": {"ssd": "matmul"}}
STEPS = 10  # decode steps of each validate (the default 20 in the figures of docs/parity.md)


@functools.cache
def miscompiles_conv_window(batch: int = 2) -> bool:
    """Whether OpenVINO's CPU plugin gets (x * w).sum(-1) + b wrong, x (batch, 16, 4), against numpy."""
    import openvino as ov

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]),
             helper.make_node("ReduceSum", ["m", "axes"], ["s"], keepdims=0),
             helper.make_node("Add", ["s", "b"], ["y"])]
    graph = helper.make_graph(nodes, "conv_window", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                               numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "conv_window.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = rng.standard_normal((batch, 16, 4)).astype(np.float32)
    return not np.allclose(compiled(x)[0], (x * w).sum(-1) + b, atol=1e-5)


def has_conv_window(graph_path) -> bool:
    """Whether a graph sums a product over its last axis and adds a bias (a conv window's step)."""
    nodes = onnx.load(str(graph_path), load_external_data=False).graph.node
    made_by = {out: n for n in nodes for out in n.output}
    return any(n.op_type == "Add" and any(made_by.get(i) is not None and made_by[i].op_type == "ReduceSum"
                                          and made_by.get(made_by[i].input[0]) is not None
                                          and made_by[made_by[i].input[0]].op_type == "Mul" for i in n.input)
               for n in nodes)


@pytest.fixture(scope="module")
def tiny(request, tmp_path_factory):
    """family -> exported folder of its tiny preset, exported on first use (the shared session
    fixtures' where there is one)."""
    from seqexport.export import export_model

    shared = {"transformer": lambda: request.getfixturevalue("transformer_tiny")[1],
              "mamba": lambda: request.getfixturevalue("mamba_exports")("loop")[1],
              "rwkv": lambda: request.getfixturevalue("rwkv_tiny")[1]}
    made = {}

    def get(family):
        if family in shared and family not in made:
            made[family] = shared[family]()
        if family not in made:
            torch.manual_seed(0)
            out = tmp_path_factory.mktemp("openvino") / f"{family}-tiny"
            export_model(build_preset(family, "tiny", seed=0), "tiny", out, **OPENVINO_FORM.get(family, {}))
            made[family] = out
        return made[family]

    return get


# OpenVINO's float32 error on the chunked SSD prefill, measured: the bundled Mamba-2's and hybrid's
# logits up to 5.1e-4 / 8.7e-4 off (needing atol 3.6e-4 / 2.5e-4 at rtol 1e-3; ONNX Runtime 1.4e-6),
# spread through the SSD rather than one wrong op. Past validate's 1e-4, under this.
PREFILL_DRIFT = 1e-3


def expect_openvino_report(report, folder) -> None:
    """PASS, unless OpenVINO miscompiles a conv window this export's step graph has: then the step
    graph's batch-2 cases fail (and may carry on into the batch-2 decodes), every batch-1 step passes,
    and a prefill case fails only by float error (PREFILL_DRIFT)."""
    bug = (folder / "step.onnx").exists() and has_conv_window(folder / "step.onnx") and miscompiles_conv_window()
    assert report.runtime.startswith("openvino ") and report.provider == "CPU"
    if not bug:
        assert report.passed, report.table()
        return
    failing = [c for c in report.cases if not c.passed]
    steps = [c.label for c in failing if c.check == "graphs" and c.label.startswith("step ")]
    assert steps and all(not label.startswith("step batch=1") for label in steps), report.table()
    prefill = [c for c in failing if c.check == "graphs" and not c.label.startswith("step ")]
    assert all(c.label.startswith("prefill ") and max(o.needed_atol for o in c.outputs) < PREFILL_DRIFT
               for c in prefill), report.table()
    assert all(c.check in ("graphs", "teacher_forced", "free_running") for c in failing)
    assert all("localisation runs on ONNX Runtime only" in c.note for c in failing if c.check == "graphs")


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_preset_on_openvino(tiny, family):
    folder = tiny(family)
    expect_openvino_report(validate(folder, runtime="openvino", steps=STEPS, write_summary=False), folder)


@pytest.fixture(scope="module")
def bundled(bundled_exports, tmp_path_factory):
    """family -> exported folder of its bundled model in the form OpenVINO runs (OPENVINO_FORM):
    the shared session fixture's export where that is the default form."""

    from seqexport.checkpoints import bundled as bundled_checkpoint
    from seqexport.checkpoints.io import load_checkpoint
    from seqexport.export import export_model

    made = {}

    def get(family):
        if family not in OPENVINO_FORM:
            return bundled_exports(family)[1]
        if family not in made:
            out = tmp_path_factory.mktemp("openvino-bundled") / family
            config = json.loads((bundled_checkpoint(family) / "config.json").read_text())
            export_model(load_checkpoint(bundled_checkpoint(family)), None, out, tokenizer=config["tokenizer"],
                         **OPENVINO_FORM[family])
            made[family] = out
        return made[family]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_bundled_model_on_openvino(bundled, family):
    folder = bundled(family)
    expect_openvino_report(validate(folder, runtime="openvino", steps=STEPS, write_summary=False), folder)


def test_conv_window_pattern_is_found_in_the_step_graphs(tiny):
    """The check above asks the right graphs: Mamba's step has the pattern, RWKV-7's has not."""
    assert has_conv_window(tiny("mamba") / "step.onnx")
    assert not has_conv_window(tiny("rwkv") / "step.onnx")


def test_cli_names_the_runtime_in_the_report(tiny, tmp_path):
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["validate", str(tiny("rwkv")), "--runtime", "openvino", "--steps", "4",
                                      "--report", str(report_path)])
    assert result.exit_code == 0, result.output
    assert "openvino 2026." in result.output and "result: PASS" in result.output
    report = json.loads(report_path.read_text())
    assert report["runtime"].startswith("openvino ") and report["provider"] == "CPU" and report["passed"]


def test_perturbed_weight_fails_on_openvino(tiny, tmp_path):
    bad = damaged_copy(tiny("transformer"), tmp_path, "decoder", "model.decoder.layers.1.ffn.fc1.bias")
    report_path = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["validate", str(bad), "--runtime", "openvino", "--steps", "6",
                                      "--report", str(report_path)])
    assert result.exit_code == 1, result.output
    report = json.loads(report_path.read_text())
    failing = [c for c in report["checks"]["graphs"]["cases"] if not c["passed"]]
    assert failing and all(c["label"].startswith("decoder") for c in failing)  # the encoder is untouched
    assert any(o["name"] == "logits" and not o["passed"] for o in failing[0]["outputs"])
    assert not report["checks"]["teacher_forced"]["passed"]
    assert "decoder batch=" in result.output and "logits" in result.output


def with_unconvertible_op(folder, tmp_path):
    """A copy whose decoder's logits pass through com.microsoft.Inverse (an ONNX Runtime contrib op
    OpenVINO has no conversion for), its manifest re-hashed."""
    out = tmp_path / "contrib-op"
    shutil.copytree(folder, out)
    model = onnx.load(str(out / "decoder.onnx"), load_external_data=False)
    producer = next(n for n in model.graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "logits_before"
    model.graph.node.append(helper.make_node("Inverse", ["logits_before"], ["logits"], domain="com.microsoft"))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(out / "decoder.onnx"))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["graphs"]["decoder"]["sha256"] = sha256_file(out / "decoder.onnx")
    manifest["graphs"]["decoder"]["bytes"] = (out / "decoder.onnx").stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_op_openvino_cannot_convert_is_refused_by_name(tiny, tmp_path):
    bad = with_unconvertible_op(tiny("transformer"), tmp_path)
    with pytest.raises(ArtifactError, match=r"graph 'decoder': OpenVINO .* no conversion for com\.microsoft\.Inverse "
                                            r"\(an ONNX Runtime-only op\); validate it with --runtime onnxruntime"):
        load(bad, runtime="openvino")
    result = CliRunner().invoke(cli, ["validate", str(bad), "--runtime", "openvino"])
    assert result.exit_code == 2
    assert "com.microsoft.Inverse" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.slow
def test_mamba2_default_export_is_refused_by_name(bundled_exports):
    """The bundled Mamba-2 exported as by default (ONNX Runtime's fused kernels): one clear refusal."""
    with pytest.raises(ArtifactError, match=r"graph 'prefill': OpenVINO .* no conversion for "
                                            r"com\.microsoft\.CausalConvWithState, com\.microsoft\.LinearAttention"):
        load(bundled_exports("mamba2")[1], runtime="openvino")


def test_openvino_outputs_equal_onnx_runtime_step_by_step(tiny):
    """The runner feeds and returns numpy like ONNX Runtime's: a 7-step RWKV-7 decode, logits and
    the fed-back state, on both runtimes (the state returned by one run feeds the next)."""
    folder = tiny("rwkv")
    ort_model, ov_model = load(folder, provider="cpu"), load(folder, runtime="openvino")
    tokens = np.random.default_rng(1).integers(1, ort_model.vocab_size, (3, 7))
    s_ort, s_ov = ort_model.start(3), ov_model.start(3)
    got_ort, got_ov = [], []  # compared at the end: each step's outputs must be its own arrays
    for t in range(tokens.shape[1]):
        a, s_ort = ort_model.step(tokens[:, t : t + 1], s_ort)
        b, s_ov = ov_model.step(tokens[:, t : t + 1], s_ov)
        got_ort.append(a)
        got_ov.append(b)
    for a, b in zip(got_ort, got_ov):
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-3)
    for name, arr in s_ort.arrays.items():
        np.testing.assert_allclose(s_ov.arrays[name], arr, atol=1e-4, rtol=1e-3)


def test_cuda_provider_is_refused_for_openvino(tiny):
    from seqexport.errors import UsageError

    with pytest.raises(UsageError, match="provider 'cuda' with runtime 'openvino'"):
        load(tiny("rwkv"), provider="cuda", runtime="openvino")
