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
A state may write only while it is the newest over its buffers (`State.writer`); stepping an
older state again (a branch) copies first, so an earlier state is never changed under its
holder. numpy only.
"""

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
    for name, values in new.items():
        buf, axis = buffers[name], axes[name]
        t = values.shape[axis]
        if same is not None:  # every row at one position (plain generation)
            buf[(slice(None),) * axis + (slice(same, same + t),)] = values
            continue
        rows = np.arange(lengths.shape[0])
        for j in range(t):  # rows at different positions (continuous batching)
            index = (rows,) + (slice(None),) * (axis - 1) + (lengths + j,)
            buf[index] = np.take(values, j, axis=axis)
