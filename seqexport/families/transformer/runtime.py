"""The transformer at run time (numpy + onnxruntime): the encoder once, then decoder steps.

    model = seqexport.runtime.load("exported/transformer-tiny")
    state = model.start(src_ids)                   # runs the encoder
    logits, state = model.step(tokens, state)      # state.arrays: graph input name -> array

The self-attention cache is a preallocated buffer written in place (seqexport.state.appended):
a step reads it once and copies none of it, and rows at different positions (continuous
batching) share one decoder call. An artifact whose decoder predates `past_lengths`
(concatenating the cache) runs unchanged, with rows that stay in step.
"""

import numpy as np

from seqexport.errors import InputError
from seqexport.families.transformer.specs import (
    ATTENTION_MASK,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
)
from seqexport.runtime.base import RuntimeModel, State, tokens_2d
from seqexport.runtime.capabilities import StepModel
from seqexport.runtime.session import check_token_ids, to_numpy
from seqexport.state.layout import StateLayout
from seqexport.state.state import checked_states


class TransformerSteps(StepModel):
    """What generation does with any transformer that has start/step (ONNX or eager)."""

    family = "transformer"
    supports_beams = True
    takes_start_id = True  # the decoder starts from its own token, not from the source
    prompt_frame = {"bos": False, "suffix": "", "eos": True}  # the source ends with eos

    def begin(self, rows: list[list[int]], start_id: int | None = None) -> tuple[np.ndarray, State]:
        """Encode the sources (rows of unequal length, padding masked) and feed the decoder's
        start token (default: the tokenizer's bos, else 1). Returns logits (b, v) and the state."""
        state, pending = self.begin_rows(rows, start_id)
        return self.step(np.array([p[0] for p in pending], np.int64), state)

    def begin_rows(self, rows: list[list[int]], start_id: int | None = None) -> tuple[State, list[list[int]]]:
        """The encoder's state for these sources and the token each row's decoder still needs
        (its start token), which the engine feeds in the running batch's next step."""
        src = np.full((len(rows), max(map(len, rows))), self.pad_id, np.int64)  # (b, s)
        mask = np.zeros_like(src)
        for i, r in enumerate(rows):
            src[i, : len(r)] = r
            mask[i, : len(r)] = 1
        start = self.start_token(start_id)
        return self.start(src, mask), [[start] for _ in rows]

    def start_token(self, start_id: int | None = None) -> int:
        """The token the decoder starts from: `start_id`, else the tokenizer's (a checkpoint's
        decoder_start_token_id, else its bos, as the page's runtime reads it), else 1."""
        if start_id is None:
            start_id = self.tokenizer.start_id if self.tokenizer else None
        return 1 if start_id is None else start_id

    def feed(self, tokens, state: State) -> State:
        """The state after these (b, t) tokens; their logits are not needed."""
        return self.step(tokens, state)[1]

    # The state by kind (seqexport.state): the self-attention cache appended, the cross K/V
    # static over the source. Both the ONNX model and the eager one set `layout`.
    layout: StateLayout


