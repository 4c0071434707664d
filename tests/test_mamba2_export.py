"""Mamba-2 export end to end from checkpoints in transformers' layout (`Mamba2ForCausalLM`,
n_groups 1 and 2, Δ pushed to softplus ≈ 1–3) and in state-spaces' layout: the exported graphs
through the torch-free runtime against transformers' own model (its torch path), prompts of 1,
17 and 300 tokens then 20 single steps, right-padded rows of unequal length in one prefill,
validate (and its layer localisation on a damaged copy), generation, and bad input."""

import json

import numpy as np
import onnx
import pytest
import torch
import transformers
from click.testing import CliRunner
from safetensors.torch import save_file

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.parity.validate import validate
from tests.damage import damaged_copy

V = 100
TOL = 1e-4


def hf_model(ngroups: int, seed: int = 0) -> transformers.Mamba2ForCausalLM:
    torch.manual_seed(seed)
    config = transformers.Mamba2Config(
        hidden_size=64, num_hidden_layers=3, vocab_size=V, state_size=16, conv_kernel=4, expand=2,
        head_dim=16, num_heads=8, n_groups=ngroups, chunk_size=16, tie_word_embeddings=False)
    model = transformers.Mamba2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.backbone.layers:
            m = layer.mixer
            dt = torch.rand(8) * 2 + 1  # softplus(dt + dt_bias) ≈ 1..3
            m.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            m.A_log.copy_(torch.log(torch.rand(8) * 0.5 + 0.05))
            m.conv1d.bias.normal_(0, 0.2)
            m.out_proj.weight.mul_(3.0)  # every layer matters to the logits
    return model


def export(folder, out, *extra):
    result = CliRunner().invoke(cli, ["export", "mamba2", "--checkpoint", str(folder), "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return rt.load(out, provider="cpu", threads=1)


@pytest.fixture(scope="module", params=[1, 2], ids=["ngroups1", "ngroups2"])
def exported(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"mamba2-g{request.param}")
    hf = hf_model(request.param)
    hf.save_pretrained(tmp / "hf")
    return hf, export(tmp / "hf", tmp / "export"), tmp / "export"


def hf_decode(model, prompt: torch.Tensor, steps: torch.Tensor):
    """transformers' prefill then single steps feeding its cache back: logits of the prompt's
    last token then of each step (b, 1 + n, v), and each layer's final (conv, ssm) states."""
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        cache, logits = out.cache, [out.logits[:, -1:]]
        for token in steps.T:
            out = model(token[:, None], cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits)
    states = [(cache.layers[i].conv_states[0].numpy(), cache.layers[i].recurrent_states[0].numpy())
              for i in range(len(model.backbone.layers))]
    return torch.cat(logits, 1).numpy(), states

def assert_decode_equals_transformers(hf, m, length: int, seed: int) -> None:
    """Two random prompts of `length` prefilled through the export, then 20 single steps: every
    logit and the final conv and SSM states equal transformers' own decode within TOL."""
    g = torch.Generator().manual_seed(seed)
    prompt, steps = torch.randint(0, V, (2, length), generator=g), torch.randint(0, V, (2, 20), generator=g)
    want, want_states = hf_decode(hf, prompt, steps)
    logits, state = m.step(prompt.numpy(), m.start(2), last_only=True)  # (2, 1, v)
    got = [logits[:, 0]]
    for token in steps.T:
        logits, state = m.step(token.numpy(), state)
        got.append(logits)
    np.testing.assert_allclose(np.stack(got, 1), want, atol=TOL, rtol=0)
    for i, (conv, ssm) in enumerate(want_states):
        np.testing.assert_allclose(state.arrays[f"past_conv_state.{i}"], conv, atol=TOL, rtol=0)
        np.testing.assert_allclose(state.arrays[f"past_ssm_state.{i}"], ssm, atol=TOL, rtol=0)



def test_graphs_declare_the_state_and_no_per_token_loop(exported):
    _, m, out = exported
    graph = onnx.load(str(out / "prefill.onnx"), load_external_data=False).graph
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq_len"]
    assert not [n.op_type for n in graph.node if n.op_type in ("Scan", "Loop")]  # the SSD as matrix products
    spec = m.specs["step"]
    c = m.config
    d_in = c["expand"] * c["d_model"]
    assert spec.input("past_conv_state.0").dims == ("batch", d_in + 2 * c["ngroups"] * c["d_state"], c["d_conv"])
    assert spec.input("past_ssm_state.2").dims == ("batch", d_in // c["headdim"], c["headdim"], c["d_state"])
    assert spec.input("past_ssm_state.2").dtype == "float32"
    assert ("present_ssm_state.1", "past_ssm_state.1") in spec.feeds


@pytest.mark.parametrize("length", [1, 17, 300])
def test_prefill_then_20_steps_equal_transformers(exported, length):
    hf, m, _ = exported
    assert_decode_equals_transformers(hf, m, length, seed=length)


def test_right_padded_rows_in_one_prefill_equal_each_row_alone(exported):
    hf, m, _ = exported
    g = np.random.default_rng(5)
    rows = [list(map(int, g.integers(0, V, n))) for n in (17, 3, 40, 2, 33)]
    assert m.ragged_prefill
    logits, state = m.begin(rows)  # rows of two tokens or more: one prefill run, right-padded
    for r, row in enumerate(rows):
        want, want_states = hf_decode(hf, torch.tensor([row]), torch.zeros((1, 0), dtype=torch.long))
        np.testing.assert_allclose(logits[r], want[0, -1], atol=TOL, rtol=0)
        for i, (conv, ssm) in enumerate(want_states):
            np.testing.assert_allclose(state.arrays[f"past_conv_state.{i}"][r], conv[0], atol=TOL, rtol=0)
            np.testing.assert_allclose(state.arrays[f"past_ssm_state.{i}"][r], ssm[0], atol=TOL, rtol=0)


def test_greedy_generation_equals_transformers(exported):
    hf, m, _ = exported
    prompts = [[5, 9, 13, 4], [7, 3], [11, 12, 13, 14, 15, 16, 17], [8]]
    got = rt.generate(m, prompts, rt.SearchOptions(max_new_tokens=10, eos_id=-1))
    hf.generation_config.eos_token_id = None
    for p, ours in zip(prompts, got):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert ours == want[0, len(p):].tolist()


def test_validate_passes(exported):
    _, _, out = exported
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "result: PASS" in result.output


@pytest.mark.parametrize("graph", ["prefill", "step"])
def test_a_damaged_layer_1_weight_fails_and_names_layer_1(exported, tmp_path, graph):
    _, _, out = exported
    bad = damaged_copy(out, tmp_path, graph, "model.backbone.layers.1.mixer.conv1d.bias", delta=0.5)
    report = validate(bad, steps=4, write_summary=False)
    assert not report.passed
    failing = [c for c in report.cases if c.check == "graphs" and not c.passed]
    assert failing and all(c.label.startswith(graph) for c in failing)
    assert failing[0].divergence.layer == "backbone.layers.1"


def test_state_spaces_layout_exports_and_equals_transformers(tmp_path):
    """The same weights as state-spaces writes them: ssm_cfg names the Mamba2 layer, the
    vocabulary padded 100 -> 112, keys under `backbone.embedding`."""
    hf = hf_model(1, seed=3)
    state = {k.replace("backbone.embeddings.", "backbone.embedding."): v.clone() for k, v in hf.state_dict().items()}
    for key in ("backbone.embedding.weight", "lm_head.weight"):
        state[key] = torch.cat([state[key], torch.zeros(12, 64)])  # padded rows, never in the logits
    c = hf.config
    folder = tmp_path / "ss"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "d_model": 64, "d_intermediate": 0, "n_layer": 3, "vocab_size": V, "pad_vocab_size_multiple": 16,
        "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True, "tie_embeddings": False,
        "ssm_cfg": {"layer": "Mamba2", "d_state": 16, "d_conv": 4, "expand": 2, "headdim": 16, "ngroups": 1,
                    "chunk_size": 16}, "attn_layer_idx": [], "attn_cfg": {}}))
    m = export(folder, tmp_path / "export")
    assert m.config["vocab_size"] == V and c.n_groups == 1
    prompt, steps = torch.randint(0, V, (1, 23)), torch.randint(0, V, (1, 5))
    want, _ = hf_decode(hf, prompt, steps)
    logits, state = m.step(prompt.numpy(), m.start(1), last_only=True)
    got = [logits[:, 0]]
    for token in steps.T:
        logits, state = m.step(token.numpy(), state)
        got.append(logits)
    np.testing.assert_allclose(np.stack(got, 1), want, atol=TOL, rtol=0)


