"""A branch (stepping an earlier state again) copies an appended cache once, into buffers an
earlier branch let go (seqexport.state.appended.CopyPool), never into memory a state or a view
still holds; a dropped state frees its buffers at once (no reference cycle waiting for the gc);
and the benchmarks time the advancing step on a state they own, the branch beside it. Judged
with plain numpy on the kinds, and on a tiny transformer export against its eager model's full
forward."""

import gc
import weakref

import numpy as np
import pytest

import seqexport.runtime as rt
from seqexport.bench.branch import branch_vs_advance, main
from seqexport.bench.cases import advancing_step, branch_step, regenerate_step
from seqexport.bench.run import format_table, run_bench
from seqexport.families.hybrid.specs import graph_specs as hybrid_specs
from seqexport.state.appended import CopyPool
from seqexport.state.layout import StateLayout
from seqexport.state.state import State
from tests.test_state_layout import HYBRID, KEY, filled
from tests.test_transformer_cache import full_forward_last


@pytest.fixture
def layout():
    return StateLayout.of(hybrid_specs(HYBRID)["step"])


def _step(layout, state: State, value: float) -> State:
    """One token written at each row's length (every appended buffer gets `value`)."""
    arrays, writer, counts = layout.writable(state, 1)
    rows = arrays[KEY].shape[0]
    new = {n: np.full((rows, 2, 1, 5), value, np.float32) for n in layout.axes}
    return layout.append(dict(arrays), writer, new, counts, 1)


def test_a_branch_reuses_the_buffers_a_dropped_branch_held(layout):
    prompt = filled(layout, 1, [6], 0)
    kept = {n: prompt.arrays[n].copy() for n in layout.axes}
    first = _step(layout, prompt, 1.0)  # in place: the prompt's buffers, slot 6
    branch = _step(layout, prompt, 2.0)  # the prompt again: copied
    address = branch.arrays[KEY].ctypes.data
    assert not np.shares_memory(branch.arrays[KEY], first.arrays[KEY])
    del branch
    again = _step(layout, prompt, 3.0)
    assert again.arrays[KEY].ctypes.data == address  # the dropped branch's buffer, written again
    np.testing.assert_array_equal(again.arrays[KEY][0, :, :6], kept[KEY][0, :, :6])
    assert (again.arrays[KEY][0, :, 6] == 3).all() and (first.arrays[KEY][0, :, 6] == 1).all()


def test_a_buffer_a_state_or_a_view_holds_is_never_reused(layout):
    prompt = filled(layout, 1, [6], 1)
    _step(layout, prompt, 1.0)
    held = _step(layout, prompt, 2.0)
    view = _step(layout, prompt, 3.0).arrays[KEY][:, :1]  # the state is gone, a view of its buffer is not
    others = [_step(layout, prompt, 4.0 + i) for i in range(3)]
    for other in others:
        assert not np.shares_memory(other.arrays[KEY], held.arrays[KEY])
        assert not np.shares_memory(other.arrays[KEY], view)
    assert (held.arrays[KEY][0, :, 6] == 2).all() and (view[0, :, 6] == 3).all()


def test_once_the_newer_states_are_let_go_an_earlier_one_writes_in_place(layout):
    prompt = filled(layout, 1, [6], 3)
    kept = prompt.arrays[KEY].copy()
    first = _step(layout, _step(layout, prompt, 1.0), 1.5)  # a continuation of two steps
    del first  # let go ("regenerate"): nothing newer than the prompt is held
    again = _step(layout, prompt, 2.0)
    assert np.shares_memory(again.arrays[KEY], prompt.arrays[KEY]) and layout.pool._held == []
    np.testing.assert_array_equal(again.arrays[KEY][0, :, :6], kept[0, :, :6])
    assert (again.arrays[KEY][0, :, 6] == 2).all()


def test_a_held_state_between_keeps_the_earlier_one_copying(layout):
    prompt = filled(layout, 1, [6], 4)
    middle = _step(layout, prompt, 1.0)  # held
    newest = _step(layout, middle, 1.5)
    del newest  # the newest is gone, but `middle` still reads slot 6
    branch = _step(layout, prompt, 2.0)
    assert not np.shares_memory(branch.arrays[KEY], middle.arrays[KEY])
    assert (middle.arrays[KEY][0, :, 6] == 1).all() and (branch.arrays[KEY][0, :, 6] == 2).all()


