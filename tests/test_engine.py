"""The continuous-batching engine against generate() on each prompt alone (the reference):
greedy tokens equal, seeded samples equal whatever shares the batch, rows join and leave
mid-decode, caps hold, cancelled and timed-out requests free their rows."""

import itertools
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import seqexport.runtime as rt
from seqexport.errors import InputError, UsageError
from seqexport.runtime.engine import Engine, QueueFull
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.state.rows import swap_remove_order
from seqexport.training.dates import make_split


@pytest.fixture(scope="module")
def mamba(mamba_exports):
    """The tiny Mamba whose tokens depend on every part (no eos: runs to max_new_tokens)."""
    return rt.load(mamba_exports("loop")[1], provider="cpu", threads=1)


@pytest.fixture(scope="module")
def dates(bundled_exports):
    """The bundled trained Mamba (answers end with eos) and 32 held-out prompts."""
    model = rt.load(bundled_exports("mamba")[1], provider="cpu", threads=1)
    record = model.manifest["tokenizer"]
    prompts = [encode_prompt(model.tokenizer, model.prompt_frame, x, record) for x, _ in make_split("test", 32, seed=1)]
    return model, prompts


@pytest.fixture(scope="module")
def rwkv(rwkv_tiny):
    """The tiny RWKV-7 preset: a family the engine was not written for, through the same API."""
    return rt.load(rwkv_tiny[1], provider="cpu", threads=1)


@pytest.fixture(scope="module")
def transformer(transformer_tiny):
    """The tiny transformer preset: rows at different positions and source lengths share one
    decoder call (its decoder takes per-row past lengths)."""
    return rt.load(transformer_tiny[1], provider="cpu", threads=1)


CONCAT_ARTIFACT = Path(__file__).parent / "data" / "transformer-tiny-concat-cache"  # an older decoder


def random_prompts(n, vocab, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, int(rng.integers(1, 40))).tolist() for _ in range(n)]


def alone(model, prompts, options):
    return [rt.generate(model, [p], o)[0] for p, o in zip(prompts, options)]


@pytest.mark.parametrize("family", ["mamba", "rwkv", "transformer"])
def test_greedy_rows_of_mixed_lengths_get_their_generate_tokens(family, request):
    model = request.getfixturevalue(family)
    assert model.continuous_batching
    prompts = random_prompts(32, min(model.config.get("src_vocab_size", model.vocab_size), 1000))
    options = [rt.SearchOptions(max_new_tokens=1 + (7 * i) % 23, eos_id=-1) for i in range(32)]
    engine = Engine(model, max_rows=8)
    reqs = [engine.submit(p, o) for p, o in zip(prompts, options)]
    most = 0
    while engine.has_work():
        engine.step()
        most = max(most, engine.active_rows)
    assert most == 8  # the cap was reached and held
    assert [r.tokens for r in reqs] == alone(model, prompts, options)
    assert all(r.finish_reason == "length" and len(r.tokens) == r.options.max_new_tokens for r in reqs)
    # rows shared steps: each row-step feeds a prompt token (prompts go through the batched step
    # once rows run) or a generated one
    assert engine.steps < sum(len(p) + o.max_new_tokens for p, o in zip(prompts, options)) / 4


def test_trained_model_rows_end_at_eos_and_new_ones_join_mid_decode(dates):
    model, prompts = dates
    options = rt.SearchOptions(max_new_tokens=16)
    engine = Engine(model, max_rows=32)
    reqs = [engine.submit(p, options) for p in prompts[:4]]
    for _ in range(3):
        engine.step()  # the first four are 3 tokens in
    reqs += [engine.submit(p, options) for p in prompts[4:]]
    engine.run_until_done()
    expect = alone(model, prompts, [options] * len(prompts))
    assert [r.tokens for r in reqs] == expect
    assert all(r.finish_reason == "stop" for r in reqs)  # every answer ended with eos
    texts = [model.tokenizer.decode(r.tokens) for r in reqs]
    assert all(len(t) == 10 and t[4] == "-" for t in texts)  # YYYY-MM-DD


def test_seeded_sampling_is_the_same_whatever_shares_the_batch(mamba):
    prompts = random_prompts(12, mamba.vocab_size, seed=3)
    options = [rt.SearchOptions(max_new_tokens=12, do_sample=True, seed=100 + i, temperature=1.3, top_k=40,
                                top_p=0.9) for i in range(12)]
    expect = alone(mamba, prompts, options)
    # the same requests, batched in a different order and mixed with greedy and unseeded ones
    engine = Engine(mamba, max_rows=5)
    others = [engine.submit(p, rt.SearchOptions(max_new_tokens=9, do_sample=True)) for p in prompts[:3]]
    reqs = {i: engine.submit(prompts[i], options[i]) for i in reversed(range(12))}
    others.append(engine.submit(prompts[0], rt.SearchOptions(max_new_tokens=30)))
    engine.run_until_done()
    assert [reqs[i].tokens for i in range(12)] == expect
    assert len(set(map(tuple, expect))) == 12  # seeds made different samples
    assert all(len(o.tokens) for o in others)


