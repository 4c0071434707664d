"""Continuous batching over the explicit state: a request queue and one batched step at a time.

    request    Request (one prompt's generation, its per-token rule), QueueFull, the check
               a prompt and its options pass before they are queued
    queues     Queues: the requests not yet in the batch (waiting, held by the starter,
               begun) under one lock, and the walk that ends cancelled and timed-out ones
    scheduler  the admission policy: room for one more, which newcomers prefill together
    batch      RunningBatch, the executor: the running rows and their state, begin / feed /
               one batched step / picks, rows joining and leaving through the model
    starter    Starter, the thread that begins waiting requests beside the batched step
    pinning    the engine and starter threads on CPUs of their own (`pin_threads`)
    engine     Engine: the engine thread and the round that ties the queues to the batch
               (expire, leave, admit, decode)

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
   Rows of held requests (`Request.hold()`: a server's client is far behind its stream) are
   parked, their state kept aside, and resumed ones rejoin where they left off;
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

Waking other threads is handed off too: a request that ends gets its `on_event(None)` at once,
but the engine thread sets its `done` event (and tells the starter it has room) just before
the next batched step, which lets the GIL go for the whole step; a client woken then runs its
Python (the next `submit`) beside that step instead of taking the GIL in the middle of the
round's joins, leaves and picks. When no step follows (the batch is empty, `close()`, or
`step()` called directly) they are woken at the end of the round.

The engine never asks which family it runs: rows join and leave through the model's
`extend`/`retain`, and a model whose rows cannot sit at different positions
(`continuous_batching = False`) gets new requests only when the batch is empty.

Reproducibility: generate() draws a batch's samples from one generator seeded once per call,
so a sampled row's tokens depend on its batch-mates there. Here each request has its own
`numpy.random.default_rng(seed)` and draws only its own row, which is exactly what
generate() does for that prompt alone (a batch of one); so a seeded request gives the same
tokens whatever else is running, and a greedy one gives generate()'s tokens.
"""

from seqexport.runtime.engine.engine import Engine
from seqexport.runtime.engine.request import FINISH_REASONS, QueueFull, Request

__all__ = ["FINISH_REASONS", "Engine", "QueueFull", "Request"]
