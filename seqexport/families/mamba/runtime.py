"""A Mamba LM at run time (numpy + onnxruntime): prefill and step graphs over explicit state.

    model = seqexport.runtime.load("exported/mamba-tiny-loop")
    state = model.start(batch_size)                # zero conv/SSM states
    logits, state = model.step(prompt_ids, state)  # several tokens go through the prefill graph
"""

from functools import cached_property

import numpy as np

from seqexport.errors import InputError
from seqexport.families.mamba.specs import INPUT_IDS, LOGITS
from seqexport.runtime.base import RuntimeModel, State, tokens_2d, zero_state
from seqexport.runtime.recurrent import BufferedRows, PrefillRows, RecurrentSteps
from seqexport.runtime.session import check_token_ids


class MambaSteps(RecurrentSteps):
    """What generation does with any Mamba that has start/step (ONNX or eager)."""

    family = "mamba"


class MambaModel(BufferedRows, PrefillRows, MambaSteps, RuntimeModel):
    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @cached_property
    def prefill_len(self) -> int | None:
        """The fixed length of an `unrolled` prefill graph, else None (dynamic)."""
        dim = self.specs["prefill"].input(INPUT_IDS).dims[1]
        return dim if isinstance(dim, int) else None

    def start(self, batch_size: int) -> State:
        """Zero conv and SSM states for `batch_size` fresh sequences."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise InputError(f"batch_size: expected a positive integer, got {batch_size!r}")
        return State(zero_state(self.specs["step"], int(batch_size)), 0)

    def step(self, tokens, state: State, last_only: bool = False) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new state.

        Several tokens go through the prefill graph (in pieces of its fixed length for an
        `unrolled` export, the rest through the step graph). `last_only`: logits (b, 1, vocab) of
        the last token only, which is all generation needs: the prefill graph then computes the
        head for one position (its `logits_to_keep` input; exports without it compute them all).
        """
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        pieces = []
        pos = 0
        while pos < ids.shape[1]:
            n = ids.shape[1] - pos
            fixed = self.prefill_len
            if n == 1 or (fixed is not None and n < fixed):
                graph, n, extra = "step", 1, {}
            else:
                graph, n = "prefill", (fixed or n)
                extra = self._prefill_extras(np.ones((ids.shape[0], n), np.int64), last_only)
            out = self._run(graph, {INPUT_IDS: ids[:, pos : pos + n], **state.arrays, **extra})
            state = State(self._feed_back(graph, out, state.arrays), state.length + n)
            pieces.append(out[LOGITS])
            pos += n
        if last_only:
            pieces = [pieces[-1][:, -1:]]  # (b, 1, v)
        logits = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=1)
        return (logits[:, 0] if squeeze else logits), state


Model = MambaModel