def test_mamba1_and_mamba2_configs_are_each_claimed_by_one_family():
    from seqexport import families

    assert families.detect({"model_type": "mamba2", "hidden_size": 8}).name == "mamba2"
    assert families.detect({"model_type": "mamba", "hidden_size": 8}).name == "mamba"
    assert families.detect({"d_model": 8, "n_layer": 2, "ssm_cfg": {"layer": "Mamba2"}}).name == "mamba2"
    assert families.detect({"d_model": 8, "n_layer": 2, "ssm_cfg": {}}).name == "mamba"
    assert families.detect({"d_model": 8, "n_layer": 2}).name == "mamba"


@pytest.mark.parametrize("config, message", [
    ({"model_type": "mamba2", "hidden_size": 64}, "num_hidden_layers"),
    ({"d_model": 64, "n_layer": 2, "vocab_size": 50, "attn_layer_idx": [1], "ssm_cfg": {"layer": "Mamba2"}},
     "attn_layer_idx"),
])
def test_an_unsupported_or_incomplete_layout_is_one_line_exit_2(tmp_path, config, message):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, folder / "model.safetensors")
    result = CliRunner().invoke(cli, ["export", "mamba2", "--checkpoint", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_bench_times_the_step_and_the_prefill_against_eager(exported):
    from seqexport.bench.run import run_bench

    _, _, out = exported
    result = run_bench(out, provider="cpu", fast=True, contexts=(3, 17))
    assert result["family"] == "mamba2" and [p["length"] for p in result["prefills"]] == [3, 17]
    assert all(row["ort_ms"] > 0 and row["eager_ms"] > 0 for row in result["steps"])
    assert len(set(result["state_bytes"].values())) == 1  # one size whatever the context
