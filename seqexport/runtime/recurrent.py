"""What generation and the engine do with any recurrent-state LM that has `start(batch_size)`
and `step(tokens, state, last_only=...)` (Mamba, RWKV-7; ONNX or eager): a fixed-size state per
row, independent along the batch, that no padding may ever enter.
"""

from functools import cached_property

import numpy as np

from seqexport.errors import InputError, UsageError
from seqexport.runtime.base import State, retain_rows
from seqexport.runtime.capabilities import StepModel
from seqexport.runtime.row_buffers import RowBuffers
from seqexport.runtime.session import NP_DTYPES, check_token_ids
from seqexport.specs import ATTENTION_MASK, INPUT_IDS, LOGITS, LOGITS_TO_KEEP
from seqexport.state.state import checked_states


class RecurrentSteps(StepModel):
    # beams reorder rows: a gather along the batch (`State.select`) for a fixed-size state too
    supports_beams = True
    prompt_frame = {"bos": True, "suffix": "", "eos": False}

    def begin(self, rows: list[list[int]], start_id: int | None = None) -> tuple[np.ndarray, State]:
        """Prefill the prompts, then the states join in order. Returns logits (b, v) and the state.

        No padding ever enters a recurrent state: with a prefill graph that takes an attention
        mask (`ragged_prefill`), the prompts of two tokens or more go in one run, right-padded,
        each row's state and logits taken at its own end; one-token prompts go through the
        step graph, as alone. Otherwise rows of equal length go together, a run per length."""
        by_len: dict[int, list[int]] = {}
        ragged = self.ragged_prefill
        for i, r in enumerate(rows):
            by_len.setdefault(min(len(r), 2) if ragged else len(r), []).append(i)
        states, logits, order = [], [], []
        for n, idx in sorted(by_len.items()):
            if ragged and n == 2:
                longest = max(len(rows[i]) for i in idx)
                ids = np.zeros((len(idx), longest), np.int64)  # (k, longest), right-padded
                mask = np.zeros_like(ids)
                for j, i in enumerate(idx):
                    ids[j, : len(rows[i])] = rows[i]
                    mask[j, : len(rows[i])] = 1
                lg, st = self.prefill_rows(ids, mask, self.start(len(idx)))  # (k, v)
            else:
                lg, st = self.step(np.array([rows[i] for i in idx], np.int64), self.start(len(idx)), last_only=True)
                lg = lg[:, -1]
            states.append(st)
            logits.append(lg)
            order += idx
        inverse = np.argsort(order)
        return np.concatenate(logits)[inverse], self.join(states).select(inverse)

    def join(self, states: list[State]) -> State:
        """The rows of several states as one batch, in order (a fixed-size state: concatenated)."""
        return State.concat(states)

    def begin_rows(self, rows: list[list[int]], start_id: int | None = None) -> tuple[State, list[list[int]]]:
        """The engine's start for rows that join a running batch: a zero state and every prompt
        token still to feed (through the batched step, a token a round: no prefill stalls it).
        The ids are checked here: fed later, a bad one would fail every row of the batch."""
        for r in rows:
            check_token_ids("prompt", np.array([r], np.int64), self.vocab_size)
        return self.start(len(rows)), [list(r) for r in rows]

    def feed(self, tokens, state: State) -> State:
        """The state after these (b, t) tokens; their logits are not needed (a prompt's chunk)."""
        return self.step(tokens, state, last_only=True)[1]


