"""One graph's state inputs sorted by kind (see `seqexport.state`), and every operation on a
whole state: zeros, in-place writes of appended positions (copying first on a branch),
rows joining and leaving. A runtime model keeps one layout per stepping graph and asks it;
nothing here knows a family."""

import weakref
from dataclasses import dataclass, field

import numpy as np

from seqexport.errors import InputError
from seqexport.specs import GraphSpec
from seqexport.state import appended as buffers
from seqexport.state.arrays import shape_and_dtype, to_numpy
from seqexport.state.rows import cut, extend_rows, pad_to, retain_rows
from seqexport.state.state import State, checked_states, zero_state

KINDS = ("appended", "replaced", "static")


def kinds_of(spec: GraphSpec) -> dict[str, str]:
    """state input -> its kind, from what the spec declares: written by its `appends`, appended;
    replaced by its own `feeds`, replaced; fed by another graph (read only), static."""
    appended = {inp for _, inp in spec.appends}
    replaced = {inp for _, inp in spec.feeds}
    return {t.name: "appended" if t.name in appended else "replaced" if t.name in replaced else "static"
            for t in spec.state_inputs}


def _source_axis(dims) -> int | None:
    """The first symbolic axis after the batch (a static input's source length)."""
    return next((i for i, d in enumerate(dims) if i and isinstance(d, str)), None)