def test_background_thread_with_requests_arriving_while_others_run(dates):
    model, prompts = dates
    options = rt.SearchOptions(max_new_tokens=16)
    seen: dict[str, list] = {}
    lock = threading.Lock()

    def on_event(req, token):
        with lock:
            seen.setdefault(req.id, []).append(token)

    engine = Engine(model, max_rows=6).start()
    try:
        reqs = []
        for p in prompts[:20]:
            reqs.append(engine.submit(p, options, on_event=on_event))
            time.sleep(0.002)
        assert all(r.wait(60) for r in reqs)
    finally:
        engine.close()
    assert [r.tokens for r in reqs] == alone(model, prompts[:20], [options] * 20)
    assert all(seen[r.id] == [*r.tokens, None] for r in reqs)  # each token once, then the end


def test_cancel_and_timeout_free_their_rows(mamba):
    engine = Engine(mamba, max_rows=2)
    long = rt.SearchOptions(max_new_tokens=200)
    a = engine.submit([5, 6, 7], long)
    b = engine.submit([8, 9], long, timeout=0.05)
    c = engine.submit([10], rt.SearchOptions(max_new_tokens=5))
    engine.step()
    assert engine.active_rows == 2 and engine.queue_length == 1
    engine.cancel(a)
    engine.step()
    assert a.finish_reason == "cancelled" and engine.active_rows == 2  # c took a's row
    time.sleep(0.06)
    engine.run_until_done()
    assert b.finish_reason == "timeout" and 0 < len(b.tokens) < 200
    assert c.tokens == rt.generate(mamba, [[10]], rt.SearchOptions(max_new_tokens=5))[0]
    assert engine.active_rows == 0 and engine.state_bytes == 0


def test_a_listener_that_raises_frees_its_row_and_spares_the_others(mamba):
    """A token listener that raises (a client gone, its event loop closed) ends its request
    "cancelled" at the next round, not after max_new_tokens; the waiting request takes the row
    and the request beside it gets generate()'s tokens."""
    engine = Engine(mamba, max_rows=2)
    long = rt.SearchOptions(max_new_tokens=200)
    heard = []

    def gone(req, token):
        heard.append(token)
        raise RuntimeError("the client's event loop is closed")

    a = engine.submit([5, 6, 7], long, on_event=gone)
    b = engine.submit([8, 9], rt.SearchOptions(max_new_tokens=12))
    c = engine.submit([10], rt.SearchOptions(max_new_tokens=5))
    engine.step()
    engine.step()
    assert a.finish_reason == "cancelled" and len(a.tokens) <= 2 and heard == a.tokens[:1]
    engine.run_until_done()
    assert b.tokens == rt.generate(mamba, [[8, 9]], rt.SearchOptions(max_new_tokens=12))[0]
    assert c.tokens == rt.generate(mamba, [[10]], rt.SearchOptions(max_new_tokens=5))[0]
    assert engine.steps < 30  # c ran in a's row, beside b: not after a's 200 tokens


def test_waiting_requests_time_out_and_cancel_in_a_deep_queue(mamba):
    """The engine walks its queue for cancelled and timed-out requests only when one was
    cancelled or a deadline has passed: both still end waiting requests, deep in the queue,
    whichever way they were cancelled, and the others get generate()'s tokens."""
    engine = Engine(mamba, max_rows=1, max_queue=100)
    three = rt.SearchOptions(max_new_tokens=3)
    first = engine.submit([5, 6], rt.SearchOptions(max_new_tokens=30))
    queued = [engine.submit([7 + i % 50], three) for i in range(60)]
    late = engine.submit([9], three, timeout=0.5)  # behind 61 requests of one row each
    direct, via_engine = queued[40], queued[50]
    engine.step()
    direct.cancel()  # the request's own cancel, from any thread
    engine.step()
    engine.cancel(via_engine)
    engine.step()
    assert (direct.finish_reason, via_engine.finish_reason, late.finish_reason) == ("cancelled", "cancelled", None)
    sooner = engine.submit([11], three, timeout=0.05)  # a deadline before every one seen so far
    time.sleep(0.06)
    engine.step()  # no cancel since the last round: the deadline alone makes the engine look
    assert (sooner.finish_reason, late.finish_reason) == ("timeout", None)
    time.sleep(max(0.0, late.deadline - time.monotonic()) + 0.01)
    engine.step()
    assert late.finish_reason == "timeout"
    assert direct.tokens == via_engine.tokens == late.tokens == sooner.tokens == []
    assert engine.queue_length == 58  # 61 waited behind the first
    engine.run_until_done()
    rest = [r for r in queued if r not in (direct, via_engine)]
    assert {r.finish_reason for r in rest} == {"length"} and first.finish_reason == "length"
    assert [r.tokens for r in rest[:5]] == alone(mamba, [r.prompt for r in rest[:5]], [three] * 5)


