"""One prompt's generation as the engine runs it, and the rule each new token goes through."""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from seqexport.errors import InputError, UsageError
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.generate import SearchOptions, as_rows, check_start_id, row_budget
from seqexport.runtime.penalties import Seen

FINISH_REASONS = ("stop", "length", "cancelled", "timeout", "error")


class QueueFull(Exception):
    """The engine holds `max_queue` waiting requests already; try again later."""


@dataclass
class Begun:
    """A request the starter began with `begin`: its first token's logits (1, v) and its state."""

    logits: np.ndarray
    state: State


@dataclass(eq=False)
class Request:
    """One prompt's generation. The engine thread writes it; read it after `done` is set
    (or from `on_event`, which runs on the engine thread). `on_event` sees the end at once;
    `done` is set at the engine's next hand-off (see `Engine.step`)."""

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
        self._eos: tuple[int, ...] = ()  # the ids that end it, set by the engine
        self._seen: Seen | None = None  # the tokens its penalties count, set by the engine where it has any
        self._budget = self.options.max_new_tokens  # the most new tokens it may make, set by the engine (max_length)
        self._cancelled = False
        self._held = False  # hold(): its consumer is behind; the engine parks its row
        self._engine_flag: list | None = None  # the engine's "a request was cancelled" flag
        self._engine_wake: Callable[[], None] | None = None  # wakes an engine thread that waits for work
        # the engine's wake-ups: `done` is set by the engine at its next hand-off (just before a
        # batched step lets the GIL go) instead of at once; None: set at once
        self._engine_wakes: list | None = None

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
        if self._engine_wake is not None:  # (its row may be parked, with nothing else running)
            self._engine_wake()

    def hold(self) -> None:
        """Give this request no more steps until `resume()`: its consumer is behind (a client
        reading its stream slowly), and the tokens would pile up unread in memory. Its row
        keeps its place in the batch's count and its state is kept aside (parked) from the next
        round; its deadline still runs, and cancel() still ends it. Safe from any thread. A
        model whose rows cannot sit at different positions (`continuous_batching` False) is
        never parked: there, hold() changes nothing."""
        self._held = True

    def resume(self) -> None:
        """Undo hold(): the row rejoins the batch at the next round, where it left off."""
        self._held = False
        if self._engine_wake is not None:
            self._engine_wake()

    @property
    def held(self) -> bool:
        return self._held

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    # --- written by the engine thread ---

    def take(self, token: int, now: float) -> bool:
        """A picked token, by generate()'s rule: eos ends the request (not kept), else the token
        is kept and shown, then a stop string or the length limit ends it. True: a token was kept."""
        self._picked += 1
        if self._seen is not None:
            self._seen.add(token)
        if token in self._eos:
            self.finish("stop")
            return False
        self.tokens.append(token)
        self.token_times.append(now)
        self._emit(token)
        if self.stop is not None and self.stop(self.tokens):
            self.finish("stop")
        elif self._picked >= self._budget:
            self.finish("length")
        else:
            self._next = token
        return True

    def fail(self, error: Exception) -> None:
        self.error = error
        self.finish("error")

    def finish(self, reason: str) -> None:
        if self.finished:
            return
        self.finish_reason = reason
        self._emit(None)
        if self._engine_wakes is not None:
            self._engine_wakes.append(self.done)
        else:
            self.done.set()

    def _emit(self, token: int | None) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(self, token)
        except Exception:  # a listener that is gone (e.g. a closed event loop) frees its row
            self.on_event = None
            self.cancel()


def checked_prompt(model: RuntimeModel, prompt, options: SearchOptions, timeout: float | None,
                   max_prompt_tokens: int | None) -> tuple[list[int], int]:
    """The prompt as token ids and the most new tokens it may make (generate's row_budget), once
    it and the options (SearchOptions) are known to fit the model."""
    if options.num_beams > 1:
        raise UsageError(f"num_beams {options.num_beams}: the engine does greedy or sampled decoding only")
    (row,) = as_rows([prompt])
    if max_prompt_tokens is not None and len(row) > max_prompt_tokens:
        raise InputError(f"prompt: {len(row)} tokens exceeds the limit of {max_prompt_tokens}")
    budget = row_budget(model, options, row)
    check_start_id(model, options.start_id)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float | np.number)
                                or not timeout > 0):
        raise UsageError(f"timeout must be > 0 seconds, got {timeout!r}")
    return row, budget


def check_hooks(on_event, stop, request_id) -> None:
    """What submit() is given beside the prompt: a listener and a stop test that can be called
    (else they failed on the engine thread: a request that ended as "error" or was cancelled,
    with no word to the caller), and an id that is a string."""
    for name, hook in (("on_event", on_event), ("stop", stop)):
        if hook is not None and not callable(hook):
            raise UsageError(f"{name}: expected a function or None, got {type(hook).__name__}")
    if request_id is not None and not isinstance(request_id, str):
        raise UsageError(f"request_id: expected a string or None, got {type(request_id).__name__}")
