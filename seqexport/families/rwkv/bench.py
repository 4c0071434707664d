"""What `seqexport bench` times of an RWKV-7 export (see `seqexport.families.recurrent.bench`):
the one-token step, and the prefill at each length, eager with the sequential reference
recurrence and with the export's custom op run eagerly, against the prefill graph's Scan."""

from functools import partial

import numpy as np

from seqexport.families.recurrent import bench as recurrent
from seqexport.families.rwkv.eager import layer_state
from seqexport.families.rwkv.wkv_lowering import wkv7_chunked
from seqexport.runtime.session import NP_DTYPES

# as every recurrent-state LM's
PROMPT_LEN, TABLE, check_contexts = recurrent.PROMPT_LEN, recurrent.TABLE, recurrent.check_contexts
decode_state, extra_results = recurrent.decode_state, recurrent.extra_results
generation_prompts = recurrent.generation_prompts
step_cases = partial(recurrent.step_cases, layer_state=layer_state)


def prefill_cases(rt, model, batches, contexts, rng: np.random.Generator, notes: list[str]):
    return recurrent.prefill_cases(rt, model, batches, contexts, rng, scan=wkv7_chunked, lowering="scan")


def step_weight_bytes(model, dtype: str) -> int:
    """Bytes of weights one decode step reads: every layer, ln_out and head; the embedding row
    is negligible."""
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("emb."))
    return n * np.dtype(NP_DTYPES[dtype]).itemsize
