"""The transformer's self-attention cache as an appended buffer (seqexport.state.appended):
written in place, grown when full, never changed under an earlier state, rows at different
positions in one call (join/take) — each checked against the unmodified eager model's full
forward. And an artifact exported before `past_lengths` (its decoder concatenates) still runs
and validates."""

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from seqexport.models.transformer import generate_mask, padding_mask

import seqexport.runtime as rt
from seqexport.checkpoints.io import load_checkpoint
from seqexport.cli import cli
from seqexport.errors import InputError
from seqexport.families.transformer.specs import PAST_LENGTHS, past_kv

CONCAT_ARTIFACT = Path(__file__).parent / "data" / "transformer-tiny-concat-cache"


def full_forward_last(model, src: list[int], tgt: list[int]) -> np.ndarray:
    """Logits (v,) of the last target position: the whole sequence through `forward`, no cache."""
    s, t = torch.tensor([src]), torch.tensor([tgt])
    with torch.no_grad():
        mask = padding_mask(s)
        return model(s, t, src_mask=mask, tgt_mask=generate_mask(t.shape[1]), memory_mask=mask)[0, -1].numpy()


@pytest.fixture(scope="module")
def loaded(transformer_tiny):
    ckpt, out = transformer_tiny
    return ckpt.model, rt.load(out)


def test_branching_from_an_earlier_state_changes_nothing_it_holds(loaded):
    """Stepping one state twice (two continuations) must not write into what the first one holds."""
    model, m = loaded
    src = [4, 9, 13]
    _, s0 = m.begin([src], start_id=1)
    _, s1 = m.step([7], s0)  # s0 -> s1 writes slot 1 in place
    _, s2 = m.step([8], s0)  # s0 again: must copy, not overwrite slot 1 under s1
    after1, _ = m.step([5], s1)
    after2, _ = m.step([5], s2)
    np.testing.assert_allclose(after1[0], full_forward_last(model, src, [1, 7, 5]), atol=1e-4)
    np.testing.assert_allclose(after2[0], full_forward_last(model, src, [1, 8, 5]), atol=1e-4)


def test_the_cache_grows_past_its_capacity_and_matches_the_full_forward(loaded):
    model, m = loaded
    src, tgt = [3, 5, 8, 13, 21], list(np.random.default_rng(0).integers(1, 100, 150))
    logits, state = m.begin([src], start_id=1)
    first_capacity = state.arrays[past_kv(0, "decoder", "key")].shape[2]
    for n in (1, 60, 89):  # chunks crossing the buffer's capacity
        chunk, tgt = tgt[:n], tgt[n:]
        logits, state = m.step(np.array([chunk]), state)
    fed = [1] + [int(x) for x in np.random.default_rng(0).integers(1, 100, 150)]
    assert state.arrays[PAST_LENGTHS].tolist() == [151] and state.length == 151
    assert state.arrays[past_kv(1, "decoder", "value")].shape[2] > 151 > first_capacity
    np.testing.assert_allclose(logits[0, -1], full_forward_last(model, src, fed), atol=1e-4)


def test_join_and_take_rows_at_different_positions(loaded):
    """Rows with sources of 2, 7 and 4 tokens at positions 6, 1 and 3 share one call; after a
    row leaves, the rest go on unchanged; each row equals its own full forward."""
    model, m = loaded
    rng = np.random.default_rng(1)
    rows = [(list(rng.integers(1, 100, n)), [1] + list(rng.integers(1, 100, p - 1))) for n, p in ((2, 6), (7, 1), (4, 3))]
    states = []
    for src, tgt in rows:
        _, st = m.begin([src], start_id=1)
        if len(tgt) > 1:
            _, st = m.step(np.array([tgt[1:]]), st)
        states.append(st)
    joined = m.join(states)
    assert joined.arrays[PAST_LENGTHS].tolist() == [6, 1, 3]
    nxt = rng.integers(1, 100, 3)
    logits, joined = m.step(nxt, joined)
    for r, (src, tgt) in enumerate(rows):
        tgt.append(int(nxt[r]))
        np.testing.assert_allclose(logits[r], full_forward_last(model, src, tgt), atol=1e-4)
    left = m.take(joined, [2, 0])  # the 7-token source leaves: sources trimmed to 4
    assert left.arrays["encoder_attention_mask"].shape == (2, 4)
    nxt = rng.integers(1, 100, 2)
    logits, _ = m.step(nxt, left)
    for i, r in enumerate((2, 0)):
        src, tgt = rows[r]
        np.testing.assert_allclose(logits[i], full_forward_last(model, src, tgt + [int(nxt[i])]), atol=1e-4)


def test_lengths_beyond_the_cache_are_refused(loaded):
    _, m = loaded
    _, state = m.begin([[4, 5]], start_id=1)
    capacity = state.arrays[past_kv(0, "decoder", "key")].shape[2]
    bad = rt.State(state.arrays | {PAST_LENGTHS: np.array([capacity + 1])}, capacity + 1)
    with pytest.raises(InputError, match=r"past_lengths: expected one count per row in \[0, \d+\]"):
        m.step([3], bad)