def test_a_request_cancelled_while_the_starter_begins_it_ends_cancelled(mamba, monkeypatch):
    """A cancel that comes while the starter thread is beginning a request (it is then in no
    queue the engine walks) ends it once the starter hands it over: it never decodes, and the
    request beside it is untouched."""
    marker = [7, 8, 9]
    entered, release = threading.Event(), threading.Event()
    begin = mamba.begin

    def slow_begin(rows, *args, **kwargs):
        if rows == [marker]:
            entered.set()
            release.wait(30)
        return begin(rows, *args, **kwargs)

    monkeypatch.setattr(mamba, "begin", slow_begin)
    long = rt.SearchOptions(max_new_tokens=60, eos_id=-1)
    longer = rt.SearchOptions(max_new_tokens=400, eos_id=-1)  # rounds go on while the starter holds
    engine = Engine(mamba, max_rows=4).start()
    try:
        running = engine.submit([5, 6], longer)
        deadline = time.monotonic() + 30
        while not running.tokens and time.monotonic() < deadline:
            time.sleep(0.001)  # the batch is running: a newcomer goes to the starter
        held = engine.submit(marker, long)
        assert entered.wait(30)
        held.cancel()
        steps = engine.steps
        while engine.steps < steps + 3 and time.monotonic() < deadline:
            time.sleep(0.001)  # rounds of the running request go by while the starter holds it
        assert not running.finished
        release.set()
        assert held.wait(30) and running.wait(30)
    finally:
        release.set()
        engine.close()
    assert held.finish_reason == "cancelled" and held.tokens == []
    assert running.finish_reason == "length" and running.tokens == alone(mamba, [[5, 6]], [longer])[0]


def test_state_cap_and_queue_cap(mamba):
    one_row = rt.Generator(mamba)  # measure one request's state
    one_row.append_tokens([[5]])
    row_bytes = one_row.state.nbytes
    engine = Engine(mamba, max_rows=64, max_queue=10, max_state_bytes=3 * row_bytes)
    reqs = [engine.submit([5 + i], rt.SearchOptions(max_new_tokens=4)) for i in range(10)]
    with pytest.raises(QueueFull, match="max_queue 10"):
        engine.submit([5], rt.SearchOptions())
    most = 0
    while engine.has_work():
        engine.step()
        most = max(most, engine.active_rows)
        assert engine.state_bytes <= 3 * row_bytes
    assert most == 3
    assert [r.tokens for r in reqs] == alone(mamba, [[5 + i] for i in range(10)], [rt.SearchOptions(max_new_tokens=4)] * 10)


def test_batch_synchronous_when_rows_cannot_join():
    """A transformer artifact whose decoder concatenates its cache (no per-row lengths):
    newcomers wait for an empty batch, and every request still gets generate()'s tokens."""
    model = rt.load(CONCAT_ARTIFACT, provider="cpu", threads=1)
    assert not model.continuous_batching
    engine = Engine(model, max_rows=4)
    prompts = random_prompts(6, model.config["src_vocab_size"], seed=5)
    options = [rt.SearchOptions(max_new_tokens=3 + i, eos_id=-1) for i in range(6)]
    reqs = [engine.submit(p, o) for p, o in zip(prompts, options)]
    starts, step = {}, 0
    while engine.has_work():
        engine.step()
        step += 1
        for r in reqs:
            if r.tokens and r.id not in starts:
                starts[r.id] = step
    # a step admits (first token) then decodes (second): 6 tokens take steps 1-5
    assert [starts[r.id] for r in reqs] == [1, 1, 1, 1, 6, 6]  # the second group after the longest
    assert [r.tokens for r in reqs] == alone(model, prompts, options)


