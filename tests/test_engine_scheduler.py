"""The engine's admission policy (`runtime/engine/scheduler.py`), on its own: room under the row
and state caps, which newcomers an empty batch prefills together. Hand-worked cases."""

from seqexport.runtime.engine.request import Request
from seqexport.runtime.engine.scheduler import Limits, by_start, first_prefill, pads_little, room
from seqexport.runtime.generate import SearchOptions


def req(n: int, start_id: int | None = None) -> Request:
    return Request(list(range(1, n + 1)), SearchOptions(start_id=start_id), id=f"r{n}")


def test_rows_cap_counts_those_already_joining():
    limits = Limits(max_rows=4, max_state_bytes=None, continuous_batching=True)
    assert room(limits, rows=2, state_bytes=0, pending=1, running=2)  # 2 + 1 joining + this one = 4
    assert not room(limits, rows=2, state_bytes=0, pending=2, running=2)  # would be 5


def test_rows_that_must_start_together_wait_for_an_empty_batch():
    limits = Limits(max_rows=8, max_state_bytes=None, continuous_batching=False)
    assert not room(limits, rows=1, state_bytes=0, pending=0, running=1)
    assert room(limits, rows=0, state_bytes=0, pending=3, running=0)


def test_state_cap_admits_by_the_average_row():
    limits = Limits(max_rows=16, max_state_bytes=1000, continuous_batching=True)
    # 2 rows hold 400 bytes: 200 a row; one more (no one else joining) makes 600 <= 1000
    assert room(limits, rows=2, state_bytes=400, pending=0, running=2)
    # with 2 already joining this round: 400 + 200 * 3 = 1000, still in; with 3: 1200, out
    assert room(limits, rows=2, state_bytes=400, pending=2, running=2)
    assert not room(limits, rows=2, state_bytes=400, pending=3, running=2)
    # an empty batch has no row to measure by: one newcomer, measured next round
    assert room(limits, rows=0, state_bytes=0, pending=0, running=0)
    assert not room(limits, rows=0, state_bytes=0, pending=1, running=0)


def test_padding_at_most_the_prompts_own_tokens():
    assert pads_little([req(10)], req(10))  # no padding
    assert pads_little([req(10)], req(5))  # 2 rows x 10 = 20 <= 2 x 15
    assert pads_little([req(10)], req(1))  # 2 x 10 = 20 <= 2 x 11
    assert not pads_little([req(10), req(1)], req(1))  # 3 x 10 = 30 > 2 x 12


def test_an_empty_batch_prefills_what_pads_little_or_the_largest_same_length_group():
    a, b, c, d, e = req(10), req(1), req(1), req(9), req(9)
    # [10, 1]: 20 <= 22 in; [10, 1, 1]: 30 > 24 out; [10, 1, 9]: 30 <= 40 in; [10, 1, 9, 9]: 40 <= 58 in
    assert first_prefill([a, b, c, d, e], ragged_prefill=True) == [a, b, d, e]
    assert first_prefill([a, b, c, d, e], ragged_prefill=False) in ([b, c], [d, e])  # two of one length
    f, g = req(7, start_id=5), req(7)
    assert first_prefill([f, g], ragged_prefill=False) in ([f], [g])  # another start token: apart


def test_groups_by_start_token_keep_arrival_order():
    a, b, c = req(3, start_id=None), req(4, start_id=9), req(5, start_id=None)
    assert by_start([a, b, c]) == {None: [a, c], 9: [b]}
