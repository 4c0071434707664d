"""The executor: the running rows, their state, and every model run the engine makes.

Rows join through the model's `join`/`extend` (a transformer's buffers have spare rows, so
only the newcomers' rows are written) and leave through `retain` (a survivor from the tail
takes each leaver's place: at most one row moves per leaver). One batched step feeds each
row its next prompt token or its last pick; rows past their prompt pick from their logits.
A held request's row (`Request.hold`: its consumer is behind) is parked: its state taken out
of the batch's (`take`), the rest kept (`retain`), until it is resumed and joins again; a
parked row still counts against the rows and state the batch may hold, so it always finds
room to come back. It knows nothing of the queue or of threads (`engine`)."""

import time
from collections.abc import Callable

import numpy as np

from seqexport.errors import ArtifactError, SeqexportError
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.engine.request import Begun, Request
from seqexport.runtime.generate import pick_tokens, without
from seqexport.state.rows import swap_remove_order


class RunningBatch:
    def __init__(self, model: RuntimeModel, max_rows: int, prefill_chunk: int):
        self.model = model
        self.max_rows = max_rows
        self.prefill_chunk = prefill_chunk
        self._advance = model.advance  # a step that consumes the batch's state
        self.rows: list[Request] = []  # running requests, in the order of the state's rows
        self.state: State | None = None
        self.staged: list[tuple[Request, State]] = []  # long prompts prefilled a chunk a round
        self.parked: list[tuple[Request, State]] = []  # held requests' rows, out of the batch
        # parking needs rows that may sit at different positions (they come back behind the others)
        self.can_park = model.continuous_batching
        self.steps = 0  # batched decode steps run
        self.row_steps = 0  # rows over all decode steps (row_steps / steps: the batch's mean rows)
        self.tokens_generated = 0
        self.before_run: Callable[[], None] | None = None  # called just before each batched step

    @property
    def active_rows(self) -> int:
        return len(self.rows) + len(self.staged) + len(self.parked)

    @property
    def state_bytes(self) -> int:
        state = self.state
        return (state.nbytes if state is not None else 0) + sum(s.nbytes for _, s in self.staged) + \
            sum(s.nbytes for _, s in self.parked)

    def requests(self) -> list[Request]:
        return [*self.rows, *(r for r, _ in self.staged), *(r for r, _ in self.parked)]

    def clear(self) -> None:
        self.rows, self.state, self.staged, self.parked = [], None, [], []

    def resumable(self) -> bool:
        """Whether a parked row has something for the next round: it was resumed, or it ends
        (cancelled, or past its deadline)."""
        if not self.parked:  # (has_work asks every round)
            return False
        now = time.monotonic()
        return any(not r._held or r._cancelled or (r.deadline is not None and now > r.deadline)
                   for r, _ in self.parked)

    def fail_all(self, error: Exception) -> None:
        """A batched run failed: its rows cannot go on (the staged ones can)."""
        for req in self.rows:
            req.fail(error)
        self.rows, self.state = [], None

    def leave(self) -> None:
        """Finished requests drop their rows."""
        self.staged = [(r, s) for r, s in self.staged if not r.finished]
        if self.parked:
            self.parked = [(r, s) for r, s in self.parked if not r.finished]
        gone = [i for i, r in enumerate(self.rows) if r.finished]
        if not gone:
            return
        if len(gone) == len(self.rows):
            self.rows, self.state = [], None
            return
        order = swap_remove_order(len(self.rows), gone)  # at most one row moves per leaver
        self.state = self.model.retain(self.state, order)
        self.rows = [self.rows[i] for i in order]

    # --- held rows ---

    def park(self) -> None:
        """Held requests' rows out of the batch, each state taken (copied) out of the batch's;
        the others keep theirs in place (`retain`). A row still feeding its prompt is not held
        back (its consumer has nothing to be behind on)."""
        if not self.can_park:
            return
        held = [i for i, r in enumerate(self.rows) if r._held and not r._pending]
        if not held:
            return
        self.parked += [(self.rows[i], self.model.take(self.state, [i])) for i in held]
        if len(held) == len(self.rows):
            self.rows, self.state = [], None
            return
        order = swap_remove_order(len(self.rows), held)
        self.state = self.model.retain(self.state, order)
        self.rows = [self.rows[i] for i in order]

    def unpark(self) -> None:
        """Resumed requests back into the batch, after the running rows, where they left off."""
        back = [(r, s) for r, s in self.parked if not r._held]
        if not back:
            return
        self.parked = [(r, s) for r, s in self.parked if r._held]
        reqs = [r for r, _ in back]
        try:
            self.join(s for _, s in back)
        except Exception as e:  # (the batch's rows fail with it: see Engine._round)
            for req in reqs:
                req.fail(e)
            raise
        self.rows += reqs

    # --- joining ---

    def join(self, states) -> None:
        """The running batch with these states' rows after its own (in place where it can)."""
        states = list(states)
        if states:
            self.state = self.model.join(states) if self.state is None else \
                self.model.extend(self.state, states, self.max_rows)

    def begin(self, group: list[Request], start_id: int | None) -> list[State]:
        """Prefill newcomers together (one `begin`), pick their first tokens; the state of
        those that go on. A prompt the model refuses fails alone."""
        try:
            logits, state = self.model.begin([r.prompt for r in group], start_id)  # (k, v)
        except SeqexportError as e:  # e.g. a source longer than the positional table
            if len(group) == 1:
                group[0].fail(e)
                return []
            return [s for r in group for s in self.begin([r], start_id)]  # find the one at fault
        return self.started(group, logits, state)

    def started(self, group: list[Request], logits: np.ndarray, state: State) -> list[State]:
        """Begun requests' first tokens picked from their (k, v) logits; the rows that go on
        join the running requests (the caller joins the state returned)."""
        self.pick(group, logits, time.monotonic())
        keep = [i for i, r in enumerate(group) if not r.finished]
        self.rows += [group[i] for i in keep]
        if not keep:
            return []
        return [state if len(keep) == len(group) else self.model.take(state, keep)]

    def begin_rows(self, group: list[Request], start_id: int | None) -> None:
        """Start newcomers (one `begin_rows`) and add them to the batch with the tokens they
        still have to feed; a prompt longer than `prefill_chunk` is staged first. A prompt the
        model refuses fails alone."""
        try:
            state, pending = self.model.begin_rows([r.prompt for r in group], start_id)
        except SeqexportError as e:
            if len(group) == 1:
                group[0].fail(e)
                return
            for r in group:
                self.begin_rows([r], start_id)
            return
        self.enter(group, state, pending)

    def enter(self, group: list[Request], state: State, pending: list[list[int]]) -> None:
        """Begun requests into the batch (or staged, a prompt longer than `prefill_chunk`) with
        the tokens they still have to feed."""
        joiners, states = self.entering(group, state, pending)
        self.join(states)
        self.rows += joiners

    def entering(self, group: list[Request], state: State, pending: list[list[int]]) -> tuple[list[Request], list[State]]:
        """`enter` up to the join: the long prompts staged; the requests that join and their
        state, for the caller to join (several newcomers' in one `join`), then add to `rows`."""
        joining, stage = [], []
        for i, (req, tokens) in enumerate(zip(group, pending)):
            req._pending = tokens[::-1]  # popped from the end
            (stage if len(tokens) > self.prefill_chunk else joining).append(i)
        for i in stage:
            self.staged.append((group[i], self.model.take(state, [i])))
        if not joining:
            return [], []
        return [group[i] for i in joining], [state if len(joining) == len(group) else self.model.take(state, joining)]

    def join_begun(self, ready: list[tuple[Request, object]]) -> None:
        """Requests the starter has begun into the batch, their states joined in one go (one pass
        over the batch's arrays); a begun request is running once picked, one still to feed
        once its state has joined (a model's ready results are all of one kind: the rows keep
        the states' order)."""
        joining, joiners = [], []
        for req, result in ready:
            if isinstance(result, Exception):
                req.fail(result)
            elif isinstance(result, Begun):
                joining += self.started([req], result.logits, result.state)
            else:
                reqs, states = self.entering([req], *result)
                joiners += reqs
                joining += states
        self.join(joining)
        self.rows += joiners

    def prefill_staged(self) -> None:
        """The oldest staged prompt's next chunk through the prefill graph (one bounded run a
        round); once `prefill_chunk` tokens or fewer are left, it joins the batch."""
        if not self.staged:
            return
        req, state = self.staged[0]
        chunk = min(self.prefill_chunk, len(req._pending) - self.prefill_chunk)
        tokens = req._pending[: -chunk - 1 : -1]  # the next `chunk`, in order
        try:
            state = self.model.feed(np.array([tokens], np.int64), state)  # (1, chunk)
        except SeqexportError as e:
            self.staged.pop(0)
            req.fail(e)
            return
        del req._pending[-chunk:]
        if len(req._pending) > self.prefill_chunk:
            self.staged[0] = (req, state)
            return
        self.staged.pop(0)
        self.join([state])
        self.rows.append(req)

    # --- one batched step ---

    def decode(self) -> None:
        rows = self.rows
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
        if self.before_run is not None:
            self.before_run()
        if self._advance is not None:
            logits, self.state = self._advance(tokens, self.state, self.max_rows)  # (b, v)
        else:
            logits, self.state = self.model.step(tokens, self.state)  # (b, v)
        self.steps += 1
        self.row_steps += len(rows)
        if pick:
            whole = len(pick) == len(rows)
            self.pick(rows if whole else [rows[i] for i in pick], logits if whole else logits[pick],
                      time.monotonic())

    def pick(self, reqs: list[Request], logits: np.ndarray, now: float) -> None:
        """Each request's next token from its row of the (b, v) logits, as Generator does for
        that request alone (greedy rows share one argmax; sampled rows draw from their own rng)."""
        best = logits.argmax(-1).tolist()  # (b,)
        # NaN/Inf anywhere makes the sum non-finite (one reduction, no (b, v) mask); only then
        # (or a sum of finite logits that overflows) is each row looked at
        bad = not np.isfinite(logits.sum())
        finite = np.isfinite(logits).all(-1) if bad else None  # (b,)
        for i, req in enumerate(reqs):
            if bad and not finite[i]:
                req.fail(ArtifactError(f"the model produced NaN/Inf logits after {req._picked} new "
                                       "tokens; run `seqexport validate` on this export"))
                continue
            opts = req.options
            held = req._picked < opts.min_new_tokens  # its eos not yet allowed
            if req._seen is not None or held:  # its penalties and rules, its eos held back: its own row of scores
                # (v,) -> (1, v); Seen holds eos back itself
                row = (req._seen.apply(logits[i]) if req._seen is not None else without(logits[i], req._eos))[None]
                token = int(pick_tokens(row, opts, req._rng)[0]) if opts.do_sample else int(row.argmax())
            else:
                token = int(pick_tokens(logits[i : i + 1], opts, req._rng)[0]) if opts.do_sample else best[i]
            self.tokens_generated += req.take(token, now)
