"""Continuous batching over the explicit state: a request queue and one batched step at a time.

    engine = Engine(model, max_rows=16)
    req = engine.submit(prompt_ids, SearchOptions(max_new_tokens=20))
    while engine.has_work():
        engine.step()
    req.tokens, req.finish_reason          # the ids generate() gives this prompt alone

or `engine.start()` to run the steps on a background thread (submit from any thread; a
request's `on_event` sees each token as it comes, then None when it ends).

Each `step()` is one scheduling round, vLLM-style:
1. leave: cancelled, timed-out and finished requests drop their rows (`model.retain`: a
   survivor from the tail takes each leaver's place, so at most one row moves per leaver);
2. admit: waiting requests, as many as the row and state caps allow, start
   (`model.begin_rows`: a transformer's encoder, a recurrent model's zero state) and join the
   running batch (`model.extend`: a transformer's buffers have spare rows, so only the
   newcomers' rows are written) with the tokens they still have to feed (a transformer's start
   token, a Mamba's or RWKV's prompt);
3. decode: one `model.step` over every row (`model.advance` where the model has it: a step
   that consumes the batch's state, e.g. a recurrent state kept in preallocated rows,
   `seqexport.runtime.row_buffers`), each feeding its next prompt token or its last pick; a
   row past its prompt picks its next token from its logits. Then `on_round`, if given (a
   server hands the round's events to its event loop at once).

Prefill never stalls the running rows: a prompt goes through the batched step a token a
round (a row more in a batched step costs far less than a prefill graph run), and a prompt
longer than `prefill_chunk` first goes through the prefill graph `prefill_chunk` tokens a
round, outside the batch (`model.feed`; the same state as one prefill over it all). Only
newcomers that find the batch empty, with no one to stall, are prefilled at once
(`model.begin`: generate()'s own start, the shortest time to a first token): those of one
length, or, where the model prefills prompts of unequal length together (`ragged_prefill`),
as many as padding to the longest does not double. The price is
a later first token for a prompt that joins a running batch (a round per prompt token);
`prefill_chunk=0` prefills every newcomer at admission instead (each stalls the batch once).

Admission off the critical path: with `start()`, a second thread (the "starter") begins
waiting requests while the engine thread runs the batched step; ONNX Runtime releases the
GIL, so on two cores a newcomer's graph no longer stalls the rows already decoding. For a
model whose `begin_rows` runs a graph (`begin_rows_runs_a_graph`: a transformer's encoder,
about half a batch-16 step on the bundled model) the starter runs `begin_rows`; for one whose
`begin_rows` only makes a zero state (Mamba, RWKV-7) it runs `begin`, generate()'s own start
(the whole prompt through the prefill graph, then the first token's logits), so the newcomer
joins with its first token picked instead of feeding its prompt through the batch a token a
round (on the bundled Mamba its prompt held a row for about as many rounds as it then
generated). The engine thread only joins what the starter has ready, in arrival order.
`start_ahead=0`, or `step()` called directly, starts newcomers inline on the engine thread.

The engine never asks which family it runs: rows join and leave through the model's
`extend`/`retain`, and a model whose rows cannot sit at different positions
(`continuous_batching = False`) gets new requests only when the batch is empty.

Reproducibility: generate() draws a batch's samples from one generator seeded once per call,
so a sampled row's tokens depend on its batch-mates there. Here each request has its own
`numpy.random.default_rng(seed)` and draws only its own row, which is exactly what
generate() does for that prompt alone (a batch of one); so a seeded request gives the same
tokens whatever else is running, and a greedy one gives generate()'s tokens.
"""

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from seqexport.errors import ArtifactError, InputError, SeqexportError, UsageError
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.generate import SearchOptions, _as_rows, _eos, pick_tokens
from seqexport.state.rows import swap_remove_order

FINISH_REASONS = ("stop", "length", "cancelled", "timeout", "error")


