"""The transformer at run time (numpy + onnxruntime): the encoder once, then decoder steps.

    model = seqexport.runtime.load("exported/transformer-tiny")
    state = model.start(src_ids)                   # runs the encoder
    logits, state = model.step(tokens, state)      # state.arrays: graph input name -> array

The self-attention cache is a preallocated buffer written in place (seqexport.runtime.kv_buffer):
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
    PAST_LENGTHS,
)
from seqexport.runtime import kv_buffer
from seqexport.runtime.base import RuntimeModel, State, retain_rows, tokens_2d, zero_state
from seqexport.runtime.session import check_token_ids, shape_and_dtype, to_numpy


class TransformerSteps:
    """What generation does with any transformer that has start/step (ONNX or eager)."""

    family = "transformer"
    supports_beams = True
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
        if start_id is None:
            start_id = self.tokenizer.bos_id if self.tokenizer else 1
        return self.start(src, mask), [[start_id] for _ in rows]

    def feed(self, tokens, state: State) -> State:
        """The state after these (b, t) tokens; their logits are not needed."""
        return self.step(tokens, state)[1]

    # --- the self-attention cache as an appended buffer (kv_buffer) -------------------------
    # Both the ONNX model and the eager one keep it so; each sets `_axes` (buffer input ->
    # its past_len axis), `_first` (one buffer's name) and has `max_new_tokens_limit`.

    def _check_room(self, length: int, t: int) -> None:
        if length + t > self.max_new_tokens_limit:
            raise InputError(f"tokens: context of {length + t} exceeds the positional table "
                             f"({self.max_new_tokens_limit} positions)")

    def _writable(self, state: State, t: int) -> tuple[dict, list, list[int]]:
        """The arrays a step of t tokens may write its new K/V into, their writer list, and the
        rows' lengths: the state's own buffers when it is their newest state, else copies
        (stepping an older state again must not change what its successors hold); grown when t
        more do not fit. A decode step is a hot path: the common case touches no array."""
        lengths = to_numpy(state.arrays[PAST_LENGTHS])
        first = state.arrays[self._first]
        shape = first.shape if type(first) is np.ndarray else shape_and_dtype(self._first, first)[0]
        capacity = shape[self._axes[self._first]]
        counts = lengths.tolist() if lengths.ndim == 1 else []  # one per row: a short list
        if not counts or len(counts) != shape[0] or min(counts) < 0 or max(counts) > capacity:
            raise InputError(f"{PAST_LENGTHS}: expected one count per row in [0, {capacity}] "
                             f"(the cache's slots), got {lengths.tolist()}")
        need = max(counts) + t
        self._check_room(need - t, t)
        if need > capacity:  # grown: each buffer copied once into a larger one
            buffers = kv_buffer.resized({name: to_numpy(state.arrays[name]) for name in self._axes}, self._axes,
                                        kv_buffer.capacity_for(need, self.max_new_tokens_limit))
        elif state.writer is None or state.writer[0] is not state:  # an older state: copies
            buffers = {name: to_numpy(state.arrays[name]).copy() for name in self._axes}
        else:  # the newest state over its buffers: the step writes into them in place
            return state.arrays, state.writer, counts
        return state.arrays | buffers, [None], counts

    def _appended(self, arrays: dict, writer: list, new: dict[str, np.ndarray], t: int, counts: list[int]) -> State:
        """The next state: the new positions written into the buffers, the lengths advanced."""
        lengths = arrays[PAST_LENGTHS]
        same = counts[0] if min(counts) == max(counts) else None
        kv_buffer.write_new(arrays, self._axes, new, lengths, same)
        state = State(arrays | {PAST_LENGTHS: lengths + t}, max(counts) + t, writer)
        writer[0] = state
        return state


class TransformerModel(TransformerSteps, RuntimeModel):
    begin_rows_runs_a_graph = True  # the encoder: the engine's starter thread runs it

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.specs["decoder"]
        # A decoder with per-row lengths (appended cache) or an older one that concatenates.
        self.buffered = spec.lengths is not None
        self.continuous_batching = self.buffered  # rows may join at any step boundary
        self._axes = {inp: kv_buffer.axis_of(spec.input(inp).dims) for _, inp in spec.appends}
        self._first = next(iter(self._axes), None)
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
        if mask.dtype.kind not in "biu" or not np.isin(mask, (0, 1)).all():
            bad = mask.flat[np.flatnonzero(~np.isin(mask, (0, 1)))[0]].item() if mask.dtype.kind in "biuf" else mask.dtype
            raise InputError(f"src_mask: expected 0/1 (or bool) values, 1 = token, 0 = padding; got {bad!r}")
        mask = mask.astype(np.int64)
        hidden = np.flatnonzero(mask.sum(1) == 0)
        if hidden.size:
            raise InputError(f"src_mask: row {int(hidden[0])} hides every source token; expected at least one 1")
        cross = self._fed("encoder", self._run("encoder", {INPUT_IDS: src, ATTENTION_MASK: mask}))
        b = src.shape[0]
        capacity = kv_buffer.capacity_for(1, self.config["max_len"]) if self.buffered else 0
        arrays = {ENCODER_ATTENTION_MASK: mask, **cross,
                  **zero_state(self.specs["decoder"], b, {"past_len": capacity}, skip=cross.keys())}
        if self.buffered:
            arrays[PAST_LENGTHS] = np.zeros(b, np.int64)
        return State(arrays, 0).owning()

    def step(self, tokens, state: State) -> tuple[np.ndarray, State]:
        """Feed tokens (b,) or (b, t); return logits (b, vocab) or (b, t, vocab) and the new state."""
        ids, squeeze = tokens_2d(tokens)
        ids = check_token_ids("tokens", ids, self.vocab_size)
        if not self.buffered:
            self._check_room(state.length, ids.shape[1])
            out = self._run("decoder", {INPUT_IDS: ids, **state.arrays})
            new = State(self._feed_back("decoder", out, state.arrays), state.length + ids.shape[1])
            return (out[LOGITS][:, 0] if squeeze else out[LOGITS]), new
        arrays, writer, same = self._writable(state, ids.shape[1])
        out = self._run("decoder", {INPUT_IDS: ids, **arrays})
        new = self._appended(arrays, writer, {inp: to_numpy(out[o]) for o, inp in self._appends}, ids.shape[1], same)
        return (out[LOGITS][:, 0] if squeeze else out[LOGITS]), new

    # --- serving: rows join and leave --------------------------------------------------------

    def join(self, states: list[State]) -> State:
        """One batch from several states (rows at any positions, sources of any length):
        sources padded (and masked) to the longest, cache buffers to the largest."""
        if not states:
            raise InputError("join: expected at least one state")
        return join_rows(states, self._cross, self._axes if self.buffered else None)

    def take(self, state: State, rows) -> State:
        """These rows, in this order; the source and the cache trimmed to what they still use."""
        return trim_rows(state.select(rows), self._cross, self._axes if self.buffered else None,
                         self.max_new_tokens_limit)

    def extend(self, state: State, newcomers: list[State]) -> State:
        """The running batch with the newcomers' rows written into its spare rows (the rows
        already there are not copied); grown (all copied once) when rows, source or cache
        slots run out. `state` must not be used again."""
        if not self.buffered:
            return self.join([state, *newcomers])
        ragged = {ENCODER_ATTENTION_MASK: 1} | dict.fromkeys(self._cross, 2) | self._axes  # name -> its padded axis
        arrays = extend_rows(state.numpy().arrays, [s.numpy().arrays for s in newcomers], ragged)
        return State(arrays, int(arrays[PAST_LENGTHS].max())).owning()

    def retain(self, state: State, rows: list[int]) -> State:
        """`take`, moving only the rows that change place (see RuntimeModel.retain); the source
        and the cache are cut (copied) only once they are well past what the rows use."""
        if not self.buffered:
            return self.take(state, rows)
        moved = retain_rows(state.numpy().arrays, rows)
        if moved is None:
            return self.take(state, rows)
        return trim_rows(State(moved, state.length), self._cross, self._axes, self.max_new_tokens_limit, slack=True)


def _pad(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """`a` zero-padded along `axis` to `size`."""
    if a.shape[axis] == size:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return np.pad(a, widths)


def join_rows(states: list[State], cross: list[str], axes: dict[str, int] | None) -> State:
    """The rows of several transformer states as one batch: sources zero-padded and masked to
    the longest (cross K/V (b, h, s, k)), cache buffers zero-padded to the largest capacity.
    `axes` None: a decoder that concatenates, whose rows must then be at one position."""
    states = [s.numpy() for s in states]
    src = max(s.arrays[ENCODER_ATTENTION_MASK].shape[1] for s in states)
    sizes = {ENCODER_ATTENTION_MASK: (1, src)} | {name: (2, src) for name in cross}  # name -> (axis, size)
    if axes is None:
        lengths = {s.length for s in states}
        if len(lengths) > 1:
            raise InputError(f"join: rows at positions {sorted(lengths)} cannot share one decoder call: this "
                             "artifact's decoder predates past_lengths (export it again for continuous batching)")
    else:
        capacity = max(s.arrays[name].shape[axis] for s in states for name, axis in axes.items())
        sizes |= {name: (axis, capacity) for name, axis in axes.items()}
    arrays = {key: np.concatenate([_pad(s.arrays[key], *sizes[key]) if key in sizes else s.arrays[key]
                                   for s in states])
              for key in states[0].arrays}
    return State(arrays, max(s.length for s in states)).owning()


def extend_rows(arrays: dict[str, np.ndarray], newcomers: list[dict[str, np.ndarray]],
                ragged: dict[str, int]) -> dict[str, np.ndarray]:
    """Each (b, ...) array with the newcomers' rows after its own, zero-padded along its
    `ragged` axis (source columns, cache slots) to the batch's size there. An array that is the
    leading rows of a larger buffer (`spare_rows`) that fits gets them written in place; any
    other is reallocated with room for as many rows again (the next joins write in place)."""
    n = next(iter(arrays.values())).shape[0]
    total = n + sum(next(iter(a.values())).shape[0] for a in newcomers)
    out = {}
    for name, a in arrays.items():
        axis = ragged.get(name)
        parts = [a] + [new[name] for new in newcomers]
        size = max(p.shape[axis] for p in parts) if axis is not None else None
        buf = spare_rows(a, total)
        if buf is None or (axis is not None and buf.shape[axis] < size):
            shape = list(a.shape)
            shape[0] = 2 * total
            if axis is not None:
                shape[axis] = size
            buf = np.zeros(shape, a.dtype)
            start = 0
        else:
            parts, start = parts[1:], n  # the batch's own rows are in place already
        for p in parts:
            rows = slice(start, start + p.shape[0])
            if axis is None:
                buf[rows] = p
            else:  # the row's columns past its own size must read as padding (0)
                buf[rows] = 0
                buf[(rows,) + (slice(None),) * (axis - 1) + (slice(0, p.shape[axis]),)] = p
            start += p.shape[0]
        out[name] = buf[:total]
    return out


def spare_rows(a: np.ndarray, rows: int) -> np.ndarray | None:
    """The buffer `a` is the leading rows of, when it has at least `rows` rows (views of a
    C-contiguous buffer's first rows are contiguous: a graph reads them as they are), else None."""
    buf = a.base
    if type(buf) is not np.ndarray or buf.shape[1:] != a.shape[1:] or buf.shape[0] < rows \
            or not buf.flags.c_contiguous or buf.ctypes.data != a.ctypes.data:
        return None
    return buf


def trim_rows(state: State, cross: list[str], axes: dict[str, int] | None, limit: int, slack: bool = False) -> State:
    """A state after rows left: the source cut to the last column any row still uses and a
    cache buffer more than twice as large as its rows need cut down (copies; `state` is fresh).
    `slack`: the source is cut only when a quarter of its columns or more are unused (each cut
    copies every row; the running batch would otherwise copy at almost every leave)."""
    arrays = dict(state.arrays)
    mask = arrays[ENCODER_ATTENTION_MASK]
    used = int(np.flatnonzero(mask.any(0))[-1]) + 1 if mask.size else 0
    if used < (mask.shape[1] * 3 // 4 + 1 if slack else mask.shape[1]):
        arrays[ENCODER_ATTENTION_MASK] = np.ascontiguousarray(mask[:, :used])
        for name in cross:
            arrays[name] = np.ascontiguousarray(arrays[name][:, :, :used])
    if axes:
        lengths = arrays[PAST_LENGTHS]
        capacity = kv_buffer.capacity_for(max(int(lengths.max(initial=0)), 1), limit)
        name, axis = next(iter(axes.items()))
        if arrays[name].shape[axis] > 2 * capacity:
            arrays |= kv_buffer.resized({k: arrays[k] for k in axes}, axes, capacity)
    return State(arrays, int(arrays[PAST_LENGTHS].max(initial=0)) if axes else state.length).owning()


Model = TransformerModel
