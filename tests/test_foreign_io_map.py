"""--io-map on a graph no adapter recognises (tests/foreign_graphs.py: a tiny transformers Mamba's
step graph with opaque names state{i}_conv_in/out, state{i}_ssm_in/out, tokens -> scores, a k-1
conv window and a transposed SSM state): PASS against transformers' MambaForCausalLM with a
correct map; one clear line and exit 2 for a malformed map or one naming a missing input."""

import json

import pytest
from click.testing import CliRunner

from seqexport.cli import cli
from tests.foreign_graphs import OPAQUE, our_prefill, rewire, shared_root


@pytest.fixture(scope="module")
def opaque(tmp_path_factory, worker_id):
    root = shared_root(tmp_path_factory, worker_id, "foreign-mamba")
    ckpt, ours = our_prefill(root)
    return ckpt, rewire(ours / "prefill.onnx", tmp_path_factory.mktemp("opaque") / "mamba-opaque", OPAQUE)


def io_map(ssm_layout="ssm_transposed", **step_changes) -> dict:
    state = []
    for i in range(2):
        state.append({"layer": i, "part": "conv", "input": f"state{i}_conv_in", "output": f"state{i}_conv_out",
                      "kind": "replaced", "layout": "conv_window"})
        state.append({"layer": i, "part": "ssm", "input": f"state{i}_ssm_in", "output": f"state{i}_ssm_out",
                      "kind": "replaced", "layout": ssm_layout})
    step = {"file": "model.onnx", "inputs": {"input_ids": "tokens"}, "outputs": {"logits": "scores"},
            "state": state} | step_changes
    return {"architecture": "decoder", "step": step}


def run(folder, ckpt, tmp_path, mapping, *extra):
    path = tmp_path / "map.json"
    path.write_text(mapping if isinstance(mapping, str) else json.dumps(mapping))
    return CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(ckpt), "--io-map", str(path),
                                    "--steps", "10", *extra])


def one_line_exit_2(result, *fragments):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.strip().count("\n") == 0, result.output
    for f in fragments:
        assert f in result.output, result.output


def test_no_adapter_recognises_it(opaque):
    ckpt, folder = opaque
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(ckpt)])
    one_line_exit_2(result, "no adapter recognises it", "--io-map")


def test_a_correct_map_passes(opaque, tmp_path):
    ckpt, folder = opaque
    report = tmp_path / "report.json"
    result = run(folder, ckpt, tmp_path, io_map(), "--report", str(report))
    assert result.exit_code == 0, result.output
    got = json.loads(report.read_text())
    assert got["adapter"] == "io_map"
    outs = {o["name"]: o["max_abs"] for o in got["checks"]["teacher_forced"]["cases"][0]["outputs"]}
    assert set(outs) >= {f"final state{i}_{p}_in" for i in range(2) for p in ("conv", "ssm")}
    print(outs)


def test_the_map_decides_how_state_is_compared(opaque, tmp_path):
    """The same graph with the SSM layout left out of the map: the logits agree, the state does not."""
    ckpt, folder = opaque
    result = run(folder, ckpt, tmp_path, io_map(ssm_layout=""))
    assert result.exit_code == 1, result.output
    assert "final state0_ssm_in" in result.output


def test_inspect_shows_the_map(opaque, tmp_path):
    _, folder = opaque
    path = tmp_path / "map.json"
    path.write_text(json.dumps(io_map()))
    result = CliRunner().invoke(cli, ["inspect", str(folder), "--io-map", str(path)])
    assert result.exit_code == 0, result.output
    assert "adapter io_map (decoder)" in result.output
    assert "state0_ssm_in <- state0_ssm_out (replaced, ssm_transposed)" in result.output


