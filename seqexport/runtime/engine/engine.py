"""Engine: the request queue, the engine and starter threads, and the round (expire, leave,
admit, decode) that hands requests to the running batch (`batch`) under the admission policy
(`scheduler`). See the package docstring for the scheduling rules."""

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable

from seqexport.errors import InputError, UsageError
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.engine import scheduler
from seqexport.runtime.engine.batch import RunningBatch
from seqexport.runtime.engine.request import Begun, QueueFull, Request
from seqexport.runtime.generate import SearchOptions, as_rows, eos_for


class Engine:
    """Scheduler + batched step loop over one runtime model (knows nothing of HTTP)."""

    def __init__(self, model: RuntimeModel, max_rows: int = 16, max_queue: int = 256,
                 max_state_bytes: int | None = None, max_prompt_tokens: int | None = None,
                 prefill_chunk: int = 64, start_ahead: int | None = None, start_batch: int = 4,
                 on_round: Callable[[], None] | None = None, pin_threads: bool = False):
        start_ahead = max_rows if start_ahead is None else start_ahead
        for name, v, least in (("max_rows", max_rows, 1), ("max_queue", max_queue, 1), ("prefill_chunk", prefill_chunk, 0),
                               ("start_ahead", start_ahead, 0), ("start_batch", start_batch, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise UsageError(f"{name} must be an integer >= {least}, got {v!r}")
        if pin_threads and (why := cannot_pin()):
            raise UsageError(f"pin_threads: {why}")
        self.model = model
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.max_state_bytes = max_state_bytes
        self.max_prompt_tokens = max_prompt_tokens
        self.prefill_chunk = prefill_chunk
        self.start_ahead = start_ahead  # requests the starter thread may have begun before they join
        self.start_batch = start_batch  # requests the starter begins in one prefill run (ragged_prefill)
        # called on the engine thread after each round's events (a server hands them on at once)
        self.on_round = on_round
        # the engine thread on the first CPU this process may use, the starter on the others
        # (`start`): see `thread_cpus`
        self.pin_threads = pin_threads
        self._cpus: tuple[set[int] | None, set[int] | None] = (None, None)
        self.batch = RunningBatch(model, max_rows, prefill_chunk)
        self.batch.before_run = self._hand_off  # the batched step lets the GIL go: wake others then
        self._limits = scheduler.Limits(max_rows, max_state_bytes, model.continuous_batching)
        self._waiting: deque[Request] = deque()
        # begun by the starter, in arrival order: (request, a Begun, a (state, pending) or the error raised)
        self._ready: deque[tuple[Request, Begun | tuple | Exception]] = deque()
        self._starting = 0  # requests the starter holds right now
        self._starter: threading.Thread | None = None
        self._cond = threading.Condition()
        # _expire walks every request only when one was cancelled (the flag) or the earliest
        # deadline has passed: a walk is O(queue) (6 us at 16 waiting, 48 at 256; the check 0.3)
        self._cancel_flag = [False]
        self._next_deadline = float("inf")
        self._held: list[Request] = []  # the requests the starter is beginning right now
        # threads to wake at the next hand-off (`_hand_off`): finished requests' `done` events,
        # and whether the starter may have room to begin another
        self._wakes: list[threading.Event] = []
        self._wake_starter = False
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.begun_ahead = 0  # requests the starter thread began

    # --- what callers see ---

    @property
    def queue_length(self) -> int:
        return len(self._waiting) + len(self._ready) + self._starting

    @property
    def active_rows(self) -> int:
        return self.batch.active_rows

    @property
    def state_bytes(self) -> int:
        return self.batch.state_bytes

    @property
    def steps(self) -> int:
        return self.batch.steps  # batched decode steps run

    @property
    def row_steps(self) -> int:
        return self.batch.row_steps  # rows over all decode steps (row_steps / steps: mean rows)

    @property
    def tokens_generated(self) -> int:
        return self.batch.tokens_generated

    @property
    def _state(self) -> State | None:  # the running rows' state (tests look at its buffers)
        return self.batch.state

    @property
    def _staged(self) -> list:
        return self.batch.staged

    def has_work(self) -> bool:
        return bool(self.batch.rows or self.batch.staged or self._waiting or self._ready or self._starting)

    def submit(self, prompt, options: SearchOptions | None = None, *, on_event=None, stop=None,
               timeout: float | None = None, request_id: str | None = None) -> Request:
        """Queue one prompt (token ids). Raises InputError/UsageError for a prompt or options
        the model cannot take, QueueFull when `max_queue` requests already wait."""
        options = options or SearchOptions()
        row = self._check(prompt, options, timeout)
        now = time.monotonic()
        req = Request(row, options, request_id or f"req-{next(self._ids)}", on_event=on_event, stop=stop,
                      deadline=None if timeout is None else now + timeout, submitted=now)
        req._eos = eos_for(self.model, options)
        req._engine_flag = self._cancel_flag
        req._engine_wakes = self._wakes
        with self._cond:
            if self.queue_length >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (max_queue {self.max_queue})")
            self._waiting.append(req)
            if req.deadline is not None:
                self._next_deadline = min(self._next_deadline, req.deadline)
            self._cond.notify()
        return req

    def _check(self, prompt, options: SearchOptions, timeout: float | None) -> list[int]:
        """The prompt as token ids, once it and the options are known to fit the model."""
        if not isinstance(options, SearchOptions):
            raise UsageError(f"options: expected SearchOptions, got {type(options).__name__}")
        if options.num_beams > 1:
            raise UsageError(f"num_beams {options.num_beams}: the engine does greedy or sampled decoding only")
        (row,) = as_rows([prompt])
        if self.max_prompt_tokens is not None and len(row) > self.max_prompt_tokens:
            raise InputError(f"prompt: {len(row)} tokens exceeds the limit of {self.max_prompt_tokens}")
        limit = self.model.max_new_tokens_limit
        if limit is not None and options.max_new_tokens > limit:
            raise InputError(f"max_new_tokens {options.max_new_tokens} exceeds what the model can hold: "
                             f"its decoder has {limit} positions")
        if timeout is not None and not timeout > 0:
            raise UsageError(f"timeout must be > 0 seconds, got {timeout!r}")
        return row

    def cancel(self, req: Request) -> None:
        req.cancel()
        with self._cond:
            self._cond.notify()

    def run_until_done(self) -> None:
        """Step until no request runs or waits (the caller's thread; not with start())."""
        while self.has_work():
            self.step()

    # --- background threads ---

    def start(self) -> "Engine":
        """Run the step loop on a daemon thread until `close()`."""
        if self._thread is None:
            self._stopping = False
            self._cpus = thread_cpus() if self.pin_threads else (None, None)
            self._thread = threading.Thread(target=self._loop, name="seqexport-engine", daemon=True)
            self._thread.start()
            if self.start_ahead and self.model.continuous_batching and self.prefill_chunk:
                self._starter = threading.Thread(target=self._start_loop, name="seqexport-starter", daemon=True)
                self._starter.start()
        return self

    def close(self) -> None:
        """Stop the loop; every unfinished request ends with "cancelled"."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in (self._thread, self._starter):
            if thread is not None:
                thread.join()
        self._thread = self._starter = None
        for req in [*self.batch.requests(), *self._waiting, *(r for r, _ in self._ready)]:
            req.finish("cancelled")
        self._hand_off()
        self.batch.clear()
        self._waiting.clear()
        self._ready.clear()

    def _loop(self) -> None:
        _pin(self._cpus[0])
        while True:
            with self._cond:
                # (a request the starter holds joins once it is ready: nothing to run until then)
                while not self._stopping and not (self.batch.rows or self.batch.staged or self._ready or self._waiting):
                    self._cond.wait()
                if self._stopping:
                    return
            self._round()
            if not self.batch.rows:
                self._hand_off()  # no batched step comes to hand off before

    def _start_loop(self) -> None:
        """The starter: `begin_rows` (a graph: a transformer's encoder) or else `begin` (the
        prompt's prefill and first logits) for waiting requests, at most `start_ahead` ready at
        once; up to `start_batch` of them in one `begin` when the model prefills rows of
        unequal length together (`ragged_prefill`)."""
        _pin(self._cpus[1])
        prefills = not self.model.begin_rows_runs_a_graph
        batch = self.start_batch if prefills and self.model.ragged_prefill else 1
        while True:
            with self._cond:
                while not self._stopping and not (self._waiting and len(self._ready) < self.start_ahead):
                    self._cond.wait()
                if self._stopping:
                    return
                room = min(batch, self.start_ahead - len(self._ready))
                group = [self._waiting.popleft()]
                while len(group) < room and self._waiting and scheduler.pads_little(group, self._waiting[0]):
                    group.append(self._waiting.popleft())
                n = len(group)
                self._starting += n
                self._held = group
            results = self._begin_ahead([r for r in group if not r.finished], prefills)
            with self._cond:
                self._starting -= n
                self._held = []
                self._ready.extend(results)
                self.begun_ahead += len(results)
                self._cond.notify_all()

    def _begin_ahead(self, group: list[Request], prefills: bool) -> list[tuple[Request, object]]:
        """(request, a Begun, a (state, pending) or the error raised) for each of `group`, in
        order; a prompt that fails fails alone (the group is begun again one by one)."""
        if len(group) > 1:
            try:
                logits, state = self.model.begin([r.prompt for r in group])  # (k, v); one start id: recurrent
                return [(r, Begun(logits[i : i + 1], self.model.take(state, [i]))) for i, r in enumerate(group)]
            except Exception:  # noqa: BLE001 - found below, request by request
                pass
        out = []
        for req in group:
            try:
                if prefills:
                    out.append((req, Begun(*self.model.begin([req.prompt], req.options.start_id))))
                else:
                    out.append((req, self.model.begin_rows([req.prompt], req.options.start_id)))
            except Exception as e:  # this prompt fails alone: the engine thread fails it with this
                out.append((req, e))
        return out

    # --- one scheduling round ---

    def step(self) -> None:
        """Leave, admit, decode (see the package docstring); then every request that ended has
        its `done` set. (The engine thread's loop sets them at the next hand-off instead: just
        before the next batched step, which lets the GIL go, so the woken clients' Python runs
        beside that step rather than against this thread's joins, leaves and picks.)"""
        self._round()
        self._hand_off()

    def _hand_off(self) -> None:
        """Wake the threads the last round let go on: clients waiting on requests that ended,
        the starter waiting for room to begin another."""
        wakes = self._wakes
        while wakes:
            wakes.pop(0).set()
        if self._wake_starter:
            self._wake_starter = False
            with self._cond:
                self._cond.notify_all()

    def _round(self) -> None:
        self._expire()
        self.batch.leave()
        try:
            self._admit()
            self.batch.prefill_staged()
            self.batch.decode()
        except Exception as e:  # a batched run failed: its rows cannot go on, the engine can
            self.batch.fail_all(e)
        self.batch.leave()
        if self.on_round is not None:
            self.on_round()

    def _expire(self) -> None:
        now = time.monotonic()
        if not self._cancel_flag[0] and now <= self._next_deadline:
            return  # no request was cancelled and none is past its deadline
        self._cancel_flag[0] = False  # (before the walk: a cancel during it is seen next round)
        with self._cond:
            waiting = [*self._waiting, *(r for r, _ in self._ready)]
            held = list(self._held)  # the starter's: ended once they are ready
            every = [*self.batch.requests(), *waiting]
            # the next walk's deadline: submit() lowers it for requests that come later
            self._next_deadline = min((r.deadline for r in every + held if r.deadline is not None and
                                       not r._cancelled and r.deadline >= now), default=float("inf"))
        if any(r._cancelled or (r.deadline is not None and now > r.deadline) for r in held):
            self._cancel_flag[0] = True  # look again once the starter hands them over
        for req in every:
            if req._cancelled:
                req.finish("cancelled")
            elif req.deadline is not None and now > req.deadline:
                req.finish("timeout")
        if any(r.finished for r in waiting):
            with self._cond:
                self._waiting = deque(r for r in self._waiting if not r.finished)
                self._ready = deque((r, x) for r, x in self._ready if not r.finished)

    def _room(self, pending: int, running: int) -> bool:
        # (the state's bytes walk every array: measured only under a cap, it was a sixth of a round)
        state_bytes = self.batch.state_bytes if self._limits.max_state_bytes is not None else 0
        return scheduler.room(self._limits, self.batch.active_rows, state_bytes, pending, running)

    def _admit(self) -> None:
        """Requests the starter has begun join first, in arrival order; then, room left,
        waiting requests are begun here (with a starter, only by an empty batch)."""
        running = self.batch.active_rows  # rows that were there before this round
        taken: list[Request] = []  # out of the queues this round: failed with the batch if it fails
        try:
            ready = self._take_ready(running)
            taken += [r for r, _ in ready]
            # their states joined in one go (one pass over the batch's arrays); a begun request
            # is running once picked, one still to feed once its state has joined (a model's
            # ready results are all of one kind: the rows keep the states' order)
            joining, joiners = [], []
            for req, result in ready:
                if isinstance(result, Exception):
                    req.fail(result)
                elif isinstance(result, Begun):
                    joining += self.batch.started([req], result.logits, result.state)
                else:
                    reqs, states = self.batch.entering([req], *result)
                    joiners += reqs
                    joining += states
            self.batch.join(joining)
            self.batch.rows += joiners
            newcomers = self._take_waiting(len(ready), running)
            taken += newcomers
            if newcomers:
                self._begin_newcomers(newcomers, running)
        except Exception as e:  # e.g. a join's allocation: step() fails the rows, these may not be among them
            for req in taken:
                if not req.finished:
                    req.fail(e)
            raise

    def _take_ready(self, running: int) -> list[tuple[Request, object]]:
        ready = []
        while self._ready and self._room(len(ready), running):  # (looked at without the lock: only this thread takes)
            with self._cond:
                if not self._ready:
                    break
                ready.append(self._ready.popleft())
                self._wake_starter = True  # room for the starter to begin another (at the hand-off)
        return ready

    def _take_waiting(self, joined: int, running: int) -> list[Request]:
        newcomers: list[Request] = []
        if self._starter is not None and (running or joined):
            return newcomers  # with a starter, only an empty batch takes a newcomer itself (at once)
        while self._waiting and self._room(len(newcomers) + joined, running):
            with self._cond:
                if not self._waiting:
                    break
                newcomers.append(self._waiting.popleft())
        return newcomers

    def _begin_newcomers(self, newcomers: list[Request], running: int) -> None:
        batch = self.batch
        if not self.model.continuous_batching or not self.prefill_chunk:  # prefilled at admission
            # (rows that must start together come only to an empty batch: see scheduler.room)
            batch.join(s for start_id, group in scheduler.by_start(newcomers).items()
                       for s in batch.begin(group, start_id))
            return
        if not running:  # no one to stall: prefilled at once, prompts of unequal length together
            first = scheduler.first_prefill(newcomers, self.model.ragged_prefill)
            batch.join(batch.begin(first, first[0].options.start_id))
            newcomers = [r for r in newcomers if all(r is not f for f in first)]
        for start_id, group in scheduler.by_start(newcomers).items():
            batch.begin_rows(group, start_id)


def cannot_pin() -> str | None:
    """Why `pin_threads` cannot be had here (None: it can): it needs Linux's thread affinity
    and two CPUs this process may use, one for the engine thread and one for the starter."""
    if not hasattr(os, "sched_setaffinity"):
        return "this platform sets no thread affinity (Linux only)"
    cpus = len(os.sched_getaffinity(0))
    return None if cpus >= 2 else f"needs two CPUs this process may use, it has {cpus}"


def thread_cpus() -> tuple[set[int], set[int]]:
    """(the engine thread's CPUs, the starter's) for `pin_threads`: the first CPU this process
    may use, and the others (the engine refused `pin_threads` where `cannot_pin` says why).

    Why: the engine thread wakes the starter, and Linux tends to run a woken thread on its
    waker's CPU, where the starter's prefill (a transformer's encoder, 0.37 ms) then holds up
    the batched step. The bundled transformer at 16 clients, 2 cores, alternating fresh
    processes (2026-12-03, 15 rounds each): 16 clients ÷ one at a time median 4.08x unpinned
    (3.04-5.55), 4.39x pinned (3.51-6.69); the starter and every other thread kept off the
    engine's CPU did worse (3.74x). One engine a machine only: two engines (two replicas)
    would both take the first CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[0]}, set(cpus[1:])


def _pin(cpus: set[int] | None) -> None:
    """The calling thread onto `cpus` (Linux: pid 0 is the calling thread), if any."""
    if cpus:
        os.sched_setaffinity(0, cpus)
