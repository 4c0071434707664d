"""What generation and the engine do with any recurrent-state LM that has `start(batch_size)`
and `step(tokens, state, last_only=...)` (Mamba, RWKV-7; ONNX or eager): a fixed-size state per
row, independent along the batch, that no padding may ever enter.
"""

import numpy as np

from seqexport.runtime.base import State
from seqexport.runtime.session import check_token_ids


class RecurrentSteps:
    supports_beams = False
    prompt_frame = {"bos": True, "suffix": "", "eos": False}

    def begin(self, rows: list[list[int]], start_id: int | None = None) -> tuple[np.ndarray, State]:
        """Prefill the prompts; rows of equal length go together (no padding ever enters the
        recurrent state), then the states join in order. Returns logits (b, v) and the state."""
        by_len: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            by_len.setdefault(len(r), []).append(i)
        states, logits, order = [], [], []
        for _, idx in sorted(by_len.items()):
            lg, st = self.step(np.array([rows[i] for i in idx], np.int64), self.start(len(idx)), last_only=True)
            states.append(st)
            logits.append(lg[:, -1])
            order += idx
        inverse = np.argsort(order)
        return np.concatenate(logits)[inverse], State.concat(states).select(inverse)

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
