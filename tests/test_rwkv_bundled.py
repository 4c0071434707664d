"""The bundled RWKV-7 date model (models/pretrained/rwkv-dates) through ONNX Runtime: the same
tokens as eager greedy decoding, the recorded held-out accuracy, `generate --text`; and its
float16 export (WKV state float32) keeps the accuracy."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.checkpoints import bundled, load_checkpoint
from seqexport.cli import cli
from seqexport.families.rwkv.export import export_rwkv
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.training.dates import make_split
from seqexport.training.train import decode

N = 50


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """dtype -> exported folder of the bundled checkpoint (made on first use)."""
    ckpt = load_checkpoint(bundled("rwkv"))
    record = json.loads((ckpt.path / "config.json").read_text())["tokenizer"]
    made = {}

    def get(dtype):
        if dtype not in made:
            made[dtype] = tmp_path_factory.mktemp("bundled") / f"rwkv-{dtype}"
            export_rwkv(ckpt, None, made[dtype], dtype=dtype, tokenizer=record)
        return made[dtype]

    return ckpt, get


def onnx_decode(folder, inputs):
    model = rt.load(folder, provider="cpu")
    record = model.manifest["tokenizer"]
    prompts = [encode_prompt(model.tokenizer, model.prompt_frame, x, record) for x in inputs]
    return [model.tokenizer.decode(i) for i in rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=16))]


def test_onnx_greedy_matches_eager_and_the_recorded_accuracy(exports):
    ckpt, get = exports
    recorded = json.loads((ckpt.path / "config.json").read_text())["eval"]["exact_match"]
    assert recorded >= 0.99
    pairs = make_split("test", N, seed=0)
    inputs = [x for x, _ in pairs]
    onnx = onnx_decode(get("float32"), inputs)
    assert onnx == decode("rwkv", ckpt.model, inputs)  # eager greedy, independent of the runtime
    assert sum(p == y for p, (_, y) in zip(onnx, pairs)) / N >= recorded - 0.02


def test_generate_text(exports):
    _, get = exports
    result = CliRunner().invoke(cli, ["generate", str(get("float32")), "--text", "Friday, March 5th 2021",
                                      "--text", "Mar 6, 21"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["2021-03-05", "2021-03-06"]


def test_float16_export_keeps_the_wkv_state_float32_and_the_accuracy(exports):
    _, get = exports
    folder = get("float16")
    model = rt.load(folder, provider="cpu")
    assert model.specs["step"].input("past_wkv_state.0").dtype == "float32"
    assert model.specs["step"].input("past_att_shift.0").dtype == "float16"
    _, state = model.step(np.array([[1, 40, 50, 60]]), model.start(1))
    assert state.arrays["past_wkv_state.1"].dtype == np.float32
    pairs = make_split("test", N, seed=0)
    onnx = onnx_decode(folder, [x for x, _ in pairs])
    assert sum(p == y for p, (_, y) in zip(onnx, pairs)) / N >= 0.96
