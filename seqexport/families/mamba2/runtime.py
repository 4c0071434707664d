"""A Mamba-2 LM at run time (numpy + onnxruntime): prefill and step graphs over explicit state.

    model = seqexport.runtime.load("exported/mamba2-tiny")
    state = model.start(batch_size)                # zero conv/SSM states
    logits, state = model.step(prompt_ids, state)  # several tokens go through the prefill graph
"""

import numpy as np

from seqexport.errors import InputError
from seqexport.families.mamba2.specs import INPUT_IDS, LOGITS
from seqexport.runtime.base import RuntimeModel, State, tokens_2d, zero_state
from seqexport.runtime.recurrent import BufferedRows, PrefillRows, RecurrentSteps
from seqexport.runtime.session import check_token_ids


class Mamba2Steps(RecurrentSteps):
    """What generation does with any Mamba-2 that has start/step (ONNX or eager)."""

    family = "mamba2"


class Mamba2Model(BufferedRows, PrefillRows, Mamba2Steps, RuntimeModel):
    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    def start(self, batch_size: int) -> State:
        """Zero conv and SSM states for `batch_size` fresh sequences."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise InputError(f"batch_size: expected a positive integer, got {batch_size!r}")
        return State(zero_state(self.specs["step"], int(batch_size)), 0)

    def step(self, tokens, state: State, last_only: bool = False) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new
        state. One token goes through the step graph, several through the prefill graph.
        `last_only`: logits (b, 1, vocab) of the last token only (the prefill graph computes
        the head for one position: its `logits_to_keep` input)."""
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        graph = "step" if ids.shape[1] == 1 else "prefill"
        extra = {}
        if graph == "prefill":
            extra = self._prefill_extras(np.ones(ids.shape, np.int64), last_only)
        out = self._run(graph, {INPUT_IDS: ids, **state.arrays, **extra})
        state = State(self._feed_back(graph, out, state.arrays), state.length + ids.shape[1])
        logits = out[LOGITS][:, -1:] if last_only else out[LOGITS]
        return (logits[:, 0] if squeeze else logits), state


Model = Mamba2Model
