"""RWKV-7 export end to end from a BlinkDL-layout `.pth` (bf16, as the releases ship, with the
first layer's unused value-residual LoRA): `seqexport export rwkv --checkpoint x.pth`, each
graph against the eager model, a 50-token decode against the full forward, validate (and its
layer localisation on a damaged copy), the runtime's generation paths, `generate --text` with
the World tokenizer. (float16: tests/test_rwkv_bundled.py.)"""

import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from seqexport.models.rwkv import RwkvConfig, RwkvLM

import seqexport.runtime as rt
from seqexport.checkpoints import load_checkpoint
from seqexport.cli import cli
from seqexport.parity.validate import validate
from tests.damage import damaged_copy

# the World vocabulary, so the checkpoint reads text with the World tokenizer; small otherwise
CONFIG = dict(n_embd=32, n_layer=2, vocab_size=65536, head_size=8)
EOS = 0


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """A random RWKV-7 written as BlinkDL releases it: one bf16 .pth, no config."""
    torch.manual_seed(3)
    model = RwkvLM(RwkvConfig(**CONFIG))
    state = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    c, rank = CONFIG["n_embd"], model.blocks[1].att.v1.shape[1]
    state |= {"blocks.0.att.v0": torch.ones(1, 1, c), "blocks.0.att.v1": torch.zeros(c, rank),
              "blocks.0.att.v2": torch.zeros(rank, c)}  # in the releases, unused by layer 0
    path = tmp_path_factory.mktemp("pth") / "RWKV-x070-test.pth"
    torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def exported(pth, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "rwkv"
    result = CliRunner().invoke(cli, ["export", "rwkv", "--checkpoint", str(pth), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return load_checkpoint(pth).model, rt.load(out, provider="cpu", threads=1), out


def test_pth_checkpoint_is_read_with_sizes_from_its_tensors(pth):
    ckpt = load_checkpoint(pth)
    assert ckpt.family == "rwkv" and ckpt.config.n_layer == 2 and ckpt.config.n_head == 4
    saved = torch.load(pth, weights_only=True)
    assert torch.equal(ckpt.model.blocks[1].att.r_k, saved["blocks.1.att.r_k"].float())


def test_graphs_declare_state_io_and_dynamic_dims(exported):
    _, m, out = exported
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["graphs"]) == {"prefill", "step"} and manifest["tokenizer"]["type"] == "rwkv"
    graph = onnx.load(str(out / "prefill.onnx"), load_external_data=False).graph
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq_len"]
    assert sum(n.op_type == "Scan" for n in graph.node) == 2  # one WKV Scan a layer
    assert graph.input[-1].name == "logits_to_keep"
    spec = m.specs["step"]
    assert [t.name for t in spec.state_inputs][:3] == ["past_att_shift.0", "past_wkv_state.0", "past_ffn_shift.0"]
    assert ("present_wkv_state.1", "past_wkv_state.1") in spec.feeds


@pytest.mark.parametrize("batch, length", [(1, 1), (3, 37)])
def test_prefill_from_a_nonzero_state_then_step_match_eager(exported, batch, length):
    model, m, _ = exported
    g = np.random.default_rng(batch)
    ids = g.integers(0, 65536, (batch, 5))
    _, state = m.step(ids, m.start(batch))  # a non-zero state to start from
    more = g.integers(0, 65536, (batch, length))
    logits, state = m.step(more, state)
    with torch.no_grad():
        ref, ref_state = model(torch.from_numpy(np.concatenate([ids, more], 1)))
    np.testing.assert_allclose(logits, ref[:, 5:].numpy(), atol=1e-4, rtol=1e-3)
    for i, layer in enumerate(ref_state):
        for kind, t in zip(("att_shift", "wkv_state", "ffn_shift"), layer, strict=True):
            np.testing.assert_allclose(state.arrays[f"past_{kind}.{i}"], t.numpy(), atol=1e-4, rtol=1e-3)
    assert state.arrays["past_wkv_state.0"].dtype == np.float32 and state.length == 5 + length


def test_50_steps_after_prefill_match_the_full_forward(exported):
    model, m, _ = exported
    ids = np.random.default_rng(0).integers(0, 65536, (2, 50 + 20))
    logits, state = m.step(ids[:, :20], m.start(2), last_only=True)  # the head at one position
    assert logits.shape == (2, 1, 65536)
    steps = [logits[:, -1]]
    for t in range(20, 70):
        logits, state = m.step(ids[:, t], state)
        steps.append(logits)
    with torch.no_grad():
        ref, _ = model(torch.from_numpy(ids))
    np.testing.assert_allclose(np.stack(steps[:-1], 1), ref[:, 19:69].numpy(), atol=1e-4, rtol=1e-3)
    np.testing.assert_allclose(steps[-1], ref[:, 69].numpy(), atol=1e-4, rtol=1e-3)


def test_validate_passes(exported):
    _, _, out = exported
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "result: PASS" in result.output


def test_a_damaged_prefill_fails_and_names_the_layer(exported, tmp_path):
    _, _, out = exported
    bad = damaged_copy(out, tmp_path, "prefill", "model.blocks.1.att.w1", delta=0.5)
    report = validate(bad, steps=4, write_summary=False)
    assert not report.passed
    failing = [c for c in report.cases if c.check == "graphs" and not c.passed]
    assert failing and all(c.label.startswith("prefill") for c in failing)
    assert failing[0].divergence.layer == "blocks.1"
    assert failing[0].divergence.module.startswith("blocks.1.att")


def eager_greedy(model, prompt, max_new):
    seq, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new):
            tok = int(model(torch.tensor([seq]))[0][0, -1].argmax())
            if tok == EOS:
                break
            out.append(tok)
            seq.append(tok)
    return out


PROMPTS = [[5, 9, 13, 4], [7, 3], [11, 12, 13, 14, 15, 16, 17], [8]]


def test_greedy_batch_of_unequal_prompts_equals_eager_each_alone(exported):
    model, m, _ = exported
    got = rt.generate(m, PROMPTS, rt.SearchOptions(max_new_tokens=8, eos_id=EOS))
    assert got == [eager_greedy(model, p, 8) for p in PROMPTS]


def test_sampling_is_seeded_and_streaming_yields_the_tokens(exported):
    _, m, _ = exported
    opts = rt.SearchOptions(max_new_tokens=6, do_sample=True, top_k=50, seed=7, eos_id=EOS)
    a = rt.generate(m, PROMPTS, opts)
    assert a == rt.generate(m, PROMPTS, opts)
    assert a != rt.generate(m, PROMPTS, rt.SearchOptions(max_new_tokens=6, do_sample=True, seed=8, eos_id=EOS))
    steps = list(rt.stream(m, PROMPTS, opts))
    assert [[int(t) for t in col if t >= 0 and t != EOS] for col in np.array(steps).T] == a


def test_generate_text_uses_the_world_tokenizer(exported):
    _, m, out = exported
    result = CliRunner().invoke(cli, ["generate", str(out), "--text", "Köln 東京", "--max-new-tokens", "5"])
    assert result.exit_code == 0, result.output
    prompt = m.tokenizer.encode("Köln 東京")
    tokens = rt.generate(m, [prompt], rt.SearchOptions(max_new_tokens=5))[0]
    assert m.tokenizer.decode(tokens) in result.output


@pytest.mark.parametrize("content, message", [
    ({"a": torch.zeros(2)}, "tensor names are not those of a rwkv model"),
    ({"emb.weight": torch.zeros(10, 8), "blocks.0.att.r_k": torch.zeros(2, 4), "blocks.0.att.k_a": torch.zeros(1, 1, 8),
      "head.weight": torch.zeros(10, 8)}, "missing ['blocks.0.ffn.key.weight'"),
    # bytes that are no torch file at all: was "not a torch pickle" from torch.load's KeyError, and
    # an empty file torch's EOFError with an empty message
    (b"hello", "not a torch checkpoint (neither the zip archive torch.save writes nor a pickle; it starts b'hell')"),
    (b"", "cannot read weights"),
    (b"PK\x03\x04 a zip that is not one", "failed reading zip archive"),
])
def test_a_bad_pth_is_one_line_exit_2(tmp_path, content, message):
    path = tmp_path / "bad.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    result = CliRunner().invoke(cli, ["export", "rwkv", "--checkpoint", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    if content == b"":
        assert result.output.strip().endswith("bad.pth: the file is empty"), result.output
