"""The date task framed for a Mamba LM (the bundled checkpoint): the framing of
`seqexport.families.recurrent.training`, this family's shape and schedule."""

from seqexport.families.recurrent import training as lm
from seqexport.models.mamba import MambaConfig

CONFIG = MambaConfig(d_model=128, n_layer=4, vocab_size=259, d_state=16)
STEPS, LR = 1000, 2e-3
SEPARATOR, PROMPT, prompt_ids, make_batch, loss = lm.SEPARATOR, lm.PROMPT, lm.prompt_ids, lm.make_batch, lm.loss
