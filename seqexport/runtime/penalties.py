"""Logit bias, the penalties and transformers' token rules: a row's next-token scores adjusted,
by fixed amounts, by the tokens the row has seen and by its length, before greedy, sampling or
beam search pick from them.

- `logit_bias` (OpenAI's) and `sequence_bias` (transformers'): a fixed number added to a token's
  score, first, as transformers' SequenceBiasLogitsProcessor comes first; a sequence of several
  tokens biases its last one where the row's ids end with the rest. `bad_words_ids` are such
  sequences biased by -inf (a one-token one that is an eos id excepted, as transformers does).
- `repetition_penalty` (transformers' and vLLM's; 1: off): each token already among the row's
  ids (a language model: the prompt and what it generated; an encoder-decoder: what its
  decoder generated) has its score divided by the penalty where positive, multiplied where
  negative, once however often it came, as transformers' RepetitionPenaltyLogitsProcessor.
- `frequency_penalty` and `presence_penalty` (OpenAI's; 0: off): each token generated so far
  loses frequency_penalty for every time it was generated and presence_penalty once, as
  vLLM applies them (after the repetition penalty, before temperature).
- Then transformers' bans and forcings, in its order: `no_repeat_ngram_size` (no n-gram of the
  row's ids twice), `min_length` and `min_new_tokens` (no eos yet), `forced_bos_token_id` (the
  first of a one-token start), `forced_eos_token_id` (the last new token), `suppress_tokens`
  (never), `begin_suppress_tokens` (not first).

The sequence rules read the row's ids as transformers' generate holds them (its input_ids): a
language model's prompt then what it generated; an encoder-decoder's decoder start then what it
generated. One `Seen` per row; `Seen.apply(scores)` gives the adjusted copy, `Seen.add(token)`
counts a token the row took. In the scores' dtype (float32 logits, as transformers computes
them; beam search's float64 log-probabilities).
"""

import numpy as np

# the SearchOptions fields `Seen` applies beside the penalties, with the value that turns each off
RULES = {"sequence_bias": (), "bad_words_ids": (), "no_repeat_ngram_size": 0, "min_length": 0,
         "forced_bos_token_id": None, "forced_eos_token_id": None, "suppress_tokens": (),
         "begin_suppress_tokens": ()}


def penalized(options) -> bool:
    """Whether the options ask for any bias, penalty or token rule (else the rows keep no `Seen`)."""
    return (options.repetition_penalty != 1 or options.presence_penalty != 0 or options.frequency_penalty != 0
            or bool(options.logit_bias) or any(getattr(options, k) != off for k, off in RULES.items()))


def _fixed_biases(options, eos: tuple) -> tuple[dict[int, float], list[tuple[tuple[int, ...], int, float]]]:
    """The bias every step adds ({token: bias}) and the sequences of several tokens, as (the ids
    before the last, the last, its bias), in the order given: logit_bias, sequence_bias, bad words."""
    always: dict[int, float] = {}
    sequences = []
    items = [((t,), b) for t, b in options.logit_bias] + list(options.sequence_bias)
    items += [(tuple(w), -np.inf) for w in options.bad_words_ids if not (len(w) == 1 and w[0] in eos)]
    for ids, bias in items:
        if len(ids) == 1:
            always[ids[0]] = always.get(ids[0], 0.0) + bias
        else:
            sequences.append((tuple(ids[:-1]), ids[-1], bias))
    return always, sequences