@dataclass(frozen=True)
class StateLayout:
    kinds: dict[str, str]  # state input -> kind
    axes: dict[str, int]  # appended buffer -> its past_len axis
    lengths: str | None  # the input giving each row's valid appended slots
    ragged: dict[str, int]  # static input, or the mask over its source -> the source axis
    masks: dict[str, tuple[str, ...]]  # those masks -> the static inputs over their source
    limit: int | None  # the most slots an appended row may hold (a positional table), or None
    pool: buffers.CopyPool = field(default_factory=buffers.CopyPool, compare=False, repr=False)  # branch copies

    @classmethod
    def of(cls, spec: GraphSpec, limit: int | None = None) -> "StateLayout":
        kinds = kinds_of(spec)
        axes = {name: buffers.axis_of(spec.input(name).dims) for name, k in kinds.items() if k == "appended"}
        ragged = {name: _source_axis(spec.input(name).dims) for name, k in kinds.items() if k == "static"}
        ragged = {name: axis for name, axis in ragged.items() if axis is not None}
        source = {name: spec.input(name).dims[axis] for name, axis in ragged.items()}  # name -> its dim name
        masks = {t.name: tuple(n for n, d in source.items() if d == t.dims[1]) for t in spec.inputs
                 if t.role == "mask" and len(t.dims) == 2 and t.dims[1] in source.values()}
        ragged |= dict.fromkeys(masks, 1)
        return cls(kinds, axes, spec.lengths.name if spec.lengths else None, ragged, masks, limit)

    # --- a fresh state ---------------------------------------------------------------------

    def zeros(self, spec: GraphSpec, batch: int, skip=frozenset()) -> dict[str, np.ndarray]:
        """Zero replaced and appended state for `batch` fresh rows (appended buffers with a few
        slots, every row's length 0); static inputs are another graph's outputs (`skip` them)."""
        capacity = buffers.capacity_for(1, self.limit) if self.axes else 0
        arrays = zero_state(spec, batch, {"past_len": capacity}, skip=set(skip) | set(self.ragged))
        if self.lengths:
            arrays[self.lengths] = np.zeros(batch, np.int64)
        return arrays

    # --- appended: in-place writes, branch copies -------------------------------------------

    def check_room(self, length: int, t: int) -> None:
        if self.limit is not None and length + t > self.limit:
            raise InputError(f"tokens: context of {length + t} exceeds the positional table ({self.limit} positions)")

    def writable(self, state: State, t: int) -> tuple[dict, list, list[int]]:
        """The arrays a step of t tokens may write its new positions into, their writer list,
        and the rows' lengths: the state's own buffers when it is their newest state or no newer
        one is still held, else copies (stepping an older state again — a branch — must not
        change what its successors hold); grown when t more do not fit. A decode step is a hot
        path: the common case touches no array."""
        lengths = to_numpy(state.arrays[self.lengths])
        first_name = next(iter(self.axes))
        first = state.arrays[first_name]
        shape = first.shape if type(first) is np.ndarray else shape_and_dtype(first_name, first)[0]
        capacity = shape[self.axes[first_name]]
        counts = lengths.tolist() if lengths.ndim == 1 else []  # one per row: a short list
        if not counts or len(counts) != shape[0] or min(counts) < 0 or max(counts) > capacity:
            raise InputError(f"{self.lengths}: expected one count per row in [0, {capacity}] "
                             f"(the cache's slots), got {lengths.tolist()}")
        need = max(counts) + t
        self.check_room(need - t, t)
        if need > capacity:  # grown: each buffer copied once into a larger one
            grown = buffers.resized({name: to_numpy(state.arrays[name]) for name in self.axes}, self.axes,
                                    buffers.capacity_for(need, self.limit))
        elif not self._may_write(state, lengths):
            # an older state (a branch): copied once, into buffers an earlier branch let go
            grown = self.pool.copies({name: to_numpy(state.arrays[name]) for name in self.axes})
        else:  # the newest state over its buffers, or no newer one is held: written in place
            return state.arrays, state.writer, counts
        return state.arrays | grown, [None, []], counts

    def fed(self, arrays: dict, counts: list[int], t: int) -> dict:
        """What a call of t tokens over `arrays` (from `writable`) reads. A one-token step reads
        the buffers in place, spare slots and all (masked; a sixteenth spare). A call of several
        tokens (a prefill) attends from each of them over every slot it is given, so it gets the
        buffers cut to the slots its rows hold when the spare ones would cost more than copying
        those: a fresh prompt's buffers are empty (nothing to copy), where whole they held about
        its own length again in spare slots. The new positions are still written into `arrays`."""
        if t == 1 or not self.axes:
            return arrays
        held = max(counts)
        first = next(iter(self.axes))
        if type(arrays[first]) is not np.ndarray:  # a device buffer (IO binding): read as it is
            return arrays
        spare = arrays[first].shape[self.axes[first]] - held
        if held and t * spare <= 2 * held:
            return arrays
        return arrays | {name: np.ascontiguousarray(arrays[name][(slice(None),) * axis + (slice(0, held),)])
                         for name, axis in self.axes.items()}

    def _may_write(self, state: State, lengths: np.ndarray) -> bool:
        """Whether a step from `state` may write into its buffers in place: it is their newest
        state, or no state still held over them has a slot past its rows' lengths (the newer
        ones were let go: "regenerate" once the previous continuation is dropped)."""
        writer = state.writer
        if writer is None:
            return False
        if writer[0] is not None and writer[0]() is state:
            return True  # the decode loop's case
        for ref in writer[1]:
            other = ref()
            if other is not None and other is not state:
                theirs = to_numpy(other.arrays[self.lengths])
                if theirs.shape != lengths.shape or (theirs > lengths).any():
                    return False
        return True

    def append(self, arrays: dict, writer: list, new: dict[str, np.ndarray], counts: list[int],
               advance) -> State:
        """The next state: the new positions written into the buffers at each row's length,
        the lengths advanced by `advance` (an int, or one count per row: a right-padded
        prefill's rows each advance by their own tokens)."""
        lengths = arrays[self.lengths]
        same = counts[0] if min(counts) == max(counts) else None
        buffers.write_new(arrays, self.axes, new, lengths, same)
        lengths = lengths + advance
        state = State(arrays | {self.lengths: lengths}, int(lengths.max()), writer)
        writer[0] = weakref.ref(state)  # not the state itself: a cycle would keep its buffers until gc runs
        held = writer[1]  # every state over these buffers, weakly: what a step from an older one may write over
        held.append(writer[0])
        if len(held) > 32:
            held[:] = [r for r in held if r() is not None]
        return state

    # --- rows joining and leaving --------------------------------------------------------------

    def join(self, states: list[State]) -> State:
        """The rows of several states as one batch, in order: static sources padded (and their
        masks with 0s) to the longest, appended buffers to the largest capacity."""
        states = [s.numpy() for s in checked_states(states)]
        sizes = {name: (axis, max(s.arrays[name].shape[axis] for s in states)) for name, axis in
                 (self.ragged | self.axes).items()}
        arrays = {key: np.concatenate([pad_to(s.arrays[key], *sizes[key]) if key in sizes else s.arrays[key]
                                       for s in states])
                  for key in states[0].arrays}
        return State(arrays, self._length(arrays, max(s.length for s in states))).owning()

    def take(self, state: State, rows) -> State:
        """These rows, in this order; sources and buffers trimmed to what they still use."""
        return self.trim(state.select(rows))

    def extend(self, state: State, newcomers: list[State], rows: int | None = None) -> State:
        """The running batch with the newcomers' rows written into its spare rows (the rows
        already there are not copied); reallocated with room for `rows` rows (the most the batch
        may hold) when they do not fit. `state` must not be used again."""
        checked_states([state, *newcomers], "extend")
        arrays = extend_rows(state.numpy().arrays, [s.numpy().arrays for s in newcomers], self.ragged | self.axes,
                             rows)
        return State(arrays, self._length(arrays, max(s.length for s in [state, *newcomers]))).owning()

    def retain(self, state: State, rows: list[int]) -> State:
        """`take`, moving only the rows that change place (see `rows.retain_rows`); sources and
        buffers are cut (copied) only once they are well past what the rows use."""
        moved = retain_rows(state.numpy().arrays, rows)
        if moved is None:
            return self.take(state, rows)
        return self.trim(State(moved, state.length), slack=True)

    def trim(self, state: State, slack: bool = False) -> State:
        """A state after rows left: each static source cut to the last column any row still
        uses (its mask says), an appended buffer more than twice as large as its rows need cut
        down (copies; `state` is fresh). `slack`: a source is cut only when a quarter of its
        columns or more are unused (each cut copies every row; the running batch would
        otherwise copy at almost every leave)."""
        arrays = dict(state.arrays)
        for mask, over in self.masks.items():
            m = arrays[mask]
            used = int(np.flatnonzero(m.any(0))[-1]) + 1 if m.size else 0
            if used < (m.shape[1] * 3 // 4 + 1 if slack else m.shape[1]):
                for name in (mask, *over):
                    arrays[name] = cut(arrays[name], self.ragged[name], used)
        if self.axes:
            lengths = arrays[self.lengths]
            capacity = buffers.capacity_for(max(int(lengths.max(initial=0)), 1), self.limit)
            name, axis = next(iter(self.axes.items()))
            if arrays[name].shape[axis] > 2 * capacity:
                arrays |= buffers.resized({k: arrays[k] for k in self.axes}, self.axes, capacity)
        return State(arrays, self._length(arrays, state.length)).owning()

    def used(self, arrays: dict) -> dict:
        """`arrays` with each appended buffer cut to the slots its longest row uses: what two
        states of the same rows should agree on (their capacities follow how they were fed: one
        call or many steps)."""
        if not self.axes:
            return arrays
        used = int(to_numpy(arrays[self.lengths]).max(initial=0))
        return arrays | {name: to_numpy(arrays[name])[(slice(None),) * axis + (slice(0, used),)]
                         for name, axis in self.axes.items()}

    def _length(self, arrays: dict, otherwise: int) -> int:
        return int(arrays[self.lengths].max(initial=0)) if self.lengths else otherwise
