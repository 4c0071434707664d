"""A hybrid attention + Mamba-2 LM at run time (numpy + onnxruntime): prefill and step graphs over
one state of two kinds (seqexport.state) — the attention layers' KV cache appended in place at
each row's `past_lengths`, the Mamba-2 layers' conv/SSM state replaced whole.

    model = seqexport.runtime.load("exported/hybrid-tiny")
    state = model.start(batch_size)                # empty KV buffers, zero conv/SSM states
    logits, state = model.step(prompt_ids, state)  # several tokens go through the prefill graph
"""

from functools import cached_property

import numpy as np

from seqexport.errors import InputError
from seqexport.families.hybrid.specs import INPUT_IDS, LOGITS
from seqexport.runtime.base import RuntimeModel, State, tokens_2d
from seqexport.runtime.recurrent import PrefillRows, RecurrentSteps
from seqexport.runtime.session import check_token_ids, to_numpy
from seqexport.state.layout import StateLayout


class HybridSteps(RecurrentSteps):
    """What generation does with any hybrid that has start/step (ONNX or eager): its rows are
    independent along the batch, a prompt is prefilled, and rows join a running batch at any
    position (each keeps its own past_lengths)."""

    family = "hybrid"
    layout: StateLayout  # the state by kind: both the ONNX model and the eager one set it

    # --- serving: rows join and leave, through the kinds -----------------------------------------

    def join(self, states: list[State]) -> State:
        return self.layout.join(states)  # (which refuses anything but a non-empty list of states)

    def take(self, state: State, rows) -> State:
        return self.layout.take(state, rows)

    def extend(self, state: State, newcomers: list[State], rows: int | None = None) -> State:
        return self.layout.extend(state, newcomers, rows)

    def retain(self, state: State, rows: list[int]) -> State:
        return self.layout.retain(state, rows)


class HybridModel(PrefillRows, HybridSteps, RuntimeModel):
    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @cached_property
    def layout(self) -> StateLayout:
        return StateLayout.of(self.specs["step"])

    def start(self, batch_size: int) -> State:
        """Empty KV buffers and zero conv/SSM states for `batch_size` fresh sequences."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise InputError(f"batch_size: expected a positive integer, got {batch_size!r}")
        return State(self.layout.zeros(self.specs["step"], int(batch_size)), 0).owning()

    def step(self, tokens, state: State, last_only: bool = False) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new
        state. One token goes through the step graph, several through the prefill graph.
        `last_only`: logits (b, 1, vocab) of the last token only (the prefill graph computes
        the head for one position)."""
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        mask = np.ones(ids.shape, np.int64) if ids.shape[1] > 1 else None
        out, state = self._advance(ids, mask, state, last_only)
        logits = out[LOGITS][:, -1:] if last_only else out[LOGITS]
        return (logits[:, 0] if squeeze else logits), state

    def prefill_rows(self, ids: np.ndarray, mask: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """Right-padded rows in one prefill run (see RecurrentSteps.begin): each row's logits
        after its own last token (b, v); each row's cache advanced by its own tokens."""
        ids = check_token_ids("tokens", ids, self.vocab_size)
        out, state = self._advance(ids, mask, state, True)
        return out[LOGITS][:, -1], state

    def _advance(self, ids: np.ndarray, mask: np.ndarray | None, state: State, last_only: bool):
        graph = "step" if mask is None else "prefill"
        arrays, writer, counts = self.layout.writable(state, ids.shape[1])
        feeds = {INPUT_IDS: ids, **self.layout.fed(arrays, counts, ids.shape[1])}
        if mask is not None:
            feeds |= self._prefill_extras(mask, last_only)
        out = self._run(graph, feeds)
        spec = self.specs[graph]
        new = {inp: to_numpy(out[o]) for o, inp in spec.appends}
        advance = 1 if mask is None else mask.sum(1).astype(np.int64)  # each row by its own tokens
        return out, self.layout.append(arrays | self._fed(graph, out), writer, new, counts, advance)


Model = HybridModel
