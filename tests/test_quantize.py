"""`seqexport quantize`: an int8 copy the runtime runs unchanged, judged by validate's int8 rule,
as accurate as float32 on the bundled models' held-out dates; bad requests are one line, exit 2."""

import json

import onnx
import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import UsageError
from seqexport.export.quantize import quantize
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.training.dates import make_split

N = 100  # held-out dates here; the closing note's figures use 1000


def exact_match(folder, pairs) -> float:
    model = rt.load(folder, provider="cpu")
    prompts = [encode_prompt(model.tokenizer, model.prompt_frame, x, model.manifest["tokenizer"]) for x, _ in pairs]
    out = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=16))
    return sum(model.tokenizer.decode(o) == y for o, (_, y) in zip(out, pairs)) / len(pairs)


def float_graph_bytes(folder, name) -> int:
    """A float32 graph's file plus the bytes it reads from the export's shared weights file."""
    m = json.loads((folder / "manifest.json").read_text())
    g = m["graphs"][name]
    graph = onnx.load(str(folder / g["file"]), load_external_data=False)
    stored = (m.get("weights") or {}).get("tensors", {})
    return g["bytes"] + g.get("data_bytes", 0) + sum(stored[t.name]["length"] for t in graph.graph.initializer
                                                     if t.data_location == onnx.TensorProto.EXTERNAL)


@pytest.mark.parametrize("family", ["transformer", "mamba"])
def test_int8_copy_validates_and_keeps_the_accuracy(bundled_exports, tmp_path, family):
    _, folder = bundled_exports(family)
    out = quantize(folder, tmp_path / "int8")
    m = json.loads((out / "manifest.json").read_text())
    q = m["quantization"]
    assert q["mode"] == "dynamic" and q["weights"] == "int8" and q["source"]["folder"] == str(folder.resolve())
    for name, g in m["graphs"].items():
        assert g["bytes"] < float_graph_bytes(folder, name)
    logits_graph = "decoder" if family == "transformer" else "step"
    assert len(q["kept_float"][logits_graph]) == (1 if family == "transformer" else 2 * m["config"]["n_layer"] + 1)
    # transformer: the head; mamba: the head and every layer's x_proj and dt_proj (they make Δ, B, C)
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "12"])
    assert result.exit_code == 0, result.output
    assert "int8: top-1 agreement" in result.output
    pairs = make_split("test", N, seed=0)
    assert abs(exact_match(out, pairs) - exact_match(folder, pairs)) <= 0.02


def test_bad_requests_are_one_line_exit_2(bundled_exports, tmp_path):
    _, folder = bundled_exports("transformer")
    int8 = quantize(folder, tmp_path / "int8")
    runner = CliRunner()
    for args, message in (
        (["quantize", str(int8), "--out", str(tmp_path / "again")], "is already quantised"),
        (["quantize", str(folder), "--out", str(tmp_path / "x"), "--mode", "static"], "'static' is not 'dynamic'"),
        (["quantize", str(folder), "--out", str(tmp_path / "y"), "--exclude", "decoder.nothing.*"],
         "--exclude 'decoder.nothing.*' matches no weight MatMul/Gemm"),
        (["quantize", str(folder), "--out", str(int8)], "already exists"),
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "y").exists() and not (tmp_path / "x").exists()
    with pytest.raises(UsageError, match="unknown quantisation mode"):
        quantize(folder, tmp_path / "z", mode="static")


def test_exclude_keeps_the_matching_weights_float(bundled_exports, tmp_path):
    _, folder = bundled_exports("transformer")
    out = quantize(folder, tmp_path / "int8", exclude=["decoder.layers.0.ffn.*"], per_channel=True)
    kept = json.loads((out / "manifest.json").read_text())["quantization"]["kept_float"]["decoder"]
    assert len(kept) == 3  # fc1, fc2 of layer 0 and the head