class PrefillRows:
    """An exported recurrent LM's prefill graph inputs: rows of unequal length in one run when
    the graph takes an attention mask (export.ragged), the head for the last position only
    when it takes `logits_to_keep`. For a RuntimeModel with "prefill" and "step" graphs."""

    def prefill_rows(self, ids: np.ndarray, mask: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """Right-padded rows in one prefill run: ids and mask (b, l), a mask row 1s then 0s.
        Returns each row's logits after its own last token (b, v) and the state after its own
        tokens (see RecurrentSteps.begin)."""
        ids = check_token_ids("tokens", ids, self.vocab_size)
        out = self._run("prefill", {INPUT_IDS: ids, **state.arrays, **self._prefill_extras(mask, True)})
        return out[LOGITS][:, -1], State(self._feed_back("prefill", out, state.arrays), int(mask.sum(1).max()))

    def _prefill_extras(self, mask: np.ndarray, last_only: bool) -> dict:
        """The prefill inputs besides tokens and state that this export's graph takes."""
        names = self._prefill_inputs
        extra = {ATTENTION_MASK: mask} if ATTENTION_MASK in names else {}
        if LOGITS_TO_KEEP in names:  # exports before it compute every position
            extra[LOGITS_TO_KEEP] = np.array([1 if last_only else 0], np.int64)
        return extra

    @cached_property
    def _prefill_inputs(self) -> frozenset:
        return frozenset(self.specs["prefill"].input_names)

    @cached_property
    def ragged_prefill(self) -> bool:
        """Whether rows of unequal length share one prefill run (exports before: a run per
        length; a prefill graph of fixed length takes none)."""
        spec = self.specs["prefill"]
        return ATTENTION_MASK in self._prefill_inputs and not isinstance(spec.input(INPUT_IDS).dims[1], int)


class BufferedRows:
    """The engine's variants for an exported recurrent LM on the CPU provider: the running
    batch's state lives in `RowBuffers` (ORT writes each step's state into preallocated rows;
    newcomers are written into spare rows). For a RuntimeModel with a "step" graph whose
    inputs are the token ids and the state and whose outputs are the logits and the new state.
    Anything else (CUDA, another graph shape) takes `step` and the copying joins."""

    def advance(self, tokens, state: State, capacity: int) -> tuple[np.ndarray, State]:
        """`step(tokens (b,), state)` for the engine, which consumes `state`: the logits (b, v)
        are valid until the next `advance`; room for `capacity` rows is made once."""
        buffers = _intact(state)
        if buffers is None or not buffers.holds(state):
            if not self._bufferable:
                return self.step(tokens, state)
            b = state.batch_size
            graph = self.graphs["step"]
            logits = graph.spec.output(LOGITS)
            buffers = RowBuffers(graph.session, graph.spec.feeds, (tuple(logits.dims[1:]), NP_DTYPES[logits.dtype]),
                                 state.numpy().arrays, max(capacity, b))
            state = buffers.load(state)
        ids = check_token_ids("tokens", np.asarray(tokens, np.int64).reshape(-1, 1), self.vocab_size)  # (b, 1)
        if ids.shape[0] != state.batch_size:
            raise InputError(f"tokens: {ids.shape[0]} rows for a state of {state.batch_size} rows")
        logits, state = buffers.run(ids[:, 0], ids.shape[0], state.length + 1)  # (b, 1, v)
        return logits[:, 0], state

    def extend(self, state: State, newcomers: list[State], rows: int | None = None) -> State:
        checked_states([state, *newcomers], "extend")
        buffers = _intact(state)
        for s in newcomers:
            _intact(s)
        if buffers is not None and buffers.holds(state):
            joined = buffers.append(state, newcomers)
            if joined is not None:
                return joined
        return super().extend(state, newcomers, rows)

    def retain(self, state: State, rows: list[int]) -> State:
        buffers = _intact(state)
        if buffers is None or not buffers.holds(state):
            return super().retain(state, rows)
        buffers.moving()
        if retain_rows(state.arrays, rows) is None:  # rows moved in place, else a copy goes back in
            return buffers.load(self.take(state, rows))
        return buffers.view(len(rows), state.length)

    @cached_property
    def _bufferable(self) -> bool:
        spec = self.specs["step"]
        states = {inp for _, inp in spec.feeds}
        logits = spec.output(LOGITS).dims
        return (self.provider == "CPUExecutionProvider" and not self.io_binding
                and set(spec.input_names) == states | {INPUT_IDS}
                and set(spec.output_names) == {out for out, _ in spec.feeds} | {LOGITS}
                and len(logits) == 3 and logits[1] == 1 and isinstance(logits[2], int))


def _intact(state: State):
    """The row buffers `state` lies in (None: its own arrays); UsageError for a state whose rows
    have been written since (the batch stepped twice past it, or a leave moved rows under it):
    what it held is gone, and reading it would decode garbage."""
    buffers = state.rows
    if buffers is not None and not buffers.intact(state):
        raise UsageError("state: the engine's row buffers have moved on past this state (advance consumes "
                         "the state it steps); step or copy a state (state.numpy()) before advancing past it")
    return buffers
