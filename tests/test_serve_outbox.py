"""The server's outbox: the engine thread's events reach each request's asyncio queue once a
round, in order, through one wake-up of the event loop; a closed loop frees the rows. A real
event loop on its own thread and real engine requests (no server needed)."""

import asyncio
import threading
from types import SimpleNamespace

import pytest

from seqexport.runtime.engine import Request
from seqexport.runtime.generate import SearchOptions
from seqexport.serve.app import Outbox


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def drained(loop, queues) -> list[list]:
    async def take():
        return [[q.get_nowait() for _ in range(q.qsize())] for q in queues]
    return asyncio.run_coroutine_threadsafe(take(), loop).result(5)


def test_a_rounds_events_reach_their_queues_in_order_with_one_wakeup(loop):
    listeners = [SimpleNamespace(loop=loop, queue=asyncio.Queue()) for _ in range(3)]
    reqs = [Request([1], SearchOptions(), f"r{i}") for i in range(3)]
    outbox = Outbox()
    wakeups = []
    real = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda f, *a: (wakeups.append(f), real(f, *a))  # counts the loop's wake-ups
    try:
        for rnd in range(4):
            for i, (listener, req) in enumerate(zip(listeners, reqs)):
                outbox.put(listener, req, (10 * rnd + i, f"piece{rnd}"))
            if rnd == 0:
                assert drained(loop, [listeners[0].queue]) == [[]]  # nothing before the round's end
            outbox.flush()
        outbox.flush()  # an empty round wakes no one
    finally:
        del loop.call_soon_threadsafe
    assert sum(f.__name__ == "_deliver" for f in wakeups) == 4
    got = drained(loop, [listener.queue for listener in listeners])
    assert got == [[(10 * rnd + i, f"piece{rnd}") for rnd in range(4)] for i in range(3)]


def test_a_closed_loop_cancels_the_requests_it_cannot_reach():
    closed = asyncio.new_event_loop()
    closed.close()
    listener = SimpleNamespace(loop=closed, queue=None)
    req = Request([1], SearchOptions(), "r")
    outbox = Outbox()
    outbox.put(listener, req, (5, "x"))
    outbox.flush()
    assert req._cancelled
