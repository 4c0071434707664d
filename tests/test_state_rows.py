"""`spare_rows`: which arrays are the leading rows of a buffer a join may write the newcomers'
rows into in place. Any other view must be refused (writing past it would overwrite rows that
are not the batch's spare ones)."""

import numpy as np

from seqexport.state.rows import spare_rows


def test_only_views_of_a_buffers_leading_rows_have_spare_rows():
    buf = np.zeros((8, 3, 4), np.float32)
    assert spare_rows(buf[:5], 8) is buf and spare_rows(buf[:8], 8) is buf
    assert spare_rows(buf[:5], 9) is None  # the buffer has too few rows
    assert spare_rows(buf[1:6], 8) is None  # rows from the second: row 0 is not the batch's
    assert spare_rows(buf[6:8], 8) is None  # rows well past the first
    assert spare_rows(buf[:5, :2], 8) is None  # not whole rows
    within = buf.reshape(-1)[3 : 3 + 5 * 12].reshape(5, 3, 4)  # whole rows' size, begun inside row 0
    assert within.base is buf and within.flags.c_contiguous and spare_rows(within, 8) is None
    assert spare_rows(buf[:5].view(np.int32), 8) is None  # another dtype over the same memory
    assert spare_rows(np.zeros((5, 3, 4), np.float32), 8) is None  # no buffer under it
