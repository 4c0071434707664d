"""A user's workflow end to end: a Hugging Face Mamba checkpoint -> export -> validate -> generate."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli

transformers = pytest.importorskip("transformers")


def test_hf_mamba_checkpoint_exports_validates_and_generates(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, state_size=8)
    hf = transformers.MambaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    out = tmp_path / "onnx"
    runner = CliRunner()
    result = runner.invoke(cli, ["export", "mamba", "--checkpoint", str(tmp_path / "hf"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["checkpoint"] == str((tmp_path / "hf").resolve())
    result = runner.invoke(cli, ["validate", str(out), "--steps", "6"])
    assert result.exit_code == 0, result.output
    # the runtime's greedy tokens are transformers' own greedy tokens
    prompt = [5, 17, 42, 8]
    model = rt.load(out)
    ours = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=8, eos_id=-1))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref
    assert np.isfinite(model.step(np.array([[1, 2]]), model.start(1))[0]).all()
