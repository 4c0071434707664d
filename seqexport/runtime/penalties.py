"""Logit bias and the repetition, presence and frequency penalties: a row's next-token scores
adjusted, by fixed amounts and by the tokens the row has seen, before greedy, sampling or beam
search pick from them.

- `logit_bias` (OpenAI's; transformers' sequence_bias of one-token sequences): a fixed number
  added to a token's score, first, as transformers' SequenceBiasLogitsProcessor comes first.

- `repetition_penalty` (transformers' and vLLM's; 1: off): each token already among the row's
  ids (a language model: the prompt and what it generated; an encoder-decoder: what its
  decoder generated) has its score divided by the penalty where positive, multiplied where
  negative, once however often it came, as transformers' RepetitionPenaltyLogitsProcessor.
- `frequency_penalty` and `presence_penalty` (OpenAI's; 0: off): each token generated so far
  loses frequency_penalty for every time it was generated and presence_penalty once, as
  vLLM applies them (after the repetition penalty, before temperature).

One `Seen` per row; `Seen.apply(scores)` gives the adjusted copy, `Seen.add(token)` counts a
token the row took. In the scores' dtype (float32 logits, as transformers computes them).
"""

import numpy as np


def penalized(options) -> bool:
    """Whether the options ask for any bias or penalty (else the rows keep no `Seen`)."""
    return (options.repetition_penalty != 1 or options.presence_penalty != 0 or options.frequency_penalty != 0
            or bool(options.logit_bias))


class Seen:
    """The tokens one row has seen, for its penalties: each token once, in a slot of two growing
    arrays (its id; the times it was generated), so that applying them is a gather and a scatter
    over the row's distinct tokens, not a Python loop (a 4,096-token history cost 0.5-1.4 ms a
    token that way, on the engine thread)."""

    def __init__(self, options, context=()):
        """`context`: the ids the repetition penalty counts before any is generated (a language
        model's prompt)."""
        self.repetition = float(options.repetition_penalty)
        self.presence = float(options.presence_penalty)
        self.frequency = float(options.frequency_penalty)
        self._bias_ids = np.array([t for t, _ in options.logit_bias], np.int64)  # (m,)
        self._bias = np.array([b for _, b in options.logit_bias], np.float64)  # (m,)
        self._slot: dict[int, int] = {}  # token -> its slot
        self._ids = np.empty(64, np.int64)  # (capacity,) slot -> token
        self._counts = np.zeros(64, np.int64)  # (capacity,) slot -> times generated
        self._n = 0  # slots in use
        for t in context:
            self._see(int(t))

    def _see(self, token: int) -> int:
        slot = self._slot.get(token)
        if slot is None:
            slot = self._n
            if slot == len(self._ids):  # full: twice the room
                self._ids = np.concatenate([self._ids, np.empty_like(self._ids)])
                self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
            self._ids[slot], self._slot[token] = token, slot
            self._n += 1
        return slot

    def copy(self) -> "Seen":
        """Another row's history that starts as this one (a beam that splits)."""
        twin = object.__new__(Seen)
        twin.__dict__.update(self.__dict__)
        twin._slot, twin._ids, twin._counts = dict(self._slot), self._ids.copy(), self._counts.copy()
        return twin

    def add(self, token: int) -> None:
        slot = self._see(int(token))  # (first: it may grow the arrays)
        self._counts[slot] += 1

    def apply(self, scores: np.ndarray) -> np.ndarray:
        """(v,) scores -> (v,) a penalised copy in their dtype (ids at or past v, which the row
        cannot pick, skipped)."""
        out = np.array(scores, copy=True)
        v, real = out.shape[-1], out.dtype.type
        if self._bias_ids.size:
            biased = self._bias_ids < v
            out[self._bias_ids[biased]] += self._bias[biased].astype(out.dtype)
        ids = self._ids[: self._n]  # (n,) every distinct token seen
        pickable = ids < v
        if self.repetition != 1:
            seen = ids[pickable]
            s = out[seen]
            out[seen] = np.where(s < 0, s * real(self.repetition), s / real(self.repetition))
        if self.presence or self.frequency:
            counts = self._counts[: self._n]
            generated = pickable & (counts > 0)  # (n,) the answer's tokens
            times = counts[generated].astype(out.dtype)
            out[ids[generated]] -= real(self.frequency) * times + real(self.presence)
        return out
