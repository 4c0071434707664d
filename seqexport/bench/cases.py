"""What a family's bench module (`seqexport/families/<name>/bench.py`) hands the driver.

`seqexport.bench.run` knows no family: it asks `families.get(name).bench` for

    PROMPT_LEN: dict[bool, int]      fast -> tokens of generation's prompts (and of the
                                     transformer's source behind its decode state)
    TABLE: StepTable                 the step table's title and family columns
    check_contexts(config, contexts, defaults=(), notes=None) -> tuple[int, ...]
                                     the contexts to time (UsageError for one the model cannot hold)
    decode_state(rt, batch, context, rng, prompt_len) -> State
                                     a runtime state as after `context` tokens
    step_cases(rt, model, batches, contexts, prompt_len, rng) -> Iterable[Case]
    prefill_cases(rt, model, batches, contexts, rng, notes) -> Iterable[Case]
    extra_results(rt, model, contexts, rng, threads=, repeats=, sample_s=) -> dict
                                     top-level result keys of this family only (timed alike)
    step_weight_bytes(model, dtype) -> int        weight bytes one decode step reads
    generation_prompts(rt, batch, prompt_len, rng) -> np.ndarray (b, prompt_len)
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from seqexport.runtime.base import State
from seqexport.specs import INPUT_IDS
from seqexport.state.arrays import to_numpy


@dataclass
class Case:
    """One figure to time. `fns`: `eager*` (torch; also timed at 1 thread), `ort` (the runtime's
    step: checks and state book-keeping included) and `ort_session` (the bare InferenceSession)."""

    label: str  # what the log says while it is timed
    row: dict  # the row's fixed fields (batch, context or length, state bytes, ...)
    fns: dict[str, Callable[[], object]]


def bare_session(rt, graph: str, feeds: dict) -> Callable[[], object]:
    """`InferenceSession.run` of one graph on fixed feeds: ORT without the runtime around it."""
    session = rt.graphs[graph].session
    return lambda: session.run(None, feeds)


def split_feeds(feeds: dict[str, np.ndarray], length: int) -> tuple[np.ndarray, State]:
    """A step graph's feeds -> the tokens (b,) and the runtime State of everything else."""
    tokens = feeds[INPUT_IDS][:, 0]  # (b, 1) -> (b,)
    return tokens, State({k: v for k, v in feeds.items() if k != INPUT_IDS}, length)


def _owned(state: State) -> State:
    """A copy of `state` that owns its arrays: the newest over its buffers, which a step may
    write into in place."""
    return State({k: np.array(to_numpy(v)) for k, v in state.arrays.items()}, state.length).owning()


def _lengths_input(rt) -> str | None:
    """The input giving each row's valid appended slots, for a model with an appended state."""
    layout = rt.layout  # declared by every model (StepModel); None: no kinds kept
    return layout.lengths if layout is not None and layout.axes else None


def advancing_step(rt, tokens: np.ndarray, state: State) -> Callable[[], object]:
    """The runtime's step as in a decode, on a copy of `state` the calls own: each call steps
    the newest state (an appended cache is written in place, never copied) and rewinds its
    lengths to `state`'s, so every call is timed at one context. A model without an appended
    state steps `state` itself each time (its state is replaced whole, of one size)."""
    lengths = _lengths_input(rt)
    if lengths is None:
        return lambda: rt.step(tokens, state)
    past = to_numpy(state.arrays[lengths]).copy()
    newest = [_owned(state)]

    def run():
        _, newest[0] = rt.step(tokens, newest[0])
        newest[0].arrays[lengths][:] = past  # the new state's own array: rewound in place

    return run


def branch_step(rt, tokens: np.ndarray, state: State) -> Callable[[], object]:
    """The runtime's step from an earlier state (a branch: beam search, "regenerate", n samples
    from one prompt): `state` stepped once, then each call steps it again, so an appended
    cache is copied every call (the result is dropped, as when the previous continuation is
    let go). A model without an appended state: each call is `advancing_step`'s."""
    if _lengths_input(rt) is None:
        return lambda: rt.step(tokens, state)
    earlier = _owned(state)
    _, later = rt.step(tokens, earlier)  # `earlier` is no longer the newest over its buffers
    return lambda: (later, rt.step(tokens, earlier))[1]


def regenerate_step(rt, tokens: np.ndarray, state: State) -> Callable[[], object]:
    """The runtime's step from an earlier state once the continuations made from it are let go
    ("regenerate"): each call steps `state`'s owned copy again and drops the result, so no newer
    state is held and an appended cache is written in place, not copied."""
    if _lengths_input(rt) is None:
        return lambda: rt.step(tokens, state)
    earlier = _owned(state)
    return lambda: rt.step(tokens, earlier) and None