def _by_start(reqs: list["Request"]) -> dict[int | None, list["Request"]]:
    """Requests grouped by their decoder start token (a transformer's; None: the default)."""
    groups: dict[int | None, list[Request]] = {}
    for req in reqs:
        groups.setdefault(req.options.start_id, []).append(req)
    return groups


@dataclass
class _Begun:
    """A request the starter began with `begin`: its first token's logits (1, v) and its state."""

    logits: np.ndarray
    state: State


class QueueFull(Exception):
    """The engine holds `max_queue` waiting requests already; try again later."""


@dataclass(eq=False)
class Request:
    """One prompt's generation. The engine thread writes it; read it after `done` is set
    (or from `on_event`, which runs on the engine thread)."""

    prompt: list[int]
    options: SearchOptions
    id: str
    on_event: Callable[["Request", int | None], None] | None = None  # token, then None at the end
    stop: Callable[[list[int]], bool] | None = None  # True: end here (e.g. a stop string appeared)
    deadline: float | None = None  # time.monotonic() after which the request ends with "timeout"
    tokens: list[int] = field(default_factory=list)  # generated ids (eos excluded)
    token_times: list[float] = field(default_factory=list)  # time.monotonic() of each token
    finish_reason: str | None = None  # one of FINISH_REASONS
    error: Exception | None = None  # what went wrong, for finish_reason "error"
    submitted: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self._picked = 0  # tokens picked so far, eos included (generate()'s step count)
        self._next = -1  # the token the next decode step feeds once _pending is empty
        self._pending: list[int] = []  # tokens still to feed before the first pick, last first
        self._eos: int | None = None  # set by the engine
        self._cancelled = False
        self._engine_flag: list | None = None  # the engine's "a request was cancelled" flag

    @cached_property
    def _rng(self) -> np.random.Generator:
        """generate()'s generator for a batch of one, seeded as it is (made on first use: a
        Generator costs ~20 us, a tenth of a server's work per greedy request)."""
        return np.random.default_rng(self.options.seed)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def cancel(self) -> None:
        """End this request at the next step boundary (its row is freed); safe from any thread."""
        self._cancelled = True
        if self._engine_flag is not None:  # the engine looks for cancelled requests next round
            self._engine_flag[0] = True

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def _pads_little(group: list[Request], newcomer: Request) -> bool:
    """Whether `newcomer` may join a prefill run of `group`: its rows are padded to the longest
    prompt, and the padding may at most equal the prompts' own tokens."""
    lengths = [len(r.prompt) for r in group] + [len(newcomer.prompt)]
    return len(lengths) * max(lengths) <= 2 * sum(lengths)