def test_a_started_engine_is_not_stepped_by_hand_as_well(mamba):
    """step() / run_until_done() on an engine whose own thread runs (start()) stepped one batch
    from two threads at once, silently; now refused by name, and the thread's decode goes on
    as generate()'s."""
    engine = Engine(mamba, max_rows=2).start()
    options = rt.SearchOptions(max_new_tokens=24)
    try:
        req = engine.submit([5, 6], options)
        for call in (engine.step, engine.run_until_done):
            with pytest.raises(UsageError, match=r"this engine's own thread runs its steps \(start\(\) was called\)"):
                call()
        with pytest.raises(UsageError, match="cancel: expected a Request"):
            engine.cancel(None)
        other = Engine(mamba, max_rows=2)
        with pytest.raises(UsageError, match="cancel: request 'theirs' was not submitted to this engine"):
            engine.cancel(other.submit([5], options, request_id="theirs"))
        assert req.wait(60)
    finally:
        engine.close()
    assert req.tokens == rt.generate(mamba, [[5, 6]], options)[0]


def test_bad_requests_are_refused_with_the_value_named(mamba):
    engine = Engine(mamba, max_prompt_tokens=8)
    with pytest.raises(InputError, match="empty prompt"):
        engine.submit([])
    with pytest.raises(InputError, match="9 tokens exceeds the limit of 8"):
        engine.submit(list(range(3, 12)))
    with pytest.raises(InputError, match="token ids must be integers"):
        engine.submit([1.5])
    with pytest.raises(UsageError, match="num_beams"):
        engine.submit([5], rt.SearchOptions(num_beams=2))
    with pytest.raises(UsageError, match="max_rows"):
        Engine(mamba, max_rows=0)
    # a token id the model does not have: that request fails, the others go on
    bad = engine.submit([5, mamba.vocab_size + 7])
    good = engine.submit([5], rt.SearchOptions(max_new_tokens=3))
    engine.run_until_done()
    assert bad.finish_reason == "error" and isinstance(bad.error, InputError)
    assert str(mamba.vocab_size + 7) in str(bad.error)
    assert good.finish_reason == "length" and len(good.tokens) == 3


# --- rows in place: leavers' places taken from the tail, newcomers written into spare rows ---


def test_swap_remove_order_keeps_the_survivors_and_moves_one_row_per_leaver():
    for n in range(1, 7):
        for leaving in itertools.chain.from_iterable(itertools.combinations(range(n), k) for k in range(n + 1)):
            order = swap_remove_order(n, leaving)
            assert sorted(order) == [i for i in range(n) if i not in leaving]
            moved = [(i, r) for i, r in enumerate(order) if r != i]
            assert len(moved) <= len(leaving)
            assert all(r >= len(order) for _, r in moved)  # taken from the tail: read before any write


@pytest.mark.parametrize("family", ["mamba", "rwkv", "transformer"])
def test_rows_leave_in_every_order_and_join_between(family, request):
    """Four rows finish in each of the 24 orders while newcomers (longer and shorter prompts and
    sources than the rows there) join between leaves: every request gets generate()'s tokens."""
    model = request.getfixturevalue(family)
    vocab = min(model.config.get("src_vocab_size", model.vocab_size), 1000)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, vocab, n).tolist() for n in (3, 6, 2, 5, 12, 1, 4, 9)]  # 12: longer than any row there
    most = 20  # past the cache's first 16 slots: the transformer's buffers grow mid-batch
    expect = alone(model, prompts, [rt.SearchOptions(max_new_tokens=most, eos_id=-1)] * len(prompts))
    for perm in itertools.permutations(range(4)):
        engine = Engine(model, max_rows=6)
        counts = [3 + 4 * k for k in perm]  # row i finishes perm[i]-th
        reqs = [engine.submit(prompts[i], rt.SearchOptions(max_new_tokens=counts[i], eos_id=-1)) for i in range(4)]
        late = []
        for r in range(200):
            engine.step()
            if r in (2, 9, 14, 20):  # joins between the leaves (rows 0-3 end at rounds ~3-15 + prompt)
                j = 4 + len(late)
                late.append(engine.submit(prompts[j], rt.SearchOptions(max_new_tokens=most - 2 * len(late), eos_id=-1)))
            if not engine.has_work():
                break
        assert not engine.has_work()
        for req, i, n in [*zip(reqs, range(4), counts), *((q, 4 + k, most - 2 * k) for k, q in enumerate(late))]:
            assert req.tokens == expect[i][:n], (perm, i)


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
@pytest.mark.parametrize("chunk", [3, 0])
def test_long_prompts_prefilled_in_chunks_or_at_admission(family, chunk, request):
    """prefill_chunk 3: prompts longer than 3 tokens go through the prefill graph 3 tokens a
    round outside the batch, then join; 0: each is prefilled as it joins. generate()'s tokens."""
    model = request.getfixturevalue(family)
    prompts = random_prompts(10, model.vocab_size, seed=7)
    options = [rt.SearchOptions(max_new_tokens=2 + i % 5, eos_id=-1) for i in range(10)]
    engine = Engine(model, max_rows=4, prefill_chunk=chunk)
    reqs = [engine.submit(prompts[0], options[0])]
    staged = 0
    for i in range(1, 10):
        engine.step()  # the others arrive while rows run
        staged = max(staged, len(engine._staged))
        reqs.append(engine.submit(prompts[i], options[i]))
    engine.run_until_done()
    assert [r.tokens for r in reqs] == alone(model, prompts, options)
    assert (staged > 0) == (chunk > 0)


