"""The bundled date models through ONNX Runtime: the same tokens as eager, the recorded accuracy."""

import json

import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import InputError
from seqexport.training.dates import make_split
from seqexport.training.train import decode

N = 50


@pytest.mark.parametrize("family", ["transformer", "mamba"])
def test_onnx_greedy_matches_eager_and_recorded_accuracy(bundled_exports, family):
    ckpt, folder = bundled_exports(family)
    recorded = json.loads((ckpt.path / "config.json").read_text())["eval"]["exact_match"]
    pairs = make_split("test", N, seed=0)
    inputs = [x for x, _ in pairs]
    eager = decode(family, ckpt.model, inputs)  # eager greedy, independent of the runtime
    model = rt.load(folder, provider="cpu")
    ids = rt.generate(model, [model.encode(x) for x in inputs], rt.SearchOptions(max_new_tokens=16))  # framed as trained
    onnx = [model.tokenizer.decode(i) for i in ids]
    assert onnx == eager
    accuracy = sum(p == y for p, (_, y) in zip(onnx, pairs)) / N
    assert accuracy >= recorded - 0.02



def test_encode_takes_only_text(bundled_exports):
    model = rt.load(bundled_exports("mamba")[1], provider="cpu")
    for bad in (5, None, "", b"Mar 5", ["Mar 5"]):
        with pytest.raises(InputError, match="prompt text: expected a non-empty string, got"):
            model.encode(bad)


def test_generate_cli_text(bundled_exports):
    for family in ("transformer", "mamba"):
        _, folder = bundled_exports(family)
        result = CliRunner().invoke(cli, ["generate", str(folder), "--text", "Friday, March 5th 2021"])
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == "2021-03-05"
    result = CliRunner().invoke(cli, ["generate", str(folder), "--text", "5 March 2021", "--text", "Mar 6, 21"])
    assert result.stdout.split() == ["2021-03-05", "2021-03-06"]
