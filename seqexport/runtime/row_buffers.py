"""A running batch's recurrent state that the engine owns, stepped without allocating.

Two sets of (capacity, ...) arrays per state input. Each step ONNX Runtime reads the batch's
rows from one set and writes the new state straight into the other's (IO binding to
preallocated host memory; a plain run allocates every output afresh: on the bundled Mamba at
batch 16, 1.2 MB a step, ~0.2-0.5 ms of its 1.3-2 ms), then the sets swap. A newcomer's rows
are written into the spare rows below the capacity in place: O(newcomer), where joining
states copies the whole batch (0.6 ms a join on the bundled Mamba at 16 clients).

Only the engine steps such a state (`BufferedRows.advance`): it consumes each state it
steps, so the set a step overwrites is never read again. `step()` never uses these buffers:
a caller may keep an old state and step it again (a branch), which double buffering would
have overwritten under it. A state whose set has been written since it was made (`intact`)
is refused, never read. CPU provider only (with CUDA the state stays on the device).
"""

import numpy as np
import onnxruntime as ort

from seqexport.specs import INPUT_IDS, LOGITS
from seqexport.state.rows import copy_rows
from seqexport.state.state import State


class RowBuffers:
    """The two sets, the token ids and logits buffers, and one IO binding per (set, batch)."""

    def __init__(self, session: ort.InferenceSession, pairs: list[tuple[str, str]], logits: tuple,
                 like: dict[str, np.ndarray], capacity: int):
        # pairs: (output, state input) of the step graph; logits: the row shape and dtype of its
        # logits output; like: arrays of each state input's row shape and dtype
        self.session = session
        self.pairs = pairs
        self.capacity = capacity
        self.sets = [{inp: np.zeros((capacity, *like[inp].shape[1:]), like[inp].dtype) for _, inp in pairs}
                     for _ in range(2)]
        self.current = 0  # the set holding the batch's state now
        self.written = [0, 0]  # how many times each set has been written (`intact`)
        self.ids = np.zeros((capacity, 1), np.int64)  # (cap, 1)
        self.logits = np.zeros((capacity, *logits[0]), logits[1])  # (cap, 1, v)
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._views: dict | None = None  # the arrays of the state `view` gave last

    def holds(self, state: State) -> bool:
        """Whether `state` is the newest view of the current set's first rows (what `advance`
        and `extend` may write around): the engine's running batch."""
        return state.rows is self and state.arrays is self._views

    def intact(self, state: State) -> bool:
        """Whether the rows of `state`, a view of these buffers, still hold what they held when
        it was made (False: a later step, load or move wrote its set)."""
        mark = state.rows_mark
        return mark is not None and self.written[mark[0]] == mark[1]

    def moving(self) -> None:
        """The current set's rows are about to move in place: views made before are stale."""
        self.written[self.current] += 1

    def view(self, rows: int, length: int) -> State:
        self._views = {k: a[:rows] for k, a in self.sets[self.current].items()}
        return State(self._views, length, rows=self, rows_mark=(self.current, self.written[self.current]))

    def load(self, state: State) -> State:
        """`state`'s rows copied into the current set (a batch that just formed)."""
        self.moving()
        for k, a in self.sets[self.current].items():
            a[: state.batch_size] = state.arrays[k]
        return self.view(state.batch_size, state.length)

    def append(self, state: State, newcomers: list[State]) -> State | None:
        """The newcomers' rows written after `state`'s, in place; None when they do not fit."""
        rows = state.batch_size
        if rows + sum(s.batch_size for s in newcomers) > self.capacity:
            return None
        for s in newcomers:
            for k, a in self.sets[self.current].items():
                copy_rows(a, rows, s.arrays[k])  # (a non-contiguous array goes through numpy)
            rows += s.batch_size
        return self.view(rows, max([state.length, *(s.length for s in newcomers)]))

    def run(self, tokens: np.ndarray, rows: int, length: int) -> tuple[np.ndarray, State]:
        """One step of `rows` rows on tokens (rows,): logits (rows, 1, v), valid until the next
        run, and the state in the other set."""
        self.ids[:rows, 0] = tokens
        binding = self._bindings.get((self.current, rows))
        if binding is None:
            binding = self._bindings[(self.current, rows)] = self._bind(rows)
        self.written[self.current ^ 1] += 1
        self.session._sess.run_with_iobinding(binding._iobinding, None)
        self.current ^= 1
        return self.logits[:rows], self.view(rows, length)

    def _bind(self, rows: int) -> ort.IOBinding:
        binding = self.session.io_binding()
        src, dst = self.sets[self.current], self.sets[self.current ^ 1]
        binding.bind_input(INPUT_IDS, *_memory(self.ids[:rows]))
        for out, inp in self.pairs:
            binding.bind_input(inp, *_memory(src[inp][:rows]))
            binding.bind_output(out, *_memory(dst[inp][:rows]))
        binding.bind_output(LOGITS, *_memory(self.logits[:rows]))
        return binding


def _memory(a: np.ndarray) -> tuple:
    """IO binding's description of host memory we own (the buffers outlive every binding)."""
    return "cpu", 0, a.dtype.type, list(a.shape), a.ctypes.data