def test_transformer_join_and_leave_write_in_place(transformer):
    """Once the batch's buffers have spare rows, a newcomer is written into them and a leaver's
    place is taken by the last row: the buffers stay the same memory (no batch-wide copy)."""
    prompts = random_prompts(5, transformer.config["src_vocab_size"], seed=2)
    prompts = [p[:6] + [3] * max(0, 6 - len(p)) for p in prompts]  # one source length: no source growth
    engine = Engine(transformer, max_rows=12)
    reqs = [engine.submit(p, rt.SearchOptions(max_new_tokens=n, eos_id=-1)) for p, n in zip(prompts[:3], (4, 9, 9))]
    engine.step()
    engine.step()
    engine.submit(prompts[3], rt.SearchOptions(max_new_tokens=6, eos_id=-1))  # grows the rows once ...
    engine.step()
    buffers = {k: id(v.base) for k, v in engine._state.arrays.items() if k != "past_lengths"}
    assert all(v.base is not None for v in engine._state.arrays.values())
    # ... for max_rows rows: no later newcomer copies the batch again
    assert {v.base.shape[0] for k, v in engine._state.arrays.items() if k != "past_lengths"} == {12}
    reqs.append(engine.submit(prompts[4], rt.SearchOptions(max_new_tokens=3, eos_id=-1)))  # joins in place
    for _ in range(3):
        engine.step()  # ... then the first request leaves, and the newcomer after its 3 tokens
        assert {k: id(v.base) for k, v in engine._state.arrays.items() if k != "past_lengths"} == buffers
    assert reqs[0].finished and reqs[-1].finished and engine.active_rows == 3
    engine.run_until_done()
    assert reqs[-1].tokens == alone(transformer, prompts[4:], [rt.SearchOptions(max_new_tokens=3, eos_id=-1)])[0]


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
def test_a_bad_prompt_that_joins_by_feeding_fails_alone(family, request):
    """Newcomers to an empty batch: the largest group of one length is prefilled, the others
    join with their prompts still to feed. A token id out of range among those fails its own
    request at admission, not the batched step of every row (a CI run caught that race)."""
    model = request.getfixturevalue(family)
    vocab = model.vocab_size
    greedy = rt.SearchOptions(max_new_tokens=6, eos_id=-1)
    prompts = [[5, 6, 7, 8, 9], [9, 8, 7, 6, 5], [1, 2, 3, 4, 5], [4, 4, 4, 4]]
    bad_prompt = [5, vocab + 3, 6]
    engine = Engine(model, max_rows=8)
    reqs = [engine.submit(p, greedy) for p in prompts[:3]]
    bad = engine.submit(bad_prompt, greedy)
    reqs.append(engine.submit(prompts[3], greedy))
    engine.run_until_done()
    assert bad.finish_reason == "error" and f"token id {vocab + 3}" in str(bad.error)
    assert [r.finish_reason for r in reqs] == ["length"] * 4
    assert [r.tokens for r in reqs] == alone(model, prompts, [greedy] * 4)


