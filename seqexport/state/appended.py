"""Appended state: a preallocated cache buffer written in place, never copied whole per step.

A graph that declares `appends` (see `seqexport.specs.GraphSpec`) takes each appended state
as a buffer (b, ..., past_len, ...) whose row r holds `lengths[r]` valid slots along the
past_len axis, and returns only the new positions (b, ..., t, ...). After a run the new
positions are written into the buffer at slots lengths[r] .. lengths[r] + t - 1 and the
lengths advance by t. The step then reads the cache once and copies none of it (a graph that
concatenates copies the whole cache every step). Rows at different lengths share one call:
what continuous batching needs.

Buffers grow by about a sixteenth when full (amortised: a few slots copied per step; a step
reads every slot, masked, so spare slots cost reading time: an eighth spare at 4096 tokens
was about 0.4 ms of the base decoder's 15) and are shared between a state and the next one.
A state may write only while it is the newest over its buffers (`State.writer`), or once no
newer state over them is still held (the previous continuation was let go: "regenerate" writes
in place); stepping an older state again while a newer one is held (a branch) copies first, so
an earlier state is never changed under its holder. The copies are made in buffers a `CopyPool` keeps for the next branch once no state
holds them: what a branch paid for was fresh memory, not copying (see `CopyPool`). numpy only.
"""

import math
import sys
import threading

import numpy as np

GRAIN = 16  # capacities are multiples of this many slots (the bundled date models: +15% tokens/s at batch 50 over 64)


def capacity_for(need: int, limit: int | None = None) -> int:
    """Slots to allocate for `need` valid ones: a sixteenth spare, rounded up, at most `limit`
    (a positional table) though never below `need`."""
    cap = -(-(need + need // 16) // GRAIN) * GRAIN
    return max(need, min(cap, limit)) if limit else cap


def axis_of(dims) -> int:
    return list(dims).index("past_len")


def resized(buffers: dict[str, np.ndarray], axes: dict[str, int], capacity: int) -> dict[str, np.ndarray]:
    """New zeroed buffers of `capacity` slots holding the first min(old, capacity) slots of the old."""
    out = {}
    for name, buf in buffers.items():
        axis = axes[name]
        shape = list(buf.shape)
        keep = min(shape[axis], capacity)
        shape[axis] = capacity
        new = np.zeros(shape, buf.dtype)
        index = (slice(None),) * axis + (slice(0, keep),)
        new[index] = buf[index]
        out[name] = new
    return out


def write_new(buffers: dict[str, np.ndarray], axes: dict[str, int], new: dict[str, np.ndarray],
              lengths: np.ndarray, same: int | None = None) -> None:
    """Write each buffer's new positions (b, ..., t, ...) at slots lengths[r] .. + t - 1, in place.
    `same`: the one length every row has, when the caller knows it (one slice per buffer)."""
    slots: dict[tuple, np.ndarray] = {}  # (b, lead, past_len, t) -> `at` below, one per buffer shape
    for name, values in new.items():
        buf, axis = buffers[name], axes[name]
        t = values.shape[axis]
        if same is not None:  # every row at one position (plain generation)
            buf[(slice(None),) * axis + (slice(same, same + t),)] = values
            continue
        # rows at different positions (continuous batching): the buffer seen as rows of its
        # trailing dims, one per (row r, leading index k, slot), new position j of (r, k) going
        # to row (r·lead + k)·past_len + lengths[r] + j. (One index for every buffer of a shape,
        # one 1-d fancy write per buffer: 12 us a step for the bundled transformer's 4 buffers at
        # 14 rows, against 15 for an arange and a (rows, ..., lengths + j) write per buffer.)
        b, lead, cap, tail = buf.shape[0], math.prod(buf.shape[1:axis]), buf.shape[axis], math.prod(buf.shape[axis + 1:])
        at = slots.get((b, lead, cap, t))
        if at is None:
            first = np.arange(b * lead) * cap + lengths.repeat(lead)  # (b·lead,)
            at = slots[(b, lead, cap, t)] = (first[:, None] + np.arange(t)).ravel()  # (b·lead·t,)
        whole = buf if buf.flags.c_contiguous else np.ascontiguousarray(buf)  # (reshaped as a view)
        whole.reshape(b * lead * cap, tail)[at] = values.reshape(b * lead * t, tail)
        if whole is not buf:  # a strided buffer: written through a copy
            buf[...] = whole


class CopyPool:
    """Buffers that branch copies are written into, taken again by a later branch once no
    state or view holds them (every view of a buffer refers to it, so a buffer only the pool
    refers to is free).

    Why: a branch of the base transformer at 4096 tokens copies 12 buffers, 107 MB. Copied
    into fresh memory (numpy's `copy`) that took 45-135 ms here (600-1300 ms the first time the
    process touched that much new memory: page faults, in a VM), against 10-18 ms into memory
    already held (`np.copyto`), next to a 12 ms step. The pool holds at most `keep` branches'
    worth of buffers (a free one until the next branch takes or drops it); copies past that are
    plain fresh arrays, freed as usual.
    """

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._held: list[np.ndarray] = []
        # one loaded model serves concurrent calls from several threads: two branches must not
        # both take one free buffer
        self._lock = threading.Lock()

    def _unused(self, i: int) -> bool:
        return sys.getrefcount(self._held[i]) == 2  # the pool's list and this call's argument

    def copies(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """C-contiguous copies of `arrays`, in free held buffers of the same shape and dtype
        where there are some. Free buffers this branch did not take are let go."""
        with self._lock:
            return self._copies(arrays)

    def _copies(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        free = [i for i in range(len(self._held)) if self._unused(i)]
        room = self.keep * sum(a.nbytes for a in arrays.values()) \
            - sum(a.nbytes for i, a in enumerate(self._held) if i not in free)
        out = {}
        for name, src in arrays.items():
            i = next((i for i in free if self._held[i].shape == src.shape and self._held[i].dtype == src.dtype), None)
            if i is not None:
                free.remove(i)
                dst = self._held[i]
            else:
                dst = np.empty(src.shape, src.dtype)
                if room >= dst.nbytes:
                    self._held.append(dst)
            room -= dst.nbytes
            np.copyto(dst, src)
            out[name] = dst
        gone = set(free)
        self._held = [a for i, a in enumerate(self._held) if i not in gone]
        return out
