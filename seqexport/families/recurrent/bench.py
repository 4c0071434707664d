"""What `seqexport bench` times of a recurrent-state LM (see `seqexport.bench.cases`): the
one-token step (eager `model.step` vs the step graph) — its state has one size whatever the
context, so it is timed once — and the prefill at each length from a fresh state.

A family's bench module takes `PROMPT_LEN`, `TABLE`, `check_contexts`, `decode_state`,
`extra_results` and `generation_prompts` from here as they are, and builds its `step_cases`
and `prefill_cases` on the ones below (naming its layer state, its scan lowering run eagerly);
`step_weight_bytes` is its own.
"""

from collections.abc import Callable

import numpy as np
import torch

from seqexport.bench.cases import Case, bare_session, split_feeds
from seqexport.bench.tables import StepTable
from seqexport.parity.inputs import random_inputs
from seqexport.runtime.base import State
from seqexport.specs import INPUT_IDS

PROMPT_LEN = {False: 16, True: 4}  # tokens of generation's prompts
TABLE = StepTable("step (one token), ms")


def check_contexts(config: dict, contexts, defaults=(), notes: list[str] | None = None) -> tuple[int, ...]:
    """Prefill lengths: any (the recurrent state holds any context)."""
    return tuple(contexts or defaults)


def _step_feeds(rt, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Step graph inputs: a token per row and a state of random contents."""
    return random_inputs(rt.specs["step"], dict(batch=batch), rng, state_scale=0.1)


def decode_state(rt, batch: int, context: int, rng: np.random.Generator, prompt_len: int = 0) -> State:
    """The state has the same shape after any number of tokens, so one of random contents
    stands for every context (a step costs the same whatever it holds)."""
    return split_feeds(_step_feeds(rt, batch, rng), context)[1]


def _eager_step(model, feeds: dict[str, np.ndarray], layer_state: Callable[[int], tuple[str, ...]]):
    """The model's own `step` on the same arrays (as torch tensors, made once)."""
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
    state = [tuple(t[name] for name in layer_state(i)) for i in range(model.config.n_layer)]
    tokens = t[INPUT_IDS][:, 0]  # (b, 1) -> (b,)
    return lambda: model.step(tokens, state)


def step_cases(rt, model, batches, contexts, prompt_len: int, rng: np.random.Generator, *,
               layer_state: Callable[[int], tuple[str, ...]]):
    """The one-token step at each batch (no context: it costs the same at any). `layer_state`:
    layer i -> its state's input names, in the order of the model's per-layer tuple (a family
    binds it: `partial(step_cases, layer_state=...)`)."""
    for batch in batches:
        feeds = _step_feeds(rt, batch, rng)
        tokens, state = split_feeds(feeds, 1)
        fns = {"eager": _eager_step(model, feeds, layer_state),
               "ort": lambda tokens=tokens, state=state: rt.step(tokens, state),
               "ort_session": bare_session(rt, "step", feeds)}
        yield Case(f"step: batch {batch}", {"batch": batch, "context": None, "state_bytes": state.nbytes}, fns)


def prefill_cases(rt, model, batches, lengths, rng: np.random.Generator, *, scan: Callable, lowering: str):
    """The prefill of each length from a fresh state: eager with the model's sequential
    reference (its logits at every position) and with `scan` (the export's lowering, `lowering`
    in the rows) run eagerly; the runtime's prefill as generation runs it (the last position's
    logits) and with every position's; the bare session, asked for the last position as well."""
    keep = [t.name for t in rt.specs["prefill"].inputs if t.role == "keep"]
    for batch in batches:
        for length in lengths:
            # every row its whole length (an attention mask of ones), as generation prefills
            # a fresh state: an appended cache (a hybrid's attention layers) holds no slot yet
            feeds = random_inputs(rt.specs["prefill"], dict(batch=batch, seq_len=length, past_len=0), rng,
                                  pad_rows=False, zero_state=True)
            feeds |= {name: np.array([1], np.int64) for name in keep}
            ids, fresh = feeds[INPUT_IDS], rt.start(batch)
            tids = torch.from_numpy(ids)  # (b, length)
            fns = {"eager": lambda tids=tids: model(tids),
                   "eager_lowering": lambda tids=tids: model(tids, scan=scan),
                   "ort": lambda ids=ids, fresh=fresh: rt.step(ids, fresh, last_only=True),
                   "ort_all": lambda ids=ids, fresh=fresh: rt.step(ids, fresh),
                   "ort_session": bare_session(rt, "prefill", feeds)}
            yield Case(f"prefill: batch {batch}, length {length}",
                       {"batch": batch, "length": length, "lowering": lowering}, fns)


def extra_results(rt, model, contexts, rng: np.random.Generator, **timing) -> dict:
    """The state's bytes at each context (batch 1): the same at every one."""
    return {"state_bytes": {str(c): decode_state(rt, 1, c, rng).nbytes for c in contexts}}


def generation_prompts(rt, batch: int, prompt_len: int, rng: np.random.Generator) -> np.ndarray:
    """Random prompts (b, prompt_len), all of one length (prefilled together)."""
    return rng.integers(0, rt.vocab_size, (batch, prompt_len), dtype=np.int64)
