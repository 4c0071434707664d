"""The starter thread: begins waiting requests while the engine thread runs the batched step
(ONNX Runtime lets the GIL go), so a newcomer's graph does not stall the rows decoding."""

import threading

from seqexport.runtime.base import RuntimeModel
from seqexport.runtime.engine import scheduler
from seqexport.runtime.engine.pinning import pin
from seqexport.runtime.engine.queues import Queues
from seqexport.runtime.engine.request import Begun, Request


class Starter(threading.Thread):
    """`begin_rows` (a graph: a transformer's encoder) or else `begin` (the prompt's prefill
    and first logits) for waiting requests, at most `start_ahead` ready at once; up to
    `start_batch` of them in one `begin` when the model prefills rows of unequal length
    together (`ragged_prefill`). Runs until the queues are stopping."""

    def __init__(self, model: RuntimeModel, queues: Queues, start_ahead: int, start_batch: int,
                 cpus: set[int] | None):
        super().__init__(name="seqexport-starter", daemon=True)
        self.model = model
        self.queues = queues
        self.start_ahead = start_ahead
        self.prefills = not model.begin_rows_runs_a_graph
        self.group_size = start_batch if self.prefills and model.ragged_prefill else 1  # requests a begin() takes
        self.cpus = cpus

    def run(self) -> None:
        pin(self.cpus)
        q = self.queues
        while True:
            with q.cond:
                while not q.stopping and not (q.waiting and len(q.ready) < self.start_ahead):
                    q.cond.wait()
                if q.stopping:
                    return
                room = min(self.group_size, self.start_ahead - len(q.ready))
                group = [q.waiting.popleft()]
                while len(group) < room and q.waiting and scheduler.pads_little(group, q.waiting[0]):
                    group.append(q.waiting.popleft())
                q.held = group
            results = self.begin([r for r in group if not r.finished])
            with q.cond:
                q.held = []
                q.ready.extend(results)
                q.begun += len(results)
                q.cond.notify_all()

    def begin(self, group: list[Request]) -> list[tuple[Request, object]]:
        """(request, a Begun, a (state, pending) or the error raised) for each of `group`, in
        order; a prompt that fails fails alone (the group is begun again one by one)."""
        model = self.model
        if len(group) > 1:
            try:
                logits, state = model.begin([r.prompt for r in group])  # (k, v); one start id: recurrent
                return [(r, Begun(logits[i : i + 1], model.take(state, [i]))) for i, r in enumerate(group)]
            except Exception:  # noqa: BLE001 - found below, request by request
                pass
        out = []
        for req in group:
            try:
                if self.prefills:
                    out.append((req, Begun(*model.begin([req.prompt], req.options.start_id))))
                else:
                    out.append((req, model.begin_rows([req.prompt], req.options.start_id)))
            except Exception as e:  # this prompt fails alone: the engine thread fails it with this
                out.append((req, e))
        return out
