"""Repetition, presence and frequency penalties: a row's next-token scores adjusted by the
tokens the row has seen, before greedy, sampling or beam search pick from them.

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
    """Whether the options ask for any penalty (else the rows keep no `Seen`)."""
    return options.repetition_penalty != 1 or options.presence_penalty != 0 or options.frequency_penalty != 0


class Seen:
    """The tokens one row has seen, for its penalties."""

    def __init__(self, options, context=()):
        """`context`: the ids the repetition penalty counts before any is generated (a language
        model's prompt)."""
        self.repetition = float(options.repetition_penalty)
        self.presence = float(options.presence_penalty)
        self.frequency = float(options.frequency_penalty)
        self._ids = list(dict.fromkeys(int(t) for t in context))  # each once, for the repetition penalty
        self._known = set(self._ids)
        self._counts: dict[int, int] = {}  # generated token -> times

    def add(self, token: int) -> None:
        token = int(token)
        if token not in self._known:
            self._known.add(token)
            self._ids.append(token)
        self._counts[token] = self._counts.get(token, 0) + 1

    def apply(self, scores: np.ndarray) -> np.ndarray:
        """(v,) scores -> (v,) a penalised copy in their dtype (ids at or past v, which the row
        cannot pick, skipped)."""
        out = np.array(scores, copy=True)
        v, real = out.shape[-1], out.dtype.type
        if self.repetition != 1 and self._ids:
            ids = np.fromiter((t for t in self._ids if t < v), np.int64)  # (n,)
            s = out[ids]
            out[ids] = np.where(s < 0, s * real(self.repetition), s / real(self.repetition))
        if (self.presence or self.frequency) and self._counts:
            ids = np.fromiter(self._counts, np.int64, len(self._counts))  # (m,)
            counts = np.fromiter(self._counts.values(), out.dtype, len(self._counts))  # (m,)
            keep = ids < v
            out[ids[keep]] -= real(self.frequency) * counts[keep] + real(self.presence)
        return out
