"""What `seqexport bench` times of a Mamba export (see `seqexport.families.recurrent.bench`):
the one-token step, and the prefill at each length, eager with the sequential reference scan
and with the export's own scan lowering run eagerly; an `unrolled` export's at its one length."""

from functools import partial

import numpy as np

from seqexport.families.mamba.eager import layer_state
from seqexport.families.mamba.scan import scan_for
from seqexport.families.recurrent import bench as recurrent
from seqexport.runtime.session import NP_DTYPES

# as every recurrent-state LM's
PROMPT_LEN, TABLE, check_contexts = recurrent.PROMPT_LEN, recurrent.TABLE, recurrent.check_contexts
decode_state, extra_results = recurrent.decode_state, recurrent.extra_results
generation_prompts = recurrent.generation_prompts
step_cases = partial(recurrent.step_cases, layer_state=layer_state)


def prefill_cases(rt, model, batches, contexts, rng: np.random.Generator, notes: list[str]):
    lowering = rt.manifest.get("export_options", {}).get("scan", "loop")
    lengths = contexts
    if rt.prefill_len is not None:
        lengths = (rt.prefill_len,)
        notes.append(f"unrolled export: prefill timed at its fixed length {rt.prefill_len} only")
    return recurrent.prefill_cases(rt, model, batches, lengths, rng, scan=scan_for(lowering), lowering=lowering)


def step_weight_bytes(model, dtype: str) -> int:
    """Bytes of weights one decode step reads (each shared tensor once): every layer, the final
    norm and lm_head (tied or not); the embedding row is negligible."""
    params = {id(p): p for n, p in model.named_parameters() if not n.startswith("backbone.embedding.")}
    params[id(model.lm_head.weight)] = model.lm_head.weight
    return sum(p.numel() for p in params.values()) * np.dtype(NP_DTYPES[dtype]).itemsize
