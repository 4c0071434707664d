"""The requests not yet in the running batch, under one lock: what `submit` adds to, the
starter takes from and hands back begun, and the engine thread admits from; and the walk that
ends the cancelled and timed-out ones."""

import threading
import time
from collections import deque

from seqexport.errors import UsageError
from seqexport.runtime.engine.request import Begun, QueueFull, Request


class Queues:
    """In arrival order: `waiting` (submitted), `held` (the starter is beginning them right
    now), `ready` (begun by the starter: the request and a Begun, a (state, pending) or the
    error raised). Every change is made under `cond`, which also wakes the engine and starter."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.cond = threading.Condition()
        self.waiting: deque[Request] = deque()
        self.ready: deque[tuple[Request, Begun | tuple | Exception]] = deque()
        self.held: list[Request] = []
        self.stopping = False
        self.begun = 0  # requests the starter thread has handed over begun (across restarts)
        # `expire` walks every request only when one was cancelled (the flag, which a
        # request's cancel() raises) or the earliest deadline has passed: a walk is O(queue)
        # (6 us at 16 waiting, 48 at 256; the check 0.3)
        self.cancel_flag = [False]
        self._next_deadline = float("inf")

    def __len__(self) -> int:
        return len(self.waiting) + len(self.ready) + len(self.held)

    def add(self, req: Request) -> None:
        with self.cond:
            if self.stopping:  # nothing would run it, nor end it: a caller waiting on it would wait forever
                raise UsageError("the engine is closed: start() it again before submitting")
            if len(self) >= self.max_queue:
                raise QueueFull(f"{len(self.waiting)} requests are waiting (max_queue {self.max_queue})")
            self.waiting.append(req)
            if req.deadline is not None:
                self._next_deadline = min(self._next_deadline, req.deadline)
            self.cond.notify()

    def pop_ready(self) -> tuple[Request, object] | None:
        with self.cond:
            return self.ready.popleft() if self.ready else None

    def pop_waiting(self) -> Request | None:
        with self.cond:
            return self.waiting.popleft() if self.waiting else None

    def drain(self) -> list[Request]:
        """Every waiting and ready request, the queues left empty (the engine is closing)."""
        with self.cond:
            reqs = [*self.waiting, *(r for r, _ in self.ready)]
            self.waiting.clear()
            self.ready.clear()
        return reqs

    def expire(self, running: list[Request]) -> None:
        """End the cancelled and timed-out requests, running or queued (the starter's held ones
        once it hands them over); the queues drop them."""
        now = time.monotonic()
        if not self.cancel_flag[0] and now <= self._next_deadline:
            return  # no request was cancelled and none is past its deadline
        self.cancel_flag[0] = False  # (before the walk: a cancel during it is seen next round)
        with self.cond:
            waiting = [*self.waiting, *(r for r, _ in self.ready)]
            held = list(self.held)
            every = [*running, *waiting]
            # the next walk's deadline: add() lowers it for requests that come later
            self._next_deadline = min((r.deadline for r in every + held if r.deadline is not None and
                                       not r._cancelled and r.deadline >= now), default=float("inf"))
        if any(r._cancelled or (r.deadline is not None and now > r.deadline) for r in held):
            self.cancel_flag[0] = True  # look again once the starter hands them over
        for req in every:
            if req._cancelled:
                req.finish("cancelled")
            elif req.deadline is not None and now > req.deadline:
                req.finish("timeout")
        if any(r.finished for r in waiting):
            with self.cond:
                self.waiting = deque(r for r in self.waiting if not r.finished)
                self.ready = deque((r, x) for r, x in self.ready if not r.finished)
