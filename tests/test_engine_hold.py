"""Held requests (`Request.hold`: a server's client far behind its stream): the row is parked
(no steps, its state kept aside, its place in the row count kept) and, resumed, rejoins where
it left off. The reference is generate() on each prompt alone: a request held and resumed
mid-decode, in every family, gets exactly its tokens, and so do the rows that ran on beside it.
Before, the engine had no way to stop a row short of cancelling it: a slow reader's tokens
piled up unread in the server's memory (see tests/test_serve_clients.py)."""

import threading
import time

import numpy as np
import pytest

import seqexport.runtime as rt
from seqexport.runtime.engine import Engine

FAMILIES = ["transformer", "mamba", "rwkv", "mamba2", "hybrid"]


@pytest.fixture(scope="module")
def models(transformer_tiny, mamba_exports, rwkv_tiny, bundled_exports):
    folders = {"transformer": transformer_tiny[1], "mamba": mamba_exports("loop")[1], "rwkv": rwkv_tiny[1]}
    loaded = {}

    def get(family):
        if family not in loaded:
            folder = folders.get(family) or bundled_exports(family)[1]
            loaded[family] = rt.load(folder, provider="cpu", threads=1)
        return loaded[family]

    return get


def vocab(model) -> int:
    return min(model.config.get("src_vocab_size", model.vocab_size), 1000)


def prompts_for(model, n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab(model), int(rng.integers(2, 12))).tolist() for _ in range(n)]


def alone(model, prompts, options):
    return [rt.generate(model, [p], o)[0] for p, o in zip(prompts, options)]


def step_until(engine, done, most=200):
    for _ in range(most):
        if done():
            return
        engine.step()
    raise AssertionError("the condition never came")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_held_row_takes_no_steps_keeps_its_place_and_resumes_with_its_generate_tokens(family, models):
    model = models(family)
    assert model.continuous_batching
    prompts = prompts_for(model, 5)
    options = [rt.SearchOptions(max_new_tokens=24, eos_id=-1) for _ in range(4)]
    options[2] = rt.SearchOptions(max_new_tokens=24, eos_id=-1, do_sample=True, temperature=0.9, seed=7)
    options.append(rt.SearchOptions(max_new_tokens=6, eos_id=-1))
    engine = Engine(model, max_rows=4)
    reqs = [engine.submit(p, o) for p, o in zip(prompts[:4], options[:4])]
    step_until(engine, lambda: len(reqs[1].tokens) >= 5)
    reqs[1].hold()
    reqs[2].hold()  # a sampled row: its own rng, untouched while parked
    engine.step()
    held = [len(reqs[1].tokens), len(reqs[2].tokens)]
    ran = len(reqs[0].tokens)
    newcomer = engine.submit(prompts[4], options[4])
    for _ in range(6):
        engine.step()
    assert [len(reqs[1].tokens), len(reqs[2].tokens)] == held  # no steps while held
    assert len(reqs[0].tokens) == ran + 6 and len(reqs[3].tokens) > held[0]  # the others ran on
    assert engine.parked_rows == 2 and engine.active_rows == 4  # a parked row keeps its place:
    assert not newcomer.tokens and engine.queue_length == 1  # the newcomer waits for a free row
    assert engine.state_bytes > 0
    reqs[1].resume()
    reqs[2].resume()
    engine.run_until_done()
    assert [r.tokens for r in [*reqs, newcomer]] == alone(model, prompts, options)
    assert engine.parked_rows == 0 and engine.active_rows == 0 and engine.state_bytes == 0


