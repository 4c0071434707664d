"""What `seqexport bench` times of a Mamba-2 export (see `seqexport.families.recurrent.bench`):
the one-token step, and the prefill at each length, eager with the per-token sequential SSD and
with the chunked SSD the export traces, against the prefill graph."""

from functools import partial

import numpy as np

from seqexport.families.mamba2.eager import layer_state
from seqexport.families.mamba2.export import chunk_of
from seqexport.families.mamba2.ssd import ssd_grouped
from seqexport.families.recurrent import bench as recurrent
from seqexport.runtime.session import NP_DTYPES

# as every recurrent-state LM's
PROMPT_LEN, TABLE, check_contexts = recurrent.PROMPT_LEN, recurrent.TABLE, recurrent.check_contexts
decode_state, extra_results = recurrent.decode_state, recurrent.extra_results
generation_prompts = recurrent.generation_prompts
step_cases = partial(recurrent.step_cases, layer_state=layer_state)


def prefill_cases(rt, model, batches, contexts, rng: np.random.Generator, notes: list[str]):
    chunk = chunk_of(model.config, rt.manifest)
    return recurrent.prefill_cases(rt, model, batches, contexts, rng, scan=partial(ssd_grouped, chunk=chunk),
                                   lowering=f"chunked SSD, chunk {chunk}")


def step_weight_bytes(model, dtype: str) -> int:
    """Bytes of weights one decode step reads (each shared tensor once): every layer, the final
    norm and lm_head (tied or not); the embedding row is negligible."""
    params = {id(p): p for n, p in model.named_parameters() if not n.startswith("backbone.embedding.")}
    params[id(model.lm_head.weight)] = model.lm_head.weight
    return sum(p.numel() for p in params.values()) * np.dtype(NP_DTYPES[dtype]).itemsize