class Engine:
    """Scheduler + batched step loop over one runtime model (knows nothing of HTTP)."""

    def __init__(self, model: RuntimeModel, max_rows: int = 16, max_queue: int = 256,
                 max_state_bytes: int | None = None, max_prompt_tokens: int | None = None,
                 prefill_chunk: int = 64, start_ahead: int | None = None, start_batch: int = 4,
                 on_round: Callable[[], None] | None = None):
        start_ahead = max_rows if start_ahead is None else start_ahead
        for name, v, least in (("max_rows", max_rows, 1), ("max_queue", max_queue, 1), ("prefill_chunk", prefill_chunk, 0),
                               ("start_ahead", start_ahead, 0), ("start_batch", start_batch, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise UsageError(f"{name} must be an integer >= {least}, got {v!r}")
        self.model = model
        self._advance = model.advance  # a step that consumes the batch's state
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.max_state_bytes = max_state_bytes
        self.max_prompt_tokens = max_prompt_tokens
        self.prefill_chunk = prefill_chunk
        self.start_ahead = start_ahead  # requests the starter thread may have begun before they join
        self.start_batch = start_batch  # requests the starter begins in one prefill run (ragged_prefill)
        # called on the engine thread after each round's events (a server hands them on at once)
        self.on_round = on_round
        self._waiting: deque[Request] = deque()
        # begun by the starter, in arrival order: (request, a _Begun, a (state, pending) or the error raised)
        self._ready: deque[tuple[Request, _Begun | tuple | Exception]] = deque()
        self._starting = 0  # requests the starter holds right now
        self._starter: threading.Thread | None = None
        self._rows: list[Request] = []  # running requests, in the order of the state's rows
        self._state: State | None = None
        self._staged: list[tuple[Request, State]] = []  # long prompts prefilled a chunk a round
        self._cond = threading.Condition()
        # _expire walks every request only when one was cancelled (the flag) or the earliest
        # deadline has passed: a walk is O(queue) (6 us at 16 waiting, 48 at 256; the check 0.3)
        self._cancel_flag = [False]
        self._next_deadline = float("inf")
        self._held: list[Request] = []  # the requests the starter is beginning right now
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.steps = 0  # batched decode steps run
        self.row_steps = 0  # rows over all decode steps (row_steps / steps: the batch's mean rows)
        self.begun_ahead = 0  # requests the starter thread began
        self.tokens_generated = 0

    # --- what callers see ---

    @property
    def queue_length(self) -> int:
        return len(self._waiting) + len(self._ready) + self._starting

    @property
    def active_rows(self) -> int:
        return len(self._rows) + len(self._staged)

    @property
    def state_bytes(self) -> int:
        state = self._state
        return (state.nbytes if state is not None else 0) + sum(s.nbytes for _, s in self._staged)

    def has_work(self) -> bool:
        return bool(self._rows or self._staged or self._waiting or self._ready or self._starting)

    def submit(self, prompt, options: SearchOptions | None = None, *, on_event=None, stop=None,
               timeout: float | None = None, request_id: str | None = None) -> Request:
        """Queue one prompt (token ids). Raises InputError/UsageError for a prompt or options
        the model cannot take, QueueFull when `max_queue` requests already wait."""
        options = options or SearchOptions()
        if not isinstance(options, SearchOptions):
            raise UsageError(f"options: expected SearchOptions, got {type(options).__name__}")
        if options.num_beams > 1:
            raise UsageError(f"num_beams {options.num_beams}: the engine does greedy or sampled decoding only")
        (row,) = _as_rows([prompt])
        if self.max_prompt_tokens is not None and len(row) > self.max_prompt_tokens:
            raise InputError(f"prompt: {len(row)} tokens exceeds the limit of {self.max_prompt_tokens}")
        limit = self.model.max_new_tokens_limit
        if limit is not None and options.max_new_tokens > limit:
            raise InputError(f"max_new_tokens {options.max_new_tokens} exceeds what the model can hold: "
                             f"its decoder has {limit} positions")
        if timeout is not None and not timeout > 0:
            raise UsageError(f"timeout must be > 0 seconds, got {timeout!r}")
        now = time.monotonic()
        req = Request(row, options, request_id or f"req-{next(self._ids)}", on_event=on_event, stop=stop,
                      deadline=None if timeout is None else now + timeout, submitted=now)
        req._eos = _eos(self.model, options)
        req._engine_flag = self._cancel_flag
        with self._cond:
            if self.queue_length >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (max_queue {self.max_queue})")
            self._waiting.append(req)
            if req.deadline is not None:
                self._next_deadline = min(self._next_deadline, req.deadline)
            self._cond.notify()
        return req

    def cancel(self, req: Request) -> None:
        req.cancel()
        with self._cond:
            self._cond.notify()

    def run_until_done(self) -> None:
        """Step until no request runs or waits (the caller's thread; not with start())."""
        while self.has_work():
            self.step()

    # --- background thread ---

    def start(self) -> "Engine":
        """Run the step loop on a daemon thread until `close()`."""
        if self._thread is None:
            self._stopping = False
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
        for req in [*self._rows, *(r for r, _ in self._staged), *self._waiting, *(r for r, _ in self._ready)]:
            self._finish(req, "cancelled")
        self._rows, self._state, self._staged = [], None, []
        self._waiting.clear()
        self._ready.clear()

    def _loop(self) -> None:
        while True:
            with self._cond:
                # (a request the starter holds joins once it is ready: nothing to run until then)
                while not self._stopping and not (self._rows or self._staged or self._ready or self._waiting):
                    self._cond.wait()
                if self._stopping:
                    return
            self.step()

    def _start_loop(self) -> None:
        """The starter: `begin_rows` (a graph: a transformer's encoder) or else `begin` (the
        prompt's prefill and first logits) for waiting requests, at most `start_ahead` ready at
        once; up to `start_batch` of them in one `begin` when the model prefills rows of
        unequal length together (`ragged_prefill`)."""
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
                while len(group) < room and self._waiting and _pads_little(group, self._waiting[0]):
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
        """(request, a _Begun, a (state, pending) or the error raised) for each of `group`, in
        order; a prompt that fails fails alone (the group is begun again one by one)."""
        if len(group) > 1:
            try:
                logits, state = self.model.begin([r.prompt for r in group])  # (k, v); one start id: recurrent
                return [(r, _Begun(logits[i : i + 1], self.model.take(state, [i]))) for i, r in enumerate(group)]
            except Exception:  # noqa: BLE001 - found below, request by request
                pass
        out = []
        for req in group:
            try:
                if prefills:
                    out.append((req, _Begun(*self.model.begin([req.prompt], req.options.start_id))))
                else:
                    out.append((req, self.model.begin_rows([req.prompt], req.options.start_id)))
            except Exception as e:  # this prompt fails alone: the engine thread fails it with this
                out.append((req, e))
        return out

    # --- one scheduling round ---

    def step(self) -> None:
        """Leave, admit, decode (see the module docstring)."""
        self._expire()
        self._leave()
        try:
            self._admit()
            self._prefill_staged()
            self._decode()
        except Exception as e:  # a batched run failed: its rows cannot go on, the engine can
            for req in self._rows:
                self._fail(req, e)
            self._rows, self._state = [], None
        self._leave()
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
            every = [*self._rows, *(r for r, _ in self._staged), *waiting]
            # the next walk's deadline: submit() lowers it for requests that come later
            self._next_deadline = min((r.deadline for r in every + held if r.deadline is not None and
                                       not r._cancelled and r.deadline >= now), default=float("inf"))
        if any(r._cancelled or (r.deadline is not None and now > r.deadline) for r in held):
            self._cancel_flag[0] = True  # look again once the starter hands them over
        for req in every:
            if req._cancelled:
                self._finish(req, "cancelled")
            elif req.deadline is not None and now > req.deadline:
                self._finish(req, "timeout")
        if any(r.finished for r in waiting):
            with self._cond:
                self._waiting = deque(r for r in self._waiting if not r.finished)
                self._ready = deque((r, x) for r, x in self._ready if not r.finished)

    def _leave(self) -> None:
        self._staged = [(r, s) for r, s in self._staged if not r.finished]
        gone = [i for i, r in enumerate(self._rows) if r.finished]
        if not gone:
            return
        if len(gone) == len(self._rows):
            self._rows, self._state = [], None
            return
        order = swap_remove_order(len(self._rows), gone)  # at most one row moves per leaver
        self._state = self.model.retain(self._state, order)
        self._rows = [self._rows[i] for i in order]

    def _room(self, pending: int, running: int) -> bool:
        """Whether one more waiting request may join, `pending` others already joining."""
        rows = len(self._rows) + len(self._staged)
        if rows + pending >= self.max_rows:
            return False
        if running and not self.model.continuous_batching:
            return False  # rows of this model must start together: wait for an empty batch
        if self.max_state_bytes is not None:
            if not rows:
                return pending == 0  # nothing to measure a row by: one newcomer, measured next round
            held = self.state_bytes
            return held + held / rows * (pending + 1) <= self.max_state_bytes  # average rows
        return True

    def _admit(self) -> None:
        running = len(self._rows) + len(self._staged)  # rows that were there before this round
        ready = []
        while self._room(len(ready), running):
            with self._cond:
                if not self._ready:
                    break
                ready.append(self._ready.popleft())
                self._cond.notify_all()  # room for the starter to begin another
        for req, result in ready:
            if isinstance(result, Exception):
                self._fail(req, result)
            elif isinstance(result, _Begun):
                self._join(self._started([req], result.logits, result.state))
            else:
                self._enter([req], *result)
        newcomers: list[Request] = []
        while self._room(len(newcomers) + len(ready), running):
            with self._cond:  # with a starter, only an empty batch takes a newcomer itself (at once)
                if not self._waiting or (self._starter is not None and (running or ready)):
                    break
                newcomers.append(self._waiting.popleft())
        if not newcomers:
            return
        if not self.model.continuous_batching or not self.prefill_chunk:  # prefilled at admission
            # (rows that must start together come only to an empty batch: see _room)
            self._join(s for start_id, group in _by_start(newcomers).items() for s in self._begin(group, start_id))
            return
        if not running:  # no one to stall: prefilled at once, prompts of unequal length together
            if self.model.ragged_prefill:  # where the model takes them in one run
                first = [newcomers[0]]
                for req in newcomers[1:]:
                    if _pads_little(first, req):
                        first.append(req)
            else:  # else the largest group of one length
                by_len: dict[tuple, list[Request]] = {}
                for req in newcomers:
                    by_len.setdefault((len(req.prompt), req.options.start_id), []).append(req)
                first = max(by_len.values(), key=len)
            self._join(self._begin(first, first[0].options.start_id))
            newcomers = [r for r in newcomers if all(r is not f for f in first)]
        for start_id, group in _by_start(newcomers).items():
            self._begin_rows(group, start_id)

    def _join(self, states) -> None:
        """The running batch with these states' rows after its own (in place where it can)."""
        states = list(states)
        if states:
            self._state = self.model.join(states) if self._state is None else self.model.extend(self._state, states)

    def _begin(self, group: list[Request], start_id: int | None) -> list[State]:
        """Prefill newcomers together (one `begin`), pick their first tokens; the state of
        those that go on. A prompt the model refuses fails alone."""
        try:
            logits, state = self.model.begin([r.prompt for r in group], start_id)  # (k, v)
        except SeqexportError as e:  # e.g. a source longer than the positional table
            if len(group) == 1:
                self._fail(group[0], e)
                return []
            return [s for r in group for s in self._begin([r], start_id)]  # find the one at fault
        return self._started(group, logits, state)

    def _started(self, group: list[Request], logits: np.ndarray, state: State) -> list[State]:
        """Begun requests' first tokens picked from their (k, v) logits; the rows that go on
        join the running requests (the caller joins the state returned)."""
        self._pick_rows(group, logits, time.monotonic())
        keep = [i for i, r in enumerate(group) if not r.finished]
        self._rows += [group[i] for i in keep]
        if not keep:
            return []
        return [state if len(keep) == len(group) else self.model.take(state, keep)]

    def _begin_rows(self, group: list[Request], start_id: int | None) -> None:
        """Start newcomers (one `begin_rows`) and add them to the batch with the tokens they
        still have to feed; a prompt longer than `prefill_chunk` is staged first. A prompt the
        model refuses fails alone."""
        try:
            state, pending = self.model.begin_rows([r.prompt for r in group], start_id)
        except SeqexportError as e:
            if len(group) == 1:
                self._fail(group[0], e)
                return
            for r in group:
                self._begin_rows([r], start_id)
            return
        self._enter(group, state, pending)

    def _enter(self, group: list[Request], state: State, pending: list[list[int]]) -> None:
        """Begun requests into the batch (or staged, a prompt longer than `prefill_chunk`) with
        the tokens they still have to feed."""
        joining, stage = [], []
        for i, (req, tokens) in enumerate(zip(group, pending)):
            req._pending = tokens[::-1]  # popped from the end
            (stage if len(tokens) > self.prefill_chunk else joining).append(i)
        for i in stage:
            self._staged.append((group[i], self.model.take(state, [i])))
        if joining:
            self._join([state if len(joining) == len(group) else self.model.take(state, joining)])
            self._rows += [group[i] for i in joining]

    def _prefill_staged(self) -> None:
        """The oldest staged prompt's next chunk through the prefill graph (one bounded run a
        round); once `prefill_chunk` tokens or fewer are left, it joins the batch."""
        if not self._staged:
            return
        req, state = self._staged[0]
        chunk = min(self.prefill_chunk, len(req._pending) - self.prefill_chunk)
        tokens = req._pending[: -chunk - 1 : -1]  # the next `chunk`, in order
        try:
            state = self.model.feed(np.array([tokens], np.int64), state)  # (1, chunk)
        except SeqexportError as e:
            self._staged.pop(0)
            self._fail(req, e)
            return
        del req._pending[-chunk:]
        if len(req._pending) > self.prefill_chunk:
            self._staged[0] = (req, state)
            return
        self._staged.pop(0)
        self._join([state])
        self._rows.append(req)

    def _decode(self) -> None:
        rows = self._rows
        if not rows:
            return
        tokens, pick = [], []
        for i, r in enumerate(rows):
            pending = r._pending
            if pending:
                tokens.append(pending.pop())
                if pending:
                    continue  # more prompt to feed: these logits are not needed
            else:
                tokens.append(r._next)
            pick.append(i)
        tokens = np.array(tokens, np.int64)  # (b,)
        if self._advance is not None:
            logits, self._state = self._advance(tokens, self._state, self.max_rows)  # (b, v)
        else:
            logits, self._state = self.model.step(tokens, self._state)  # (b, v)
        self.steps += 1
        self.row_steps += len(rows)
        if pick:
            whole = len(pick) == len(rows)
            self._pick_rows(rows if whole else [rows[i] for i in pick], logits if whole else logits[pick],
                            time.monotonic())

    def _pick_rows(self, reqs: list[Request], logits: np.ndarray, now: float) -> None:
        """Each request's next token from its row of the (b, v) logits, as Generator does for
        that request alone (greedy rows share one argmax; sampled rows draw from their own rng)."""
        best = logits.argmax(-1).tolist()  # (b,)
        finite = np.isfinite(logits).all(-1)  # (b,)
        bad = not finite.all()
        for i, req in enumerate(reqs):
            if bad and not finite[i]:
                self._fail(req, ArtifactError(f"the model produced NaN/Inf logits after {req._picked} new "
                                              "tokens; run `seqexport validate` on this export"))
                continue
            opts = req.options
            token = int(pick_tokens(logits[i : i + 1], opts, req._rng)[0]) if opts.do_sample else best[i]
            self._take_token(req, token, now)

    def _take_token(self, req: Request, token: int, now: float) -> None:
        req._picked += 1
        if token == req._eos:
            self._finish(req, "stop")
            return
        req.tokens.append(token)
        req.token_times.append(now)
        self.tokens_generated += 1
        self._emit(req, token)
        if req.stop is not None and req.stop(req.tokens):
            self._finish(req, "stop")
        elif req._picked >= req.options.max_new_tokens:
            self._finish(req, "length")
        else:
            req._next = token

    def _fail(self, req: Request, error: Exception) -> None:
        req.error = error
        self._finish(req, "error")

    def _finish(self, req: Request, reason: str) -> None:
        if req.finished:
            return
        req.finish_reason = reason
        self._emit(req, None)
        req.done.set()

    @staticmethod
    def _emit(req: Request, token: int | None) -> None:
        if req.on_event is None:
            return
        try:
            req.on_event(req, token)
        except Exception:  # a listener that is gone (e.g. a closed event loop) frees its row
            req.on_event = None
            req.cancel()
