"""The date task framed for a hybrid LM (the bundled checkpoint): the framing of
`seqexport.families.recurrent.training`, this family's shape and schedule. Training runs the
chunked SSD in the Mamba-2 layers."""

from seqexport.families.mamba2 import training as mamba2
from seqexport.families.recurrent import training as lm
from seqexport.models.hybrid import HybridConfig

# ≈0.5M parameters: three Mamba-2 layers and one attention layer (GQA 4:2, RoPE), an MLP in each
CONFIG = HybridConfig(d_model=96, vocab_size=259, layer_types=["mamba2", "mamba2", "attention", "mamba2"],
                      d_ff=192, n_heads=4, n_kv_heads=2, head_dim=24, mamba_nheads=6, headdim=32, d_state=16,
                      chunk_size=16, tie_embeddings=True)
STEPS, LR = 1000, 2e-3
SEPARATOR, PROMPT, prompt_ids, make_batch = lm.SEPARATOR, lm.PROMPT, lm.prompt_ids, lm.make_batch
loss = mamba2.loss  # the chunked forward's cross-entropy (the hybrid's Mamba-2 layers are Mamba-2's)
