"""A model's state between steps: graph input name -> array, the tokens consumed so far, and
the zeros a fresh sequence starts from."""

import functools
import math
import os
import weakref
from dataclasses import dataclass, field

import numpy as np

from seqexport.errors import InputError
from seqexport.specs import GraphSpec
from seqexport.state.arrays import NP_DTYPES, shape_and_dtype, to_numpy
from seqexport.state.rows import row_indices


@dataclass
class State:
    """What the next step feeds: graph input name -> array, plus tokens consumed so far.

    On CPU the arrays are numpy arrays. With IO binding (the default on CUDA) the
    cache stays on the device as onnxruntime OrtValues between steps; `numpy()`
    gives a host copy.
    """

    arrays: dict[str, np.ndarray]
    length: int = 0
    # Appended state (seqexport.state.appended): the list shared by every state over the same
    # buffers: [a weak reference to the newest, the only one that may write into them in place;
    # weak references to every state over them] (weak: a state that named itself would live,
    # buffers and all, until the cyclic gc ran; a dropped state's buffers are free at once).
    writer: list | None = field(default=None, repr=False, compare=False)
    # The engine's running batch of a recurrent model (seqexport.runtime.row_buffers): the
    # buffers these arrays are the first rows of.
    rows: object = field(default=None, repr=False, compare=False)
    # with `rows`: (the set of buffers these arrays lie in, how many times it had been written)
    rows_mark: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def batch_size(self) -> int:
        return shape_and_dtype("state", next(iter(self.arrays.values())))[0][0]

    @property
    def nbytes(self) -> int:
        total = 0
        for k, v in self.arrays.items():
            shape, dtype = shape_and_dtype(k, v)
            total += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return total

    def numpy(self) -> "State":
        return State({k: to_numpy(v) for k, v in self.arrays.items()}, self.length)

    def select(self, rows) -> "State":
        """The state of the given batch rows (in that order), e.g. to reorder beams."""
        arrays = {k: to_numpy(v) for k, v in self.arrays.items()}
        rows = row_indices(rows, len(next(iter(arrays.values()))) if arrays else 0)
        return State({k: a[rows] for k, a in arrays.items()}, self.length).owning()

    def owning(self) -> "State":
        """This state as the sole writer of its arrays (they are its own copies)."""
        me = weakref.ref(self)
        self.writer = [me, [me]]
        return self

    @staticmethod
    def concat(states: list["State"]) -> "State":
        """One batch from several (e.g. Mamba prompts of different lengths prefilled apart)."""
        states = checked_states(states)
        keys = states[0].arrays.keys()
        return State({k: np.concatenate([to_numpy(s.arrays[k]) for s in states]) for k in keys},
                     max(s.length for s in states)).owning()


def checked_states(states, call: str = "join") -> list[State]:
    """A non-empty list of States (what join takes; extend's batch and newcomers, the batch
    first); anything else is the caller's error."""
    states = list(states) if isinstance(states, list | tuple) else states
    if not isinstance(states, list) or not states:
        raise InputError(f"{call}: expected a non-empty list of states, got {states!r:.80}")
    for n, s in enumerate(states):
        if not isinstance(s, State):
            what = f"states[{n}]" if call != "extend" else "the batch's state" if n == 0 else f"newcomers[{n - 1}]"
            raise InputError(f"{call}: {what} is a {type(s).__name__}, not a State")
    return states


def zero_state(spec: GraphSpec, batch: int, sizes: dict[str, int] | None = None,
               skip: set[str] | frozenset = frozenset()) -> dict[str, np.ndarray]:
    """Zeros for every state input of `spec` (a fresh sequence); `sizes` gives symbolic dims
    other than batch (e.g. past_len 0); inputs named in `skip` are left out."""
    sizes = {"batch": batch, **(sizes or {})}
    shapes = {t.name: (tuple([sizes[d] if isinstance(d, str) else d for d in t.dims]), NP_DTYPES[t.dtype])
              for t in spec.state_inputs if t.name not in skip}
    # (Python ints: no overflow; math.prod, not np.prod(dtype=object): the engine's starter
    # makes one zero state per request, and these lines were 15 of its ~50 us of Python)
    need = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in shapes.values())
    if need > physical_memory():
        raise InputError(f"batch_size {batch}: its state needs {need / 2**30:.3g} GiB; "
                         f"this machine has {physical_memory() / 2**30:.3g} GiB of memory")
    return {name: np.zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}


@functools.cache  # (two system calls; the machine's memory does not change under a process)
def physical_memory() -> int:
    """Bytes of RAM (a bound no state may pass; POSIX, else unbounded)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**62