class Seen:
    """The tokens one row has seen, for its penalties: each token once, in a slot of two growing
    arrays (its id; the times it was generated), so that applying them is a gather and a scatter
    over the row's distinct tokens, not a Python loop (a 4,096-token history cost 0.5-1.4 ms a
    token that way, on the engine thread). The sequence rules keep the row's ids in order, and
    for no_repeat_ngram_size each (n-1)-gram's followers, updated as tokens come."""

    def __init__(self, options, context=(), eos=()):
        """`context`: the row's ids before any is generated, transformers' input_ids (a language
        model's prompt; an encoder-decoder's decoder start), which the repetition penalty and the
        sequence rules read; `eos`: the ids that end the row (min_length, bad words)."""
        self.repetition = float(options.repetition_penalty)
        self.presence = float(options.presence_penalty)
        self.frequency = float(options.frequency_penalty)
        always, self._sequences = _fixed_biases(options, tuple(eos))
        self._bias_ids = np.array(list(always), np.int64)  # (m,)
        self._bias = np.array(list(always.values()), np.float64)  # (m,)
        self._slot: dict[int, int] = {}  # token -> its slot
        self._ids = np.empty(64, np.int64)  # (capacity,) slot -> token
        self._counts = np.zeros(64, np.int64)  # (capacity,) slot -> times generated
        self._n = 0  # slots in use
        for t in context:
            self._see(int(t))
        self._history = [int(t) for t in context]  # transformers' input_ids for this row
        self._ngram = int(options.no_repeat_ngram_size)
        # (n-1) ids -> the ids that followed them (frozensets: a copy shares them until one grows)
        self._follows: dict[tuple, frozenset] = {}
        for end in range(self._ngram, len(self._history) + 1) if self._ngram else ():
            self._follow(end)
        self._eos = np.array(sorted(set(eos) - {-1}), np.int64)  # (k,)
        self._begin = len(self._history)  # ids before the first new token
        # min_new_tokens, where set, replaces min_length (transformers' _prepare_generated_length)
        self._min_length = self._begin + options.min_new_tokens if options.min_new_tokens else options.min_length
        self._forced_bos = options.forced_bos_token_id
        forced_eos = options.forced_eos_token_id
        self._forced_eos = (None if forced_eos is None
                            else np.array(forced_eos if isinstance(forced_eos, tuple) else (forced_eos,), np.int64))
        self._last = self._begin + options.new_tokens(self._begin) - 1  # ids before the last new token
        self._suppress = np.array(options.suppress_tokens, np.int64)  # (s,)
        self._begin_suppress = np.array(options.begin_suppress_tokens, np.int64)  # (s,)
        # transformers' begin index: one later where a one-token start gets its forced bos first
        self._begin_at = self._begin + (1 if self._begin == 1 and self._forced_bos is not None else 0)

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

    def _follow(self, end: int) -> None:
        """Record the n-gram of the ids that ends before `end`."""
        n = self._ngram
        key = tuple(self._history[end - n: end - 1])
        self._follows[key] = self._follows.get(key, frozenset()) | {self._history[end - 1]}

    def copy(self) -> "Seen":
        """Another row's history that starts as this one (a beam that splits)."""
        twin = object.__new__(Seen)
        twin.__dict__.update(self.__dict__)
        twin._slot, twin._ids, twin._counts = dict(self._slot), self._ids.copy(), self._counts.copy()
        twin._history, twin._follows = list(self._history), dict(self._follows)
        return twin

    def add(self, token: int) -> None:
        slot = self._see(int(token))  # (first: it may grow the arrays)
        self._counts[slot] += 1
        self._history.append(int(token))
        if self._ngram and len(self._history) >= self._ngram:
            self._follow(len(self._history))

    def _bias_now(self, dtype) -> tuple[np.ndarray, np.ndarray]:
        """(ids, biases) this step adds: the fixed ones and those of the sequences the row's ids
        now end with the rest of, summed per token (as transformers sums them before adding)."""
        if not self._sequences:
            return self._bias_ids, self._bias.astype(dtype)
        total = dict(zip(self._bias_ids.tolist(), self._bias.astype(dtype).tolist()))
        h = self._history
        for prefix, last, bias in self._sequences:
            if len(prefix) <= len(h) and tuple(h[len(h) - len(prefix):]) == prefix:
                total[last] = dtype(dtype(total.get(last, 0.0)) + dtype(bias))
        return np.array(list(total), np.int64), np.array(list(total.values()), dtype)

    def apply(self, scores: np.ndarray) -> np.ndarray:
        """(v,) scores -> (v,) a penalised copy in their dtype (ids at or past v, which the row
        cannot pick, skipped)."""
        out = np.array(scores, copy=True)
        v, real = out.shape[-1], out.dtype.type
        bias_ids, bias = self._bias_now(real)
        if bias_ids.size:
            biased = bias_ids < v
            out[bias_ids[biased]] += bias[biased]
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
        self._rules(out, v)
        return out

    def _rules(self, out: np.ndarray, v: int) -> None:
        """transformers' bans and forcings on `out` (v,), in place, in its processors' order."""
        length = len(self._history)
        if self._ngram and length >= self._ngram:
            banned = self._follows.get(tuple(self._history[length - self._ngram + 1:]), ())
            out[[t for t in banned if t < v]] = -np.inf
        if length < self._min_length:
            out[self._eos[self._eos < v]] = -np.inf
        for forced, at in ((self._forced_bos, 1), (self._forced_eos, self._last)):
            if forced is not None and length == at:
                out[:] = -np.inf
                out[forced] = 0
        out[self._suppress[self._suppress < v]] = -np.inf
        if length == self._begin_at:
            out[self._begin_suppress[self._begin_suppress < v]] = -np.inf