@pytest.mark.parametrize("family", ["transformer", "mamba"])
def test_every_row_held_leaves_nothing_to_run_until_one_resumes(family, models):
    model = models(family)
    prompts = prompts_for(model, 3, seed=1)
    options = [rt.SearchOptions(max_new_tokens=10 + i, eos_id=-1) for i in range(3)]
    engine = Engine(model, max_rows=4)
    reqs = [engine.submit(p, o) for p, o in zip(prompts, options)]
    engine.step()
    engine.step()
    for r in reqs:
        r.hold()
    engine.step()
    steps = engine.steps
    assert not engine.has_work() and engine.parked_rows == 3
    engine.run_until_done()
    assert engine.steps == steps
    reqs[1].resume()  # the others come back one at a time, behind it
    engine.step()
    reqs[0].resume()
    engine.step()
    reqs[2].resume()
    engine.run_until_done()
    assert [r.tokens for r in reqs] == alone(model, prompts, options)


def test_a_started_engine_sleeps_while_every_row_is_held_and_wakes_to_resume_cancel_or_time_out(models):
    """The engine thread does not spin over parked rows: it waits, and wakes when one is
    resumed, cancelled (a client that hangs up), or past its deadline."""
    model = models("mamba")
    prompts = prompts_for(model, 3, seed=2)
    long = rt.SearchOptions(max_new_tokens=10_000, eos_id=-1)
    short = rt.SearchOptions(max_new_tokens=40, eos_id=-1)
    events = {i: threading.Event() for i in range(3)}

    def holder(i):
        def on_event(req, token):  # held from its third token, on the engine thread, as a server does
            if token is not None and len(req.tokens) == 3:
                req.hold()
                events[i].set()
        return on_event

    engine = Engine(model, max_rows=4).start()
    try:
        a = engine.submit(prompts[0], short, on_event=holder(0))
        b = engine.submit(prompts[1], long, on_event=holder(1))
        c = engine.submit(prompts[2], long, on_event=holder(2), timeout=1.5)
        assert all(e.wait(10) for e in events.values())
        time.sleep(0.2)
        steps = engine.steps
        time.sleep(0.5)
        assert engine.steps == steps and engine.parked_rows == 3  # asleep
        assert [len(r.tokens) for r in (a, b, c)] == [3, 3, 3]
        a.resume()
        assert a.wait(10) and a.finish_reason == "length"
        assert a.tokens == alone(model, prompts[:1], [short])[0]
        assert c.wait(10) and c.finish_reason == "timeout" and len(c.tokens) == 3  # nothing else woke it
        assert time.monotonic() - c.submitted < 5
        steps = engine.steps
        time.sleep(0.3)
        assert engine.steps == steps and b.held and not b.finished  # no steps: b is still held
        b.cancel()
        assert b.wait(10) and b.finish_reason == "cancelled" and len(b.tokens) == 3
        assert engine.active_rows == 0 and engine.state_bytes == 0
    finally:
        engine.close()


def test_close_ends_parked_rows_cancelled(models):
    model = models("mamba")
    engine = Engine(model, max_rows=2)
    req = engine.submit(prompts_for(model, 1)[0], rt.SearchOptions(max_new_tokens=50, eos_id=-1))
    engine.step()
    req.hold()
    engine.step()
    assert engine.parked_rows == 1
    engine.close()
    assert req.finish_reason == "cancelled" and engine.active_rows == 0


def test_hold_changes_nothing_where_rows_cannot_sit_at_different_positions():
    """An older transformer artifact (no per-row past lengths) cannot take a row back at
    another position than the batch's: its rows are never parked, and decode goes on."""
    from tests.test_engine import CONCAT_ARTIFACT

    model = rt.load(CONCAT_ARTIFACT, provider="cpu", threads=1)
    assert not model.continuous_batching
    engine = Engine(model, max_rows=2)
    prompts = prompts_for(model, 2, seed=3)
    options = [rt.SearchOptions(max_new_tokens=8, eos_id=-1)] * 2
    reqs = [engine.submit(p, o) for p, o in zip(prompts, options)]
    engine.step()
    reqs[0].hold()
    engine.run_until_done()
    assert engine.parked_rows == 0
    assert [r.tokens for r in reqs] == alone(model, prompts, options)
