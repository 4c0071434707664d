"""The Mamba prefill's `logits_to_keep`: logits of the last N positions only (0: all), against the
eager model's full forward; generation asks for one, validate for all; exports without it run."""

import dataclasses

import numpy as np
import pytest
import torch

import seqexport.families.mamba.export as mamba_export
import seqexport.runtime as rt
from seqexport.families.mamba.specs import ATTENTION_MASK, INPUT_IDS, LOGITS, LOGITS_TO_KEEP
from seqexport.parity.validate import validate


def test_prefill_keeps_the_last_positions_asked_for(mamba_exports):
    ckpt, folder = mamba_exports("loop")
    model = rt.load(folder, provider="cpu")
    ids = np.random.default_rng(1).integers(0, model.vocab_size, (2, 23))
    with torch.no_grad():
        want, want_state = ckpt.model(torch.from_numpy(ids))  # (2, 23, v): every position
    graph = model.graphs["prefill"]
    zero = model.start(2).arrays
    states = None
    for keep, rows in ((0, 23), (1, 1), (5, 5), (23, 23), (100, 23)):
        out = graph.run({INPUT_IDS: ids, ATTENTION_MASK: np.ones_like(ids), **zero,
                         LOGITS_TO_KEEP: np.array([keep], np.int64)})
        assert out[LOGITS].shape == (2, rows, model.vocab_size)
        np.testing.assert_allclose(out[LOGITS], want[:, -rows:].numpy(), atol=1e-4, rtol=1e-4)
        new = [v for k, v in out.items() if k != LOGITS]
        if states is not None:  # the state does not depend on how many logits are kept
            for a, b in zip(states, new):
                np.testing.assert_array_equal(a, b)
        states = new
    np.testing.assert_allclose(states[1], want_state[0][1].numpy(), atol=1e-4, rtol=1e-4)


def test_runtime_asks_for_the_last_position_only(mamba_exports):
    ckpt, folder = mamba_exports("loop")
    model = rt.load(folder, provider="cpu")
    ids = np.random.default_rng(2).integers(0, model.vocab_size, (1, 40))
    last, state = model.step(ids, model.start(1), last_only=True)
    every, state_all = model.step(ids, model.start(1))
    with torch.no_grad():
        want, _ = ckpt.model(torch.from_numpy(ids))
    assert last.shape == (1, 1, model.vocab_size) and every.shape == (1, 40, model.vocab_size)
    np.testing.assert_allclose(last[:, 0], want[:, -1].numpy(), atol=1e-4, rtol=1e-4)
    for k in state.arrays:
        np.testing.assert_array_equal(state.arrays[k], state_all.arrays[k])


def without_keep(specs):
    """The graph specs as exported before `logits_to_keep` (every position's logits)."""
    out = {}
    for name, spec in specs.items():
        inputs = tuple(t for t in spec.inputs if t.role != "keep")
        length = spec.input(INPUT_IDS).dims[1]
        outputs = tuple(dataclasses.replace(t, dims=("batch", length, t.dims[2])) if t.name == LOGITS else t
                        for t in spec.outputs)
        out[name] = dataclasses.replace(spec, inputs=inputs, outputs=outputs)
    return out


def test_an_export_without_logits_to_keep_still_generates_and_validates(tmp_path, monkeypatch):
    from conftest import mamba_tiny_that_depends_on_everything

    specs_for = mamba_export.specs_for
    monkeypatch.setattr(mamba_export, "specs_for", lambda *a, **k: without_keep(specs_for(*a, **k)))
    out = mamba_export.export_mamba(mamba_tiny_that_depends_on_everything(), "tiny", tmp_path / "old")
    monkeypatch.undo()
    model = rt.load(out, provider="cpu")
    assert LOGITS_TO_KEEP not in model.specs["prefill"].input_names
    ids = np.arange(1, 12)[None] % model.vocab_size
    last, _ = model.step(ids, model.start(1), last_only=True)
    every, _ = model.step(ids, model.start(1))
    np.testing.assert_array_equal(last[:, 0], every[:, -1])
    assert validate(out, steps=4, write_summary=False).passed


@pytest.mark.parametrize("lowering", ["loop", "unrolled"])
def test_generation_through_the_kept_logits_equals_eager(mamba_exports, lowering):
    ckpt, folder = mamba_exports(lowering)
    model = rt.load(folder, provider="cpu")
    prompts = [[5, 9, 2, 7, 1, 3, 8, 4], [6, 6, 1]]
    got = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=6, eos_id=-1))
    from seqexport import families

    eager = families.eager_model(ckpt, None, cache=True)
    want = rt.generate(eager, prompts, rt.SearchOptions(max_new_tokens=6, eos_id=-1))
    assert [list(g) for g in got] == [list(w) for w in want]
