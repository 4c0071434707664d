"""An RWKV-7 LM at run time (numpy + onnxruntime): prefill and step graphs over explicit state.

    model = seqexport.runtime.load("exported/rwkv-tiny")
    state = model.start(batch_size)                # zero token shifts and WKV states
    logits, state = model.step(prompt_ids, state)  # several tokens go through the prefill graph
"""

import numpy as np

from seqexport.errors import InputError
from seqexport.families.rwkv.specs import INPUT_IDS, LOGITS
from seqexport.runtime.base import RuntimeModel, State, tokens_2d, zero_state
from seqexport.runtime.recurrent import BufferedRows, PrefillRows, RecurrentSteps
from seqexport.runtime.session import check_token_ids


class RwkvSteps(RecurrentSteps):
    """What generation does with any RWKV-7 that has start/step (ONNX or eager)."""

    family = "rwkv"


class RwkvModel(BufferedRows, PrefillRows, RwkvSteps, RuntimeModel):
    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    def start(self, batch_size: int) -> State:
        """Zero token shifts and WKV states for `batch_size` fresh sequences."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise InputError(f"batch_size: expected a positive integer, got {batch_size!r}")
        return State(zero_state(self.specs["step"], int(batch_size)), 0)

    def step(self, tokens, state: State, last_only: bool = False) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new
        state. One token goes through the step graph, several through the prefill graph.
        `last_only`: logits (b, 1, vocab) of the last token only, which is all generation needs:
        the prefill graph then computes the head for one position (its `logits_to_keep` input)."""
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


Model = RwkvModel