def test_an_artifact_whose_decoder_concatenates_runs_and_validates(tmp_path):
    """Exported before past_lengths (tests/data, made by the seqexport of that time): it loads,
    decodes what the full forward gives, joins rows only at one position, and validates."""
    folder = tmp_path / "old"
    shutil.copytree(CONCAT_ARTIFACT, folder)
    m = rt.load(folder)
    assert not m.continuous_batching and m.specs["decoder"].lengths is None
    model = load_checkpoint(folder / "checkpoint").model
    prompts = [[5, 6, 7, 8], [9, 3]]
    got = rt.generate(m, prompts, rt.SearchOptions(max_new_tokens=5, start_id=1, eos_id=-1))
    for src, tokens in zip(prompts, got):
        tgt = [1]
        for tok in tokens:
            assert tok == int(full_forward_last(model, src, tgt).argmax())
            tgt.append(tok)
    _, a = m.begin([prompts[0]], start_id=1)
    _, b = m.begin([prompts[1]], start_id=1)
    assert m.join([a, b]).arrays["encoder_attention_mask"].shape == (2, 4)  # same position: joins
    _, a2 = m.step([3], a)
    with pytest.raises(InputError, match="predates past_lengths"):
        m.join([a2, b])
    result = CliRunner().invoke(cli, ["validate", str(folder), "--steps", "4"])
    assert result.exit_code == 0, result.output


def test_cache_layouts_compare_side_by_side(transformer_tiny):
    """scripts/bench_kv_cache.py's measurement: both layouts timed at each context, bounds from
    the valid cache only (what a step must read), whatever the buffer's spare slots."""
    from seqexport.families.transformer.bench import compare_cache_layouts, step_linear_shapes

    r = compare_cache_layouts({"appended": transformer_tiny[1], "concat": CONCAT_ARTIFACT}, (4, 70),
                              threads=1, repeats=1, sample_s=0.01)
    c = transformer_tiny[0].config
    per_slot = c.num_layers * 2 * c.n_heads * c.head_dim * 4  # one position's K and V, float32
    for row in r["rows"]:
        assert row["appended_ms"] > 0 and row["concat_ms"] > 0
        src = 32  # the sources behind the step
        cross = per_slot * src + src * 8  # cross K/V + the mask (int64)
        assert row["moved_bytes"]["concat"] == per_slot * row["context"] + cross
        assert row["moved_bytes"]["appended"] == per_slot * row["context"] + cross + 8  # + past_lengths
        gbs = r["bandwidth"]["gbs"]
        assert row["appended_bound_ms"] == pytest.approx((r["weights_bytes"] + row["moved_bytes"]["appended"]) / gbs / 1e6)
        # the floor of bench.attention: the linears alone plus the state read once at that bandwidth
        floor = r["linears_only_ms"] + row["moved_bytes"]["appended"] / gbs / 1e6
        assert row["appended_floor_ms"] == pytest.approx(floor)
        assert row["appended_over_floor"] == pytest.approx(row["appended_ms"] / floor)
    # the linears-only floor: every linear the step runs, whose weights are the bound's weights
    model = transformer_tiny[0].model
    norms = sum(p.numel() for n, p in model.decoder.named_parameters() if ".norm." in n)
    assert sum(4 * (n * k + n) for n, k in step_linear_shapes(model)) + 4 * norms == r["weights_bytes"]
    assert r["linears_only_ms"] > 0


def test_linear_chain_computes_each_linear():
    """The GEMV floor times real Gemms: each output is x @ Wᵀ + b of its own input (numpy)."""
    from onnx import numpy_helper

    from seqexport.bench.gemv_floor import linear_chain

    model = linear_chain([(5, 3), (2, 5), (4, 3)])
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal((1, i.shape[1]), np.float32) for i in session.get_inputs()}
    outs = session.run(None, feeds)
    for i, (x, y) in enumerate(zip(["x3", "x5", "x3"], outs)):
        np.testing.assert_allclose(y, feeds[x] @ weights[f"w{i}"].T + weights[f"b{i}"], rtol=1e-5, atol=1e-6)


def test_profile_script_shows_the_decoder_step(transformer_tiny):
    """scripts/profile_prefill.py on a transformer profiles the decoder step at a context: its
    fused nodes count as top-level (not as a Loop body's), and its linears show as Gemm."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "scripts" / "profile_prefill.py"), str(transformer_tiny[1]),
                          "--length", "40", "--threads", "1", "--runs", "2", "--top", "40"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "decoder L=40" in out.stdout
    top, body = out.stdout.split("inside Loop/Scan bodies")
    assert "Gemm" in top and "MatMul" in top
    assert body.strip() == ", by operator type:"  # the decoder has no Loop or Scan
