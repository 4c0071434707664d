"""The date task framed for an RWKV-7 LM (the bundled checkpoint): the framing of
`seqexport.families.recurrent.training`, this family's shape and schedule."""

from seqexport.families.recurrent import training as lm
from seqexport.models.rwkv import RwkvConfig

# ≈0.5M parameters: 2 layers of width 128 in 4 heads of 32
CONFIG = RwkvConfig(n_embd=128, n_layer=2, vocab_size=259, head_size=32)
STEPS, LR = 1500, 2e-3
SEPARATOR, PROMPT, prompt_ids, make_batch, loss = lm.SEPARATOR, lm.PROMPT, lm.prompt_ids, lm.make_batch, lm.loss