@pytest.mark.parametrize("family", ["transformer", "mamba", "rwkv"])
def test_the_starter_begins_newcomers_beside_the_batch(family, request):
    """With start(), a newcomer is begun on the starter thread while the batch decodes (a
    transformer's encoder; a Mamba's or RWKV's whole prefill and first pick): tokens stay
    generate()'s, a prompt the model refuses fails alone there, and close() cancels what is
    still waiting or begun and stops both threads."""
    model = request.getfixturevalue(family)
    if family == "transformer":
        vocab = model.config["src_vocab_size"]
        bad_prompt, bad_text = [5] * (model.config["max_len"] + 5), "positional table"
    else:
        vocab = model.vocab_size
        bad_prompt, bad_text = [5, vocab + 3, 6], f"token id {vocab + 3}"
    prompts = random_prompts(24, vocab, seed=11)
    greedy = rt.SearchOptions(max_new_tokens=12, eos_id=-1)
    options = [greedy if i % 3 else rt.SearchOptions(max_new_tokens=12, eos_id=-1, do_sample=True, seed=i,
                                                      temperature=1.2, top_k=30) for i in range(len(prompts))]
    engine = Engine(model, max_rows=4).start()
    assert engine._starter is not None and engine._starter.is_alive()
    try:
        reqs = []
        for i, (p, o) in enumerate(zip(prompts, options)):
            reqs.append(engine.submit(p, o))
            if i == 10:
                bad = engine.submit(bad_prompt, greedy)
            time.sleep(0.001)
        assert all(r.wait(60) for r in reqs) and bad.wait(60)
    finally:
        engine.close()
    assert engine.begun_ahead > 0  # the starter, not the engine thread, began some of them
    assert [r.tokens for r in reqs] == alone(model, prompts, options)  # seeded samples too
    assert bad.finish_reason == "error" and bad_text in str(bad.error)

    engine = Engine(model, max_rows=1).start()  # 24 x 40 steps one row at a time: close() comes first
    starter, loop = engine._starter, engine._thread
    waiting = [engine.submit(p, rt.SearchOptions(max_new_tokens=40, eos_id=-1)) for p in prompts]
    time.sleep(0.02)
    engine.close()
    assert not starter.is_alive() and not loop.is_alive()
    assert all(r.done.is_set() for r in waiting)
    assert {r.finish_reason for r in waiting} <= {"length", "cancelled"} and waiting[-1].finish_reason == "cancelled"
    assert not engine.has_work()
    # a request submitted to the closed engine would never run nor end: refused; start() takes them again
    with pytest.raises(UsageError, match=r"the engine is closed: start\(\) it again before submitting"):
        engine.submit(prompts[0], greedy)
    assert not engine.has_work()
    engine.start()
    try:
        assert engine.submit(prompts[0], greedy).wait(60)
    finally:
        engine.close()


def test_start_ahead_zero_begins_newcomers_inline(transformer):
    engine = Engine(transformer, max_rows=4, start_ahead=0).start()
    assert engine._starter is None
    try:
        reqs = [engine.submit(p, rt.SearchOptions(max_new_tokens=6)) for p in random_prompts(8, 200, seed=3)]
        assert all(r.wait(60) for r in reqs)
    finally:
        engine.close()
    assert engine.begun_ahead == 0
    with pytest.raises(UsageError, match="start_ahead"):
        Engine(transformer, start_ahead=-1)


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
def test_recurrent_rows_step_join_and_leave_in_the_same_buffers(family, request):
    """A recurrent batch's state lives in two preallocated sets the step alternates between
    (ORT writes the new state into the spare set): once the batch runs, a newcomer is written
    into spare rows and a leaver's place taken by the last row, with no new buffers; every
    request still gets generate()'s tokens, and a state from step() is never written under
    its holder (generate() and step() do not use these buffers)."""
    model = request.getfixturevalue(family)
    prompts = random_prompts(5, model.vocab_size, seed=4)
    counts = (4, 12, 12, 7, 3)
    held = model.start(2)
    before = {k: v.copy() for k, v in held.arrays.items()}
    _, stepped = model.step(np.array([5, 6]), held)  # a caller's own state: not the engine's
    engine = Engine(model, max_rows=8, prefill_chunk=0)
    reqs = [engine.submit(p, rt.SearchOptions(max_new_tokens=n, eos_id=-1)) for p, n in zip(prompts[:3], counts)]
    engine.step()
    engine.step()  # the batch's state now lives in the buffers
    buffers = engine._state.rows
    sets = [{k: id(a) for k, a in s.items()} for s in buffers.sets]
    reqs += [engine.submit(p, rt.SearchOptions(max_new_tokens=n, eos_id=-1)) for p, n in zip(prompts[3:], counts[3:])]
    while engine.has_work():
        engine.step()  # joins, then leaves in the order of counts
        if engine._state is not None:
            assert engine._state.rows is buffers
            assert buffers.holds(engine._state)
    assert [{k: id(a) for k, a in s.items()} for s in buffers.sets] == sets
    assert [r.tokens for r in reqs] == alone(model, prompts, [rt.SearchOptions(max_new_tokens=n, eos_id=-1) for n in counts])
    assert all(np.array_equal(held.arrays[k], before[k]) for k in before)  # step() wrote elsewhere
    assert stepped.rows is None


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
def test_an_older_state_advanced_again_is_not_read_from_the_newer_ones_buffers(family, request):
    """`advance` steps a state in place only while it is the row buffers' newest view. A state
    the batch has moved on from (its set not yet written again) gets buffers of its own: stepped
    again it gives what stepping it gave the first time, not the newer state's step."""
    model = request.getfixturevalue(family)
    tokens = np.array([5, 9, 3])
    _, first = model.advance(tokens, model.start(3), 8)  # the rows now live in buffers
    want, _ = model.step(tokens + 1, first)  # (3, v): `first` stepped by the plain path
    again, second = model.advance(tokens + 1, first, 8)
    np.testing.assert_array_equal(again, want)
    assert second.rows.holds(second) and not first.rows.holds(first)
    late, _ = model.advance(tokens + 1, first, 8)
    np.testing.assert_array_equal(late, want)


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
def test_a_state_whose_rows_were_written_since_is_refused_not_read(family, request):
    """Two steps on, the batch writes the set an old state lies in; a leave moves rows in place
    under the state before it. Advancing, joining or cutting such a state is refused, naming
    why, not decoded from what is there now."""
    model = request.getfixturevalue(family)
    tokens = np.array([5, 9, 3])
    _, first = model.advance(tokens, model.start(3), 8)
    _, second = model.advance(tokens + 1, first, 8)
    _, third = model.advance(tokens + 2, second, 8)  # written into the set `first` lies in
    for use in (lambda: model.advance(tokens, first, 8), lambda: model.extend(first, [model.start(1)], 8),
                lambda: model.extend(third, [first], 8), lambda: model.retain(first, [0, 1])):
        with pytest.raises(UsageError, match="moved on past this state"):
            use()
    want, _ = model.step(tokens[[2, 1]], third.numpy().select([2, 1]))  # (2, v)
    kept = model.retain(third, [2, 1])  # row 2 moved in place into row 0 under `third`
    got, _ = model.advance(tokens[[2, 1]], kept, 8)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(UsageError, match="moved on past this state"):
        model.advance(tokens, third, 8)


