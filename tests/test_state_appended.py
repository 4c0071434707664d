"""`write_new` judged against a plain loop over rows: rows at different positions write each
buffer's new positions at their own lengths, whatever the buffer's shape, its past_len axis,
the number of new positions, or whether the buffer is strided."""

import numpy as np
import pytest

from seqexport.state.appended import write_new


def reference(buf: np.ndarray, axis: int, values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """buf with row r's new positions (values' row r, t along `axis`) at slots lengths[r] ..."""
    out = buf.copy()
    t = values.shape[axis]
    for r, length in enumerate(lengths):
        slots = (slice(None),) * (axis - 1) + (slice(length, length + t),)
        out[r][slots] = values[r]
    return out


@pytest.mark.parametrize("t", [1, 3])
def test_buffers_of_unlike_shapes_get_their_rows_new_positions_at_each_rows_length(t):
    rng = np.random.default_rng(0)
    lengths = np.array([0, 5, 2, 7])  # (b,): rows at different positions
    shapes = {"k": ((4, 2, 12, 3), 2), "v": ((4, 2, 12, 3), 2),  # (b, h, past_len, d): one index for both
              "wide": ((4, 3, 16, 3), 2),  # another head count and capacity in the same call
              "flat": ((4, 10, 5), 1), "last": ((4, 2, 11), 2)}  # past_len first after b; last
    buffers = {name: rng.standard_normal(shape).astype(np.float32) for name, (shape, _) in shapes.items()}
    axes = {name: axis for name, (_, axis) in shapes.items()}
    new = {}
    for name, (shape, axis) in shapes.items():
        new_shape = list(shape)
        new_shape[axis] = t
        new[name] = rng.standard_normal(new_shape).astype(np.float32)
    expected = {name: reference(buffers[name], axes[name], new[name], lengths) for name in buffers}
    write_new(buffers, axes, new, lengths)
    for name in buffers:
        np.testing.assert_array_equal(buffers[name], expected[name], err_msg=name)


def test_a_strided_buffer_is_written_in_place():
    rng = np.random.default_rng(1)
    whole = rng.standard_normal((3, 4, 9, 2)).astype(np.float32)
    buf = whole[:, ::2]  # (b, h, past_len, d), every other head: not C-contiguous
    assert not buf.flags.c_contiguous
    lengths = np.array([4, 0, 6])
    values = rng.standard_normal((3, 2, 2, 2)).astype(np.float32)  # t = 2
    expected = reference(buf, 2, values, lengths)
    untouched = whole[:, 1::2].copy()
    write_new({"k": buf}, {"k": 2}, {"k": values}, lengths)
    np.testing.assert_array_equal(whole[:, ::2], expected)
    np.testing.assert_array_equal(whole[:, 1::2], untouched)  # the heads between are not written