class TransformerModel(TransformerSteps, RuntimeModel):
    begin_rows_runs_a_graph = True  # the encoder: the engine's starter thread runs it

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.specs["decoder"]
        # A decoder with per-row lengths (appended cache) or an older one that concatenates.
        self.buffered = spec.lengths is not None
        self.continuous_batching = self.buffered  # rows may join at any step boundary
        self.layout = StateLayout.of(spec, limit=self.config["max_len"])
        self._appends = spec.appends
        self._cross = [inp for _, inp in self.specs["encoder"].feeds]

    @property
    def vocab_size(self) -> int:
        return self.config["tgt_vocab_size"]

    @property
    def pad_id(self) -> int:
        return self.config["pad_id"]

    @property
    def max_new_tokens_limit(self) -> int:
        return self.config["max_len"]  # the start token and every fed token hold a position

    def start(self, src_ids, src_mask=None) -> State:
        """Run the encoder once; the state holds the cross K/V and an empty self-attention cache.

        src_ids (b, s) int; src_mask (b, s) with 1 = token, 0 = padding (default: src_ids != pad_id).
        """
        src = check_token_ids("src_ids", src_ids, self.config["src_vocab_size"])
        if src.shape[1] > self.config["max_len"]:
            raise InputError(f"src_ids: length {src.shape[1]} exceeds the positional table ({self.config['max_len']})")
        mask = (src != self.pad_id) if src_mask is None else tokens_2d(src_mask)[0]
        if mask.shape != src.shape:
            raise InputError(f"src_mask: shape {mask.shape} differs from src_ids {src.shape}")
        # any number type whose values are 0 and 1 (a float mask too, as other tools write them)
        off = (mask != 0) & (mask != 1) if mask.dtype.kind in "biuf" else None  # (b, s); NaN is off
        if off is None or off.any():
            bad = mask.dtype if off is None else mask.flat[np.flatnonzero(off)[0]].item()
            raise InputError(f"src_mask: expected 0/1 (or bool) values, 1 = token, 0 = padding; got {bad!r}")
        mask = mask.astype(np.int64)
        hidden = np.flatnonzero(mask.sum(1) == 0)
        if hidden.size:
            raise InputError(f"src_mask: row {int(hidden[0])} hides every source token; expected at least one 1")
        cross = self._fed("encoder", self._run("encoder", {INPUT_IDS: src, ATTENTION_MASK: mask}))
        arrays = {ENCODER_ATTENTION_MASK: mask, **cross, **self.layout.zeros(self.specs["decoder"], src.shape[0])}
        return State(arrays, 0).owning()

    def step(self, tokens, state: State) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new state."""
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        if not self.buffered:
            self.layout.check_room(state.length, ids.shape[1])
            out = self._run("decoder", {INPUT_IDS: ids, **state.arrays})
            new = State(self._feed_back("decoder", out, state.arrays), state.length + ids.shape[1])
            return (out[LOGITS][:, 0] if squeeze else out[LOGITS]), new
        arrays, writer, counts = self.layout.writable(state, ids.shape[1])
        out = self._run("decoder", {INPUT_IDS: ids, **self.layout.fed(arrays, counts, ids.shape[1])})
        new = self.layout.append(arrays, writer, {inp: to_numpy(out[o]) for o, inp in self._appends}, counts,
                                 ids.shape[1])
        return (out[LOGITS][:, 0] if squeeze else out[LOGITS]), new

    # --- serving: rows join and leave --------------------------------------------------------

    def join(self, states: list[State]) -> State:
        """One batch from several states (rows at any positions, sources of any length):
        sources padded (and masked) to the longest, cache buffers to the largest."""
        states = checked_states(states)
        lengths = {s.length for s in states}
        if not self.buffered and len(lengths) > 1:
            raise InputError(f"join: rows at positions {sorted(lengths)} cannot share one decoder call: this "
                             "artifact's decoder predates past_lengths (export it again for continuous batching)")
        return self.layout.join(states)

    def take(self, state: State, rows) -> State:
        """These rows, in this order; the source and the cache trimmed to what they still use."""
        return self.layout.take(state, rows)

    def extend(self, state: State, newcomers: list[State], rows: int | None = None) -> State:
        """The running batch with the newcomers' rows written into its spare rows (the rows
        already there are not copied); grown (all copied once, with room for `rows` rows) when
        rows, source or cache slots run out. `state` must not be used again."""
        if not self.buffered:
            return self.join([state, *newcomers])
        return self.layout.extend(state, newcomers, rows)

    def retain(self, state: State, rows: list[int]) -> State:
        """`take`, moving only the rows that change place (see RuntimeModel.retain); the source
        and the cache are cut (copied) only once they are well past what the rows use."""
        if not self.buffered:
            return self.take(state, rows)
        return self.layout.retain(state, rows)


Model = TransformerModel
