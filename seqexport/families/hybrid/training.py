"""The date task framed for a hybrid LM (the bundled checkpoint): the framing of
`seqexport.families.recurrent.training`, this family's shape and schedule. Training runs the
chunked SSD in the Mamba-2 layers."""

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from seqexport.families.recurrent import training as lm
from seqexport.models.hybrid import HybridConfig
from seqexport.models.mamba2 import ssd_chunked

# ≈0.5M parameters: three Mamba-2 layers and one attention layer (GQA 4:2, RoPE), an MLP in each
CONFIG = HybridConfig(d_model=96, vocab_size=259, layer_types=["mamba2", "mamba2", "attention", "mamba2"],
                      d_ff=192, n_heads=4, n_kv_heads=2, head_dim=24, mamba_nheads=6, headdim=32, d_state=16,
                      chunk_size=16, tie_embeddings=True)
STEPS, LR = 1000, 2e-3
SEPARATOR, PROMPT, prompt_ids, make_batch = lm.SEPARATOR, lm.PROMPT, lm.prompt_ids, lm.make_batch


def loss(model: nn.Module, batch: tuple[Tensor, Tensor], pad_id: int) -> Tensor:
    """Cross-entropy of the chunked forward against the targets (as `recurrent.training.loss`)."""
    ids, targets = batch
    logits, _ = model(ids, scan=partial(ssd_chunked, chunk=model.config.chunk_size))  # (b, t, v)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id)
