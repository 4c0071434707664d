"""Rows of (b, ...) state arrays moved and copied in place: what the engine does when requests
join and leave a running batch, for every kind (the batch axis leads in every state input)."""

import numpy as np

from seqexport.errors import InputError


def swap_remove_order(n: int, leaving) -> list[int]:
    """The rows that stay out of n, in their new order: each leaver's place below the new
    size is taken by a survivor from the tail, so at most one row moves per leaver."""
    gone = set(leaving)
    size = n - len(gone)
    tail = [i for i in range(size, n) if i not in gone]
    return [tail.pop() if i in gone else i for i in range(size)]


def row_indices(rows, n: int) -> np.ndarray:
    """`rows` as indices into a batch of n rows: a 1-d list of integers in [0, n). (A negative
    one would wrap round to a row from the end, silently; one past the batch would be a raw
    IndexError.) Repeats are fine: a beam search takes one row several times."""
    a = np.asarray(rows)
    if a.ndim != 1 or (a.size and (a.dtype.kind not in "iu")):
        raise InputError(f"rows: expected a list of row indices (integers), got {rows!r}")
    bad = a[(a < 0) | (a >= n)]
    if bad.size:
        raise InputError(f"rows: {int(bad[0])} is not a row of this batch of {n}; expected indices in [0, {n})")
    return a.astype(np.intp)


def retain_rows(arrays: dict, rows: list[int]) -> dict | None:
    """Row i of each (b, ...) array becomes old row rows[i], moved in place: the first
    len(rows) rows as views (contiguous: the batch axis leads). None when that cannot be done
    in place (a row taken from below the new size elsewhere, or arrays that are not numpy)."""
    if any(type(a) is not np.ndarray for a in arrays.values()):
        return None
    if arrays:
        rows = row_indices(rows, len(next(iter(arrays.values())))).tolist()
    size = len(rows)
    moves = [(i, r) for i, r in enumerate(rows) if r != i]
    if any(r < size for _, r in moves):
        return None  # a source inside the kept prefix could be overwritten before it is read
    for a in arrays.values():
        for i, r in moves:
            move_row(a, i, r)
    return {k: a[:size] for k, a in arrays.items()}


def copy_rows(a: np.ndarray, at: int, src: np.ndarray) -> None:
    """a[at : at + len(src)] = src, one memcpy holding the GIL (see move_row); a and src
    C-contiguous, of one dtype."""
    if not (a.flags.c_contiguous and src.flags.c_contiguous and a.dtype == src.dtype and a.shape[1:] == src.shape[1:]):
        a[at : at + len(src)] = src  # numpy checks (and raises on) what does not fit
    elif src.size:
        start = at * a[0].nbytes
        memoryview(a).cast("B")[start : start + src.nbytes] = memoryview(src).cast("B")


def move_row(a: np.ndarray, i: int, r: int) -> None:
    """a[i] = a[r], holding the GIL. numpy lets the GIL go while it copies more than a few
    hundred elements, and the engine thread then waits for whichever thread took it (a client,
    the starter) to let it go again: a leaver's row moves took 0.6 ms of wall time for 0.1 ms
    of copying (transformer-dates, 16 clients). A memoryview copy is one memcpy under the GIL.
    An array that is not C-contiguous is copied by numpy."""
    if a.flags.c_contiguous and a.size:
        n = a[0].nbytes
        view = memoryview(a).cast("B")
        view[i * n : (i + 1) * n] = view[r * n : (r + 1) * n]
    else:
        a[i] = a[r]


def spare_rows(a: np.ndarray, rows: int) -> np.ndarray | None:
    """The buffer `a` is the leading rows of, when it has at least `rows` rows (views of a
    C-contiguous buffer's first rows are contiguous: a graph reads them as they are), else None."""
    buf = a.base
    if type(buf) is not np.ndarray or buf.dtype != a.dtype or buf.shape[1:] != a.shape[1:] \
            or buf.shape[0] < rows or not (buf.flags.c_contiguous and a.flags.c_contiguous):
        return None
    # `a` starts at the buffer's start: it overlaps row 0 and not row len(a) (whole rows that
    # began inside row 0 would reach into it). Bounds compared: a third of the time of two
    # `ctypes.data`, and this runs for every array at every join.
    n = a.shape[0]
    return buf if np.may_share_memory(a, buf[:1]) and not np.may_share_memory(a, buf[n : n + 1]) else None


def checked_rows(rows) -> int | None:
    """`rows` (the most rows a batch may come to hold) when it is None or an integer >= 1."""
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 1):
        raise InputError(f"rows: expected an integer >= 1 (the most rows the batch may hold) or None, got {rows!r}")
    return rows


def extend_rows(arrays: dict[str, np.ndarray], newcomers: list[dict[str, np.ndarray]],
                ragged: dict[str, int], rows: int | None = None) -> dict[str, np.ndarray]:
    """Each (b, ...) array with the newcomers' rows after its own, zero-padded along its
    `ragged` axis (source columns, cache slots) to the batch's size there. An array that is the
    leading rows of a larger buffer (`spare_rows`) that fits gets them written in place; any
    other is reallocated with room for `rows` rows (the most the batch may hold), else for as
    many rows again, so that the next joins write in place."""
    n = next(iter(arrays.values())).shape[0]
    total = n + sum(next(iter(a.values())).shape[0] for a in newcomers)
    room = max(total, checked_rows(rows)) if rows is not None else 2 * total
    out = {}
    for name, a in arrays.items():
        axis = ragged.get(name)
        parts = [a] + [new[name] for new in newcomers]
        size = max(p.shape[axis] for p in parts) if axis is not None else None
        buf = spare_rows(a, total)
        if buf is None or (axis is not None and buf.shape[axis] < size):
            shape = list(a.shape)
            shape[0] = room
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


def cut(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """`a`'s first `size` entries along `axis`, copied into the leading rows of a new buffer with
    as many rows as `a`'s own (`spare_rows`): rows that join later are still written in place."""
    buf = spare_rows(a, len(a))
    out = np.empty((len(a if buf is None else buf), *a.shape[1:axis], size, *a.shape[axis + 1:]), a.dtype)
    out[: len(a)] = a[(slice(None),) * axis + (slice(0, size),)]
    return out[: len(a)]


def pad_to(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """`a` zero-padded along `axis` to `size`."""
    if a.shape[axis] == size:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return np.pad(a, widths)
