"""The date task framed for a Mamba-2 LM (the bundled checkpoint): the framing of
`seqexport.families.recurrent.training`, this family's shape and schedule. Training runs the
chunked SSD (a few matrix products a layer instead of a Python loop over tokens)."""

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from seqexport.families.recurrent import training as lm
from seqexport.models.mamba2 import Mamba2Config, ssd_chunked

# ≈0.4M parameters: 4 layers of width 128, heads of 32, state 16, chunks of 16
CONFIG = Mamba2Config(d_model=128, n_layer=4, vocab_size=259, d_state=16, headdim=32, chunk_size=16)
STEPS, LR = 1000, 2e-3
SEPARATOR, PROMPT, prompt_ids, make_batch = lm.SEPARATOR, lm.PROMPT, lm.prompt_ids, lm.make_batch


def loss(model: nn.Module, batch: tuple[Tensor, Tensor], pad_id: int) -> Tensor:
    """Cross-entropy of the chunked forward against the targets (as `recurrent.training.loss`)."""
    ids, targets = batch
    logits, _ = model(ids, scan=partial(ssd_chunked, chunk=model.config.chunk_size))  # (b, t, v)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id)
