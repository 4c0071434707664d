"""Engine: the engine thread, and the round (expire, leave, admit, decode) that hands requests
from the queues (`queues`, filled by `submit` and the `starter` thread) to the running batch
(`batch`) under the admission policy (`scheduler`). See the package docstring for the rules."""

import itertools
import threading
import time
from collections.abc import Callable

from seqexport.errors import UsageError
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.capabilities import StepModel
from seqexport.runtime.engine import scheduler
from seqexport.runtime.engine.batch import RunningBatch
from seqexport.runtime.engine.pinning import cannot_pin, pin, thread_cpus
from seqexport.runtime.engine.queues import Queues
from seqexport.runtime.engine.request import Request, check_hooks, checked_prompt
from seqexport.runtime.engine.starter import Starter
from seqexport.runtime.generate import SearchOptions, checked_options, eos_for, row_seen


class Engine:
    """Scheduler + batched step loop over one runtime model (knows nothing of HTTP)."""

    def __init__(self, model: RuntimeModel, max_rows: int = 16, max_queue: int = 256,
                 max_state_bytes: int | None = None, max_prompt_tokens: int | None = None,
                 prefill_chunk: int = 64, start_ahead: int | None = None, start_batch: int = 4,
                 on_round: Callable[[], None] | None = None, pin_threads: bool = False):
        if not isinstance(model, StepModel):
            raise UsageError(f"model: expected a model from seqexport.runtime.load (or one with its API), "
                             f"got {type(model).__name__}")
        start_ahead = max_rows if start_ahead is None else start_ahead
        for name, v, least in (("max_rows", max_rows, 1), ("max_queue", max_queue, 1), ("prefill_chunk", prefill_chunk, 0),
                               ("start_ahead", start_ahead, 0), ("start_batch", start_batch, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise UsageError(f"{name} must be an integer >= {least}, got {v!r}")
        for name, v in (("max_state_bytes", max_state_bytes), ("max_prompt_tokens", max_prompt_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise UsageError(f"{name} must be an integer >= 1 or None, got {v!r}")
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
        # (`start`): see `pinning.thread_cpus`
        self.pin_threads = pin_threads
        self.batch = RunningBatch(model, max_rows, prefill_chunk)
        self.batch.before_run = self._hand_off  # the batched step lets the GIL go: wake others then
        self._limits = scheduler.Limits(max_rows, max_state_bytes, model.continuous_batching)
        self._queues = Queues(max_queue)
        # threads to wake at the next hand-off (`_hand_off`): finished requests' `done` events,
        # and whether the starter may have room to begin another
        self._wakes: list[threading.Event] = []
        self._wake_starter = False
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._starter: Starter | None = None
        self._closing = threading.Lock()

    # --- what callers see ---

    @property
    def queue_length(self) -> int:
        return len(self._queues)

    @property
    def active_rows(self) -> int:
        return self.batch.active_rows

    @property
    def closed(self) -> bool:
        return self._queues.stopping  # close() was called (and start() not again since)

    @property
    def parked_rows(self) -> int:
        return len(self.batch.parked)  # held requests' rows, given no steps (Request.hold)

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
    def begun_ahead(self) -> int:
        return self._queues.begun  # by the starter thread

    @property
    def _state(self) -> State | None:  # the running rows' state (tests look at its buffers)
        return self.batch.state

    @property
    def _staged(self) -> list:
        return self.batch.staged

    def has_work(self) -> bool:
        """Whether a round has something to run (a held request waits for its resume())."""
        return bool(self.batch.rows or self.batch.staged or self._queues or self.batch.resumable())

    def submit(self, prompt, options: SearchOptions | None = None, *, on_event=None, stop=None,
               timeout: float | None = None, request_id: str | None = None) -> Request:
        """Queue one prompt (token ids). Raises InputError/UsageError for a prompt or options
        the model cannot take, QueueFull when `max_queue` requests already wait."""
        options = checked_options(options, self.model)
        row, budget = checked_prompt(self.model, prompt, options, timeout, self.max_prompt_tokens)
        check_hooks(on_event, stop, request_id)
        now = time.monotonic()
        req = Request(row, options, request_id or f"req-{next(self._ids)}", on_event=on_event, stop=stop,
                      deadline=None if timeout is None else now + timeout, submitted=now)
        req._eos = eos_for(self.model, options)
        req._budget = budget
        req._seen = row_seen(self.model, options, row, req._eos)
        req._engine_flag = self._queues.cancel_flag
        req._engine_wakes = self._wakes
        req._engine_wake = self._wake
        self._queues.add(req)
        return req

    def cancel(self, req: Request) -> None:
        if not isinstance(req, Request):
            raise UsageError(f"cancel: expected a Request (what submit() returned), got {type(req).__name__}")
        if req._engine_flag is not self._queues.cancel_flag:  # it would be cancelled where it runs, not here
            raise UsageError(f"cancel: request {req.id!r} was not submitted to this engine")
        req.cancel()  # (which wakes this engine's thread)

    def _wake(self) -> None:
        """The engine thread, if it waits for work: a parked row was resumed or cancelled.
        (All waiters: the starter waits on the same condition, and one notify may wake it alone.)"""
        with self._queues.cond:
            self._queues.cond.notify_all()

    def run_until_done(self) -> None:
        """Step until no request runs or waits (the caller's thread; not with start())."""
        self._by_hand("run_until_done()")
        while self.has_work():
            self.step()

    # --- background threads ---

    def start(self) -> "Engine":
        """Run the step loop on a daemon thread until `close()`; with `start_ahead`, a starter
        thread begins waiting requests beside it (`starter`)."""
        if self._thread is None:
            self._queues.stopping = False
            engine_cpus, starter_cpus = thread_cpus() if self.pin_threads else (None, None)
            self._thread = threading.Thread(target=self._loop, args=(engine_cpus,), name="seqexport-engine",
                                            daemon=True)
            self._thread.start()
            if self.start_ahead and self.model.continuous_batching and self.prefill_chunk:
                self._starter = Starter(self.model, self._queues, self.start_ahead, self.start_batch, starter_cpus)
                self._starter.start()
        return self

    def close(self) -> None:
        """Stop the loop; every unfinished request ends with "cancelled". Safe from two threads
        at once (a server stopping closes it at its grace's end, then again as it exits)."""
        with self._closing:
            q = self._queues
            with q.cond:
                q.stopping = True
                q.cond.notify_all()
            for thread in (self._thread, self._starter):
                if thread is not None:
                    thread.join()
            self._thread = self._starter = None
            for req in [*self.batch.requests(), *q.drain()]:
                req.finish("cancelled")
            self._hand_off()
            self.batch.clear()

    def _loop(self, cpus: set[int] | None) -> None:
        pin(cpus)
        q, batch = self._queues, self.batch
        while True:
            with q.cond:
                # (a request the starter holds joins once it is ready: nothing to run until then;
                # parked rows only once one is resumed or cancelled, or their deadline comes)
                while not q.stopping and not (batch.rows or batch.staged or q.ready or q.waiting
                                              or batch.resumable()):
                    q.cond.wait(self._parked_deadline())
                if q.stopping:
                    return
            self._round()
            if not batch.rows:
                self._hand_off()  # no batched step comes to hand off before

    # --- one scheduling round ---

    def step(self) -> None:
        """Leave, admit, decode (see the package docstring); then every request that ended has
        its `done` set. (The engine thread's loop sets them at the next hand-off instead: just
        before the next batched step, which lets the GIL go, so the woken clients' Python runs
        beside that step rather than against this thread's joins, leaves and picks.)"""
        self._by_hand("step()")
        self._round()
        self._hand_off()

    def _by_hand(self, call: str) -> None:
        if self._thread is not None:  # two threads stepping one batch would corrupt its state
            raise UsageError(f"{call}: this engine's own thread runs its steps (start() was called); step() and "
                             "run_until_done() are for an engine that was not started")

    def _hand_off(self) -> None:
        """Wake the threads the last round let go on: clients waiting on requests that ended,
        the starter waiting for room to begin another."""
        wakes = self._wakes
        while wakes:
            wakes.pop(0).set()
        if self._wake_starter:
            self._wake_starter = False
            with self._queues.cond:
                self._queues.cond.notify_all()

    def _parked_deadline(self) -> float | None:
        """Seconds until the first parked row's deadline (None: no parked row has one)."""
        deadlines = [r.deadline for r, _ in self.batch.parked if r.deadline is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _round(self) -> None:
        self._queues.expire(self.batch.requests())
        self.batch.leave()
        try:
            self.batch.unpark()  # (before newcomers: a parked row's room is kept for it)
            self.batch.park()
            self._admit()
            self.batch.prefill_staged()
            self.batch.decode()
        except Exception as e:  # a batched run failed: its rows cannot go on, the engine can
            self.batch.fail_all(e)
        self.batch.leave()
        if self.on_round is not None:
            self.on_round()

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
            self.batch.join_begun(ready)
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
        while self._queues.ready and self._room(len(ready), running):  # (unlocked look: only this thread takes)
            item = self._queues.pop_ready()
            if item is None:
                break
            ready.append(item)
            self._wake_starter = True  # room for the starter to begin another (at the hand-off)
        return ready

    def _take_waiting(self, joined: int, running: int) -> list[Request]:
        newcomers: list[Request] = []
        if self._starter is not None and (running or joined):
            return newcomers  # with a starter, only an empty batch takes a newcomer itself (at once)
        while self._queues.waiting and self._room(len(newcomers) + joined, running):
            req = self._queues.pop_waiting()
            if req is None:
                break
            newcomers.append(req)
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
