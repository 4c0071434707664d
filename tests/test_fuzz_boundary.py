"""Fuzzing the runtime's public API: whatever is passed, the only exceptions are the project's
typed errors (SeqexportError, a ValueError), and what is accepted gives finite results of the
right shape. SEQEXPORT_FUZZ_EXAMPLES sets the examples per test (CI: 300; the closing note's
figures: 5000 per test, over 20,000 calls)."""

import collections
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqexport.runtime as rt
from seqexport.errors import SeqexportError

EXAMPLES = int(os.environ.get("SEQEXPORT_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CALLS: collections.Counter = collections.Counter()

scalars = st.one_of(
    st.integers(-3, 120), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=3), st.just(b"\x00"),
)
ids_lists = st.lists(st.lists(st.one_of(st.integers(-2, 110), scalars), max_size=4), max_size=3)
arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(-2, 110, size=shape).astype(dtype),
    st.sampled_from([np.int64, np.int32, np.uint8, np.float32, np.bool_, np.float16]),
    st.lists(st.integers(0, 4), min_size=0, max_size=3), st.integers(0, 2**16),
)
anything = st.one_of(scalars, ids_lists, arrays, st.lists(scalars, max_size=3))
option_values = {
    "max_new_tokens": st.one_of(st.integers(-2, 6), st.integers(500, 700), scalars),
    "do_sample": st.one_of(st.booleans(), scalars),
    "temperature": st.one_of(st.floats(0.1, 3), scalars),
    "top_k": st.one_of(st.integers(0, 200), scalars),
    "top_p": st.one_of(st.floats(0.05, 1), scalars),
    "seed": st.one_of(st.integers(0, 2**32), scalars),
    "num_beams": st.one_of(st.integers(1, 3), scalars),
    "length_penalty": st.one_of(st.floats(-1, 2), scalars),
    "eos_id": st.one_of(st.integers(-1, 120), scalars, st.lists(st.one_of(st.integers(-1, 120), scalars), max_size=3)),
    "start_id": st.one_of(st.integers(0, 120), scalars),
}
options = st.fixed_dictionaries({}, optional=option_values)


@pytest.fixture(scope="module")
def models(transformer_tiny, mamba_exports):
    return {"transformer": rt.load(transformer_tiny[1], provider="cpu", threads=1),
            "mamba": rt.load(mamba_exports("loop")[1], provider="cpu", threads=1)}


def typed_or_fine(call, check=None, kind=""):
    CALLS[kind] += 1
    try:
        out = call()
    except SeqexportError:
        CALLS[kind + " refused"] += 1
        return
    if check:
        check(out)


def _finite_rows(out, n):
    assert len(out) == n and all(isinstance(t, int) for row in out for t in row)


@FUZZ
@given(kwargs=options)
def test_search_options(kwargs):
    typed_or_fine(lambda: rt.SearchOptions(**kwargs), kind="SearchOptions")


@FUZZ
@given(family=st.sampled_from(["transformer", "mamba"]), prompts=st.one_of(ids_lists, arrays, anything),
       kwargs=options)
def test_generate(models, family, prompts, kwargs):
    def call():
        opts = rt.SearchOptions(**{**kwargs, "max_new_tokens": min(kwargs.get("max_new_tokens", 3), 3)}
                                if isinstance(kwargs.get("max_new_tokens", 3), int) else kwargs)
        return rt.generate(models[family], prompts, opts)

    typed_or_fine(call, lambda out: _finite_rows(out, len(out)), kind="generate")


@FUZZ
@given(src=anything, mask=st.one_of(st.none(), anything), tokens=anything)
def test_transformer_start_and_step(models, src, mask, tokens):
    m = models["transformer"]

    def call():
        state = m.start(src, mask)
        return m.step(tokens, state)

    def check(out):
        logits, state = out
        assert np.isfinite(logits).all() and logits.shape[-1] == m.vocab_size

    typed_or_fine(call, check, kind="transformer start+step")


@FUZZ
@given(batch=st.one_of(st.integers(-1, 3), scalars), tokens=anything, corrupt=st.sampled_from(
    ["none", "drop", "dtype", "shape", "batch"]))
def test_mamba_start_and_step(models, batch, tokens, corrupt):
    m = models["mamba"]

    def call():
        state = m.start(batch)
        name = next(iter(state.arrays))
        if corrupt == "drop":
            del state.arrays[name]
        elif corrupt == "dtype":
            state.arrays[name] = state.arrays[name].astype(np.float64)
        elif corrupt == "shape":
            state.arrays[name] = state.arrays[name][..., :1]
        elif corrupt == "batch":
            state.arrays[name] = np.concatenate([state.arrays[name]] * 2)
        return m.step(tokens, state)

    def check(out):
        logits, _ = out
        assert np.isfinite(logits).all() and logits.shape[-1] == m.vocab_size

    typed_or_fine(call, check, kind="mamba start+step")


@FUZZ
@given(prompts=anything, kwargs=options, calls=st.integers(0, 4))
def test_generator(models, prompts, kwargs, calls):
    def call():
        gen = rt.Generator(models["mamba"], rt.SearchOptions(**kwargs))
        if calls % 2:
            gen.generate_next_token()  # before append_tokens: a UsageError
        gen.append_tokens(prompts)
        for _ in range(calls):
            if gen.is_done():
                gen.generate_next_token()  # after the end: a UsageError
            gen.generate_next_token()
        return gen.sequences

    typed_or_fine(call, kind="Generator")


def test_zz_report_counts():
    """Prints the calls made (run with -s to see them)."""
    print("\nfuzz calls:", dict(CALLS), "total", sum(v for k, v in CALLS.items() if not k.endswith("refused")))