def test_the_pool_keeps_at_most_its_branches_worth():
    pool = CopyPool(keep=2)
    src = {"a": np.ones((2, 3)), "b": np.zeros((4,))}
    live = [pool.copies(src) for _ in range(5)]  # five branches held at once
    held = sum(a.nbytes for a in pool._held)
    assert held <= 2 * sum(a.nbytes for a in src.values())
    assert all(np.array_equal(c["a"], src["a"]) and c["a"] is not src["a"] for c in live)
    del live
    pool.copies(src)  # the next branch takes one set of the free buffers and lets the rest go
    assert sum(a.nbytes for a in pool._held) == sum(a.nbytes for a in src.values())


def test_a_dropped_state_frees_its_buffers_without_the_gc(layout):
    gc.disable()
    try:
        state = _step(layout, filled(layout, 1, [4], 2), 1.0)
        buffer = weakref.ref(state.arrays[KEY])
        del state
        assert buffer() is None
    finally:
        gc.enable()


@pytest.fixture(scope="module")
def loaded(transformer_tiny):
    ckpt, out = transformer_tiny
    return ckpt.model, rt.load(out)


def test_regenerating_from_one_state_matches_the_full_forward(loaded):
    """Three continuations from one prompt state, one after another (each branch reusing the
    buffers the one before let go), and one held while the next is made."""
    model, m = loaded
    src = [4, 9, 13, 2]
    _, prompt = m.begin([src], start_id=1)
    for tokens in ([7, 5, 3], [8, 8, 1], [6, 2, 9]):
        state, logits = prompt, None
        for t in tokens:
            logits, state = m.step([t], state)
        np.testing.assert_allclose(logits[0], full_forward_last(model, src, [1, *tokens]), atol=1e-4)
    _, held = m.step([11], prompt)
    logits, _ = m.step([12], prompt)
    np.testing.assert_allclose(logits[0], full_forward_last(model, src, [1, 12]), atol=1e-4)
    logits, _ = m.step([3], held)
    np.testing.assert_allclose(logits[0], full_forward_last(model, src, [1, 11, 3]), atol=1e-4)


def test_the_advancing_step_writes_in_place_and_the_branch_copies(transformer_tiny):
    m = rt.load(transformer_tiny[1])  # its own pool
    _, prompt = m.begin([[4, 9, 13]], start_id=1)
    lengths = prompt.arrays["past_lengths"].copy()
    advance, branch = advancing_step(m, np.array([5]), prompt), branch_step(m, np.array([5]), prompt)
    for _ in range(3):
        advance()
    assert m.layout.pool._held == []  # no step copied the cache
    for _ in range(3):
        regenerate_step(m, np.array([5]), prompt)()
    assert m.layout.pool._held == []  # nothing newer held: written in place
    for _ in range(3):
        branch()
    # every branch copied, each into the buffers the one before let go
    assert len(m.layout.pool._held) == len(m.layout.axes)
    np.testing.assert_array_equal(prompt.arrays["past_lengths"], lengths)  # the prompt's state unchanged


def test_bench_shows_the_branch_beside_the_advancing_step(transformer_tiny, capsys):
    _, folder = transformer_tiny
    result = run_bench(folder, provider="cpu", fast=True)
    for row in result["steps"]:
        assert row["ort_branch_ms"] > 0 and row["branch_over_step"] == pytest.approx(row["ort_branch_ms"] / row["ort_ms"])
    assert "ORT branch" in format_table(result)
    out = branch_vs_advance(folder, [4, 16], repeats=3)
    assert out["family"] == "transformer" and [r["context"] for r in out["rows"]] == [4, 16]
    assert all(r["branch_over_advance"] > 0 and r["regenerate_over_advance"] > 0 and r["first_branch_ms"] > 0
               for r in out["rows"])
    main([str(folder), "--contexts", "8", "--repeats", "2"])
    assert "branch/advance" in capsys.readouterr().out