def test_a_join_that_raises_loses_no_request(transformer, monkeypatch):
    """A newcomer's rows failing to join the running batch (here: the model's extend raising, as
    an allocation can) fails the requests of that round, and only those: none is left waiting
    forever, and the engine goes on serving the rest with generate()'s tokens."""
    real, calls = transformer.extend, [0]

    def extend_failing_once(state, newcomers, rows=None):
        calls[0] += 1
        if calls[0] == 1:  # (the first: newcomers that are ready together join in one extend)
            raise MemoryError("no room for the newcomer's rows")
        return real(state, newcomers, rows)

    monkeypatch.setattr(transformer, "extend", extend_failing_once)
    prompts = random_prompts(12, transformer.config["src_vocab_size"], seed=5)
    greedy = rt.SearchOptions(max_new_tokens=8, eos_id=-1)
    long = rt.SearchOptions(max_new_tokens=60, eos_id=-1)
    options = [long] + [greedy] * (len(prompts) - 1)
    engine = Engine(transformer, max_rows=4).start()
    try:
        # one request running first, so the others join a batch that has rows (an extend: into
        # an empty batch rows join without one, and the fault would never be met)
        reqs = [engine.submit(prompts[0], long)]
        deadline = time.monotonic() + 30
        while engine.active_rows == 0 and not reqs[0].finished and time.monotonic() < deadline:
            time.sleep(0.001)
        reqs += [engine.submit(p, greedy) for p in prompts[1:]]
        assert all(r.wait(30) for r in reqs), [r.finish_reason for r in reqs]
    finally:
        engine.close()
    assert calls[0] >= 1
    failed = [r for r in reqs if r.finish_reason == "error"]
    assert failed and all("no room" in str(r.error) for r in failed)
    done = [i for i, r in enumerate(reqs) if r.finish_reason == "length"]
    assert len(done) + len(failed) == len(reqs) and len(done) >= len(reqs) - 5
    assert [reqs[i].tokens for i in done] == alone(transformer, [prompts[i] for i in done], [options[i] for i in done])