@pytest.mark.parametrize("mapping, fragments", [
    ("{not json", ["not JSON"]),
    ("[1, 2]", ["expected an object with \"step\""]),
    (io_map(file="other.onnx"), ["graph file 'other.onnx' is not in"]),
    (io_map(inputs={"input_ids": "tokens", "colour": "x"}), ["input role 'colour'"]),
    (io_map(max_tokens=0), ["max_tokens: expected a positive integer"]),
    (io_map(chunk_rows=0), ["chunk_rows: expected a positive integer or null, got 0"]),
    (io_map(dims=["batch"]), ["dims: expected an object of symbolic axis -> size"]),
    ({"architecture": "decoder", "step": {"file": "model.onnx", "inputs": {"input_ids": "tokens"},
                                          "outputs": {"logits": "scores"},
                                          "state": [{"layer": 0, "part": "ssm", "input": "state0_ssm_in",
                                                     "output": "state0_ssm_out", "kind": "rolling"}]}},
     ["kind 'rolling'", "appended"]),
    ({"step": {"file": "model.onnx", "inputs": {"input_ids": "tokens"}, "outputs": {"logits": "scores"},
               "state": [{"layer": 0, "part": "ssm"}]}}, ["state[0]: expected an object with layer, part"]),
    ({"step": {"file": "model.onnx", "inputs": {"input_ids": "tokens"}}}, ["step needs inputs.input_ids and outputs.logits"]),
])
def test_a_malformed_map_is_one_line_exit_2(opaque, tmp_path, mapping, fragments):
    ckpt, folder = opaque
    one_line_exit_2(run(folder, ckpt, tmp_path, mapping), "--io-map", *fragments)


def test_a_map_naming_a_missing_input(opaque, tmp_path):
    ckpt, folder = opaque
    mapping = io_map()
    mapping["step"]["state"][3]["input"] = "state9_ssm_in"
    one_line_exit_2(run(folder, ckpt, tmp_path, mapping), "input 'state9_ssm_in'", "is not in the graph",
                    "state1_ssm_in")


@pytest.mark.parametrize("output, fragments", [
    ("state9_ssm_out", ["state ssm of layer 1: output 'state9_ssm_out', which feeds 'state1_ssm_in' next call, "
                        "is not in the graph; its outputs are ['scores', "]),
    ("state1_ssm_in", ["output 'state1_ssm_in', which feeds 'state1_ssm_in' next call, is not in the graph"]),
    ("scores", ["output 'scores' (float32 ['batch', 'seq_len', ", "cannot feed input 'state1_ssm_in' (float32 ['batch', ",
                "expected the input's dtype and shape"]),
    ("state0_conv_out", ["output 'state0_conv_out' (float32 ['batch', ", "cannot feed input 'state1_ssm_in'"]),
])
def test_a_state_output_that_cannot_feed_its_input_is_refused_with_the_map(opaque, tmp_path, output, fragments):
    """A state's output missing from the graph, or of another shape than its input, was found
    only mid-decode (after "validating ...": a message blaming ONNX Runtime's inputs): now when
    the map is read, one line naming the state, both tensors and their shapes."""
    ckpt, folder = opaque
    mapping = io_map()
    mapping["step"]["state"][3]["output"] = output
    result = run(folder, ckpt, tmp_path, mapping)
    one_line_exit_2(result, "--io-map", *fragments)
    assert "ONNX Runtime" not in result.output


def test_a_graph_input_the_map_leaves_out(opaque, tmp_path):
    """A state input the map does not name has no value to feed: one line naming it."""
    ckpt, folder = opaque
    mapping = io_map()
    del mapping["step"]["state"][3]
    one_line_exit_2(run(folder, ckpt, tmp_path, mapping), "input 'state1_ssm_in' has no role", "--io-map")


def test_a_missing_map_file(opaque, tmp_path):
    ckpt, folder = opaque
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(ckpt), "--io-map",
                                      str(tmp_path / "none.json")])
    one_line_exit_2(result, "cannot read it")


def test_a_state_tensor_the_reference_has_no_counterpart_for_fails(opaque, tmp_path):
    """A map placing a state tensor at a layer the reference does not have: nothing to compare
    it with is a failure naming the tensor, not a tensor left out of the check."""
    ckpt, folder = opaque
    mapping = io_map()
    mapping["step"]["state"][3]["layer"] = 7  # the reference has 2 layers
    result = run(folder, ckpt, tmp_path, mapping)
    assert result.exit_code == 1, result.output
    assert "the reference has no state to compare state1_ssm_in (layer 7 ssm) with (it holds layers [0, 1], " \
           "parts ['conv', 'ssm'])" in result.output, result.output
    assert "final state1_ssm_in" in result.output and "final state0_ssm_in" not in result.output
