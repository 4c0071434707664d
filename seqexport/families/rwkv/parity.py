"""What `validate` feeds an RWKV-7 export's graphs and decodes (see `seqexport.parity.checks`)."""

import numpy as np

from seqexport.export.scan.wkv_lowering import CHUNK
from seqexport.families.rwkv.eager import EagerRwkv
from seqexport.families.rwkv.export import wrapper


class Cases:
    start_id = None

    def __init__(self, model, rt, rng: np.random.Generator, batch: int, device="cpu"):
        self.model, self.rt, self.rng, self.batch, self.device = model, rt, rng, batch, device
        self.prompt_len = CHUNK + 5  # a prompt longer than one Scan chunk

    def graph_cases(self):
        """(graph, sizes, zero state): batch 1 and b, one token, several chunks, a long prompt."""
        b = self.batch
        for bs, n, zero in ((1, 1, True), (b, 7, False), (b, 37, False), (1, 256, False)):
            yield "prefill", dict(batch=bs, seq_len=n), zero
        for bs in (1, b):
            yield "step", dict(batch=bs), False

    def wrapper(self, graph: str):
        return wrapper(self.model, graph)

    def eager(self, cache: bool):
        return EagerRwkv(self.model, self.rt.tokenizer, cache=cache, device=self.device)

    def start_args(self) -> tuple:
        return (self.batch,)

    def prompts(self) -> list[list[int]]:
        v = self.model.config.vocab_size
        return [list(map(int, self.rng.integers(0, v, 3 + 2 * r))) for r in range(self.batch)]