def test_a_request_that_ends_is_woken_at_the_next_batched_step(transformer):
    """A request's `done` is set at the engine's hand-off: by step() before it returns, and on the
    engine thread just before the next batched step (its Python then runs beside that step), not
    once the batch empties. Seen from the long request's tokens, on the engine thread: once the
    short one has ended, every later round has it woken."""
    prompts = random_prompts(3, transformer.config["src_vocab_size"], seed=7)
    engine = Engine(transformer, max_rows=4)
    one, more = (engine.submit(p, rt.SearchOptions(max_new_tokens=n, eos_id=-1)) for p, n in zip(prompts, (1, 6)))
    engine.step()  # both begun together; `one` has its token and ends
    assert one.finished and one.done.is_set() and not more.finished

    seen = []  # for each token of `long`: (short has ended, short is woken)
    engine = Engine(transformer, max_rows=4).start()
    try:
        short = engine.submit(prompts[1], rt.SearchOptions(max_new_tokens=2, eos_id=-1))
        long = engine.submit(prompts[2], rt.SearchOptions(max_new_tokens=30, eos_id=-1),
                             on_event=lambda req, token: seen.append((short.finished, short.done.is_set())))
        assert short.wait(60) and long.wait(60)
    finally:
        engine.close()
    after = [woken for ended, woken in seen if ended]
    assert len(after) >= 2 and all(after[1:]), seen  # (the round it ended in may not have woken it yet)
    assert long.tokens == alone(transformer, prompts[2:], [rt.SearchOptions(max_new_tokens=30, eos_id=-1)])[0]


def test_a_row_whose_logits_turn_nan_fails_alone(transformer, monkeypatch):
    """NaN logits in one row of a batched step end that request with an error naming them; the
    other rows go on with generate()'s tokens."""
    real, victims = transformer.step, []

    def step_with_a_nan_row(tokens, state):
        logits, new = real(tokens, state)
        if not victims and logits.ndim == 2 and len(logits) == 3:  # one batched step of the three
            victims.append(engine.batch.rows[1])
            logits = logits.copy()
            logits[1, 7] = np.nan
        return logits, new

    monkeypatch.setattr(transformer, "step", step_with_a_nan_row)
    prompts = random_prompts(3, transformer.config["src_vocab_size"], seed=8)
    greedy = rt.SearchOptions(max_new_tokens=6, eos_id=-1)
    engine = Engine(transformer, max_rows=4)
    reqs = [engine.submit(p, greedy) for p in prompts]
    engine.run_until_done()
    monkeypatch.undo()
    (victim,) = victims
    assert victim.finish_reason == "error" and "NaN/Inf logits" in str(victim.error)
    rest = [(p, r) for p, r in zip(prompts, reqs) if r is not victim]
    assert [r.finish_reason for _, r in rest] == ["length", "length"]
    assert [r.tokens for _, r in rest] == alone(transformer, [p for p, _ in rest], [greedy] * 2)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs this process may use")
def test_pinned_threads_run_on_their_own_cpus_and_give_generate_tokens(transformer):
    """pin_threads: the engine thread on the process's first CPU, the starter on the others
    (read from the running threads themselves); tokens as generate() gives them alone; the
    caller's thread keeps its CPUs. Without it, no thread is pinned."""
    cpus = sorted(os.sched_getaffinity(0))
    prompts = random_prompts(12, transformer.config["src_vocab_size"], seed=5)
    options = [rt.SearchOptions(max_new_tokens=10, eos_id=-1)] * len(prompts)
    for pin, engine_cpus, starter_cpus in ((True, {cpus[0]}, set(cpus[1:])), (False, set(cpus), set(cpus))):
        engine = Engine(transformer, max_rows=4, pin_threads=pin).start()
        try:
            reqs = [engine.submit(p, o) for p, o in zip(prompts, options)]
            assert all(r.wait(60) for r in reqs)
            assert os.sched_getaffinity(engine._thread.native_id) == engine_cpus
            assert os.sched_getaffinity(engine._starter.native_id) == starter_cpus
        finally:
            engine.close()
        assert [r.tokens for r in reqs] == alone(transformer, prompts, options)
        assert sorted(os.sched_getaffinity(0)) == cpus


def test_serve_refuses_pinned_threads_with_several_replicas(transformer_tiny):
    from click.testing import CliRunner

    from seqexport.cli import cli

    result = CliRunner().invoke(cli, ["serve", str(transformer_tiny[1]), "--pin-threads", "--replicas", "2"])
    assert result.exit_code == 2 and "--pin-threads" in result.output and "one replica" in result.output


def test_pinned_threads_refused_with_one_cpu(transformer, transformer_tiny, monkeypatch):
    """Where the process may use one CPU there is nothing to keep apart: Engine and the CLI
    refuse pin_threads with the reason, instead of running unpinned without a word."""
    from click.testing import CliRunner

    from seqexport.cli import cli

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with pytest.raises(UsageError, match="pin_threads: needs two CPUs this process may use, it has 1"):
        Engine(transformer, pin_threads=True)
    Engine(transformer).close()  # unpinned: as ever
    result = CliRunner().invoke(cli, ["bench-serve", str(transformer_tiny[1]), "--pin-threads", "--clients", "2",
                                      "--requests", "2"])
    assert result.exit_code == 2 and "--pin-threads: needs two CPUs" in result.output, result.output
