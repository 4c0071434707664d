"""A user's workflow end to end: a Hugging Face Mamba (or Falcon-Mamba) checkpoint -> export -> validate -> generate."""

import json

import numpy as np
import pytest
import torch
import transformers  # the independent Mamba reference: a missing package must fail, not skip
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli


@pytest.mark.parametrize("architecture", ["Mamba", "FalconMamba"])
def test_hf_mamba_checkpoint_exports_validates_and_generates(tmp_path, architecture):
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{architecture}Config")(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                                         state_size=8)
    hf = getattr(transformers, f"{architecture}ForCausalLM")(cfg).eval()
    # transformers' init leaves the conv bias at 0 and Δ ≈ 1e-3: perturbed so that a dropped
    # conv bias or a wrong Δ changes the tokens
    with torch.no_grad():
        for layer in hf.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.5)
            layer.mixer.dt_proj.bias.uniform_(-3.0, 0.0)
            layer.mixer.out_proj.weight.mul_(5.0)
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
    prompt = [5, 17, 42, 8, 60, 3, 91, 11, 29, 77, 40, 2, 13, 88, 54, 19, 6, 33]  # > one scan chunk
    model = rt.load(out)
    ours = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=8, eos_id=-1))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref
    assert len(set(ours)) > 2  # the tokens say something: not one token repeated
    assert np.isfinite(model.step(np.array([[1, 2]]), model.start(1))[0]).all()


@pytest.mark.parametrize("command", ["mamba", "hybrid"])
def test_a_layout_no_family_reads_is_refused_naming_it_and_the_layouts_read(tmp_path, command):
    """A MiniMax-Text checkpoint (lightning attention beside softmax attention; no family reads
    it): exit 2, its model_type named, and every family's public layouts listed (not only Mamba's)."""
    cfg = transformers.MiniMaxConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=8, intermediate_size=64, num_local_experts=4,
                                     num_experts_per_tok=2, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    transformers.MiniMaxForCausalLM(cfg).save_pretrained(tmp_path / "minimax")
    result = CliRunner().invoke(cli, ["export", command, "--checkpoint", str(tmp_path / "minimax"),
                                      "--out", str(tmp_path / "onnx")])
    assert result.exit_code == 2, result.output
    assert "model_type 'minimax'" in result.output and "Traceback" not in result.output
    for read in ("'falcon_mamba'", "'mamba2'", "'granitemoehybrid'", "'nemotron_h'", "'lfm2'", "'jamba'",
                 "RWKV-7 weights file"):
        assert read in result.output, read
    assert not (tmp_path / "onnx").exists()
