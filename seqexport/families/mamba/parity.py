"""What `validate` feeds a Mamba export's graphs and decodes (see `seqexport.parity.checks`)."""

import numpy as np

from seqexport.families.mamba.eager import EagerMamba
from seqexport.families.mamba.export import wrapper


class Cases:
    start_id = None

    def __init__(self, model, rt, rng: np.random.Generator, batch: int, device="cpu"):
        self.model, self.rt, self.rng, self.batch, self.device = model, rt, rng, batch, device
        # a prompt longer than one scan chunk (16 steps), or the unrolled graph's fixed length
        self.prompt_len = rt.prefill_len or 21

    def graph_cases(self):
        """(graph, sizes, zero state): batch 1 and b, one token, several chunks, a long prompt."""
        b, fixed = self.batch, self.rt.prefill_len
        shapes = ((b, fixed, True), (1, fixed, False)) if fixed else \
            ((1, 1, True), (b, 7, False), (b, 37, False), (1, 256, False))
        for bs, n, zero in shapes:
            yield "prefill", dict(batch=bs, seq_len=n), zero
        for bs in (1, b):
            yield "step", dict(batch=bs), False

    def wrapper(self, graph: str):
        return wrapper(self.model, graph)

    def eager(self, cache: bool):
        return EagerMamba(self.model, self.rt.tokenizer, cache=cache, device=self.device)

    def start_args(self) -> tuple:
        return (self.batch,)

    def prompts(self) -> list[list[int]]:
        v = self.model.config.vocab_size
        return [list(map(int, self.rng.integers(0, v, 3 + 2 * r))) for r in range(self.batch)]
