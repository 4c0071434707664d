"""What `seqexport bench` times of a hybrid export (see `seqexport.families.recurrent.bench`):
the one-token step over a cache of each context (the attention layers read it all, the Mamba-2
layers' state has one size), and the prefill at each length."""

from functools import partial

import numpy as np
import torch

from seqexport.bench.cases import Case, advancing_step, bare_session, branch_step, split_feeds
from seqexport.families.hybrid.export import chunk_of, layers_of
from seqexport.families.hybrid.specs import INPUT_IDS, PAST_LENGTHS
from seqexport.families.mamba2.ssd import ssd_grouped
from seqexport.families.recurrent import bench as recurrent
from seqexport.models.hybrid import Experts
from seqexport.parity.inputs import random_inputs
from seqexport.runtime.session import NP_DTYPES
from seqexport.state import appended

PROMPT_LEN, TABLE, check_contexts = recurrent.PROMPT_LEN, recurrent.TABLE, recurrent.check_contexts
generation_prompts = recurrent.generation_prompts


def _step_feeds(rt, batch: int, context: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A token per row and a state as after `context` tokens: random K/V (a step costs the same
    whatever they hold) in a buffer of the capacity the runtime would hold, `context` valid."""
    feeds = random_inputs(rt.specs["step"], dict(batch=batch, past_len=appended.capacity_for(context + 1)), rng,
                          state_scale=0.1, pad_rows=False)
    feeds[PAST_LENGTHS] = np.full(batch, context, np.int64)
    return feeds


def decode_state(rt, batch: int, context: int, rng: np.random.Generator, prompt_len: int = 0):
    return split_feeds(_step_feeds(rt, batch, context, rng), context)[1]


def step_cases(rt, model, batches, contexts, prompt_len: int, rng: np.random.Generator):
    """The one-token step at each batch and context: eager `model.step`, the runtime's step as
    in a decode (advancing: the KV cache written in place) and from an earlier state (a branch:
    the cache copied first), the bare step graph."""
    for batch in batches:
        for context in contexts:
            feeds = _step_feeds(rt, batch, context, rng)
            tokens, state = split_feeds(feeds, context)
            t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
            names = [s.name for s in rt.specs["step"].state_inputs]
            layers = layers_of(model, [t[n] for n in names])
            eager = lambda ids=t[INPUT_IDS][:, 0], layers=layers, lengths=t[PAST_LENGTHS]: \
                model.step(ids, layers, lengths)  # noqa: E731
            fns = {"eager": eager, "ort": advancing_step(rt, tokens, state), "ort_branch": branch_step(rt, tokens, state),
                   "ort_session": bare_session(rt, "step", feeds)}
            yield Case(f"step: batch {batch}, context {context}",
                       {"batch": batch, "context": context, "state_bytes": state.nbytes}, fns)


def prefill_cases(rt, model, batches, contexts, rng: np.random.Generator, notes: list[str]):
    chunk = chunk_of(model.config, rt.manifest)
    return recurrent.prefill_cases(rt, model, batches, contexts, rng, scan=partial(ssd_grouped, chunk=chunk),
                                   lowering=f"chunked SSD, chunk {chunk}" if {"mamba2", "parallel", "zamba"} & set(
                                       model.config.layer_types) else "the references (no Mamba-2 layer to chunk)")


def extra_results(rt, model, contexts, rng: np.random.Generator, **timing) -> dict:
    """The state's bytes at each context (batch 1): the KV cache grows, the SSM state does not."""
    return {"state_bytes": {str(c): decode_state(rt, 1, c, rng).nbytes for c in contexts}}


def step_weight_bytes(model, dtype: str) -> int:
    """Bytes of weights one decode step reads (each shared tensor once): every layer, the final
    norm and lm_head; the embedding row is negligible. Of a mixture of experts, the k experts a
    token takes (k / E of the stacks: the floor; the `dense` form reads all E)."""
    params = {id(p): p for n, p in model.named_parameters() if not n.startswith("embed_tokens.")}
    params[id(model.lm_head.weight)] = model.lm_head.weight
    stacked = {id(p) for m in model.modules() if isinstance(m, Experts) for p in m.stacks}
    c = model.config
    elements = sum(p.numel() * (c.experts_per_token / c.n_experts if id(p) in stacked else 1)
                   for p in params.values())
    return int(elements) * np.dtype(NP_DTYPES[dtype]).itemsize
