"""What `validate` feeds the transformer's graphs and decodes (see `seqexport.parity.checks`)."""

import numpy as np

from seqexport.families.transformer.eager import EagerTransformer
from seqexport.families.transformer.export import wrapper


class Cases:
    prompt_len = 1  # the first teacher-forced chunk: the start token

    def __init__(self, model, rt, rng: np.random.Generator, batch: int, device="cpu"):
        self.model, self.rt, self.rng, self.batch, self.device = model, rt, rng, batch, device
        self.config = model.config
        self.start_id = rt.start_token()
        # the artifact's decoder appends to a cache buffer (else: an older one that concatenates)
        self.appended = rt.specs["decoder"].lengths is not None
        # sources of unequal length: row r is 2r tokens shorter (padding masked)
        self._src = self._sources(self.batch, 9)

    def graph_cases(self):
        """(graph, sizes, zero state): batch 1, past_len 0, one token, a long past, several tokens."""
        b, long = self.batch, min(96, self.config.max_len - 1)
        for bs, s in ((1, 1), (b, 7), (1, long)):
            yield "encoder", dict(batch=bs, src_len=s), False
        # past_len: the cache's slots; rows then hold past_len, past_len - 3, ... valid ones
        for bs, s, past, t in ((1, 1, 0, 1), (b, 7, 5, 1), (b, 7, 0, 4), (b, 7, 6, 3), (b, 7, 11, 2),
                               (1, 9, long - 1, 1)):
            yield "decoder", dict(batch=bs, past_len=past, tgt_len=t, src_len=s), False

    def wrapper(self, graph: str):
        return wrapper(self.model, graph, appended=self.appended)

    def eager(self, cache: bool):
        return EagerTransformer(self.model, self.rt.tokenizer, cache=cache, device=self.device,
                                appended=self.appended)

    def _sources(self, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self.rng.integers(1, self.config.src_vocab_size, (batch, length))  # (b, s)
        mask = np.ones_like(ids)
        for r in range(1, batch):
            n = max(1, length - 2 * r)
            ids[r, n:], mask[r, n:] = self.config.pad_id, 0
        return ids, mask

    def start_args(self) -> tuple:
        return self._src

    def prompts(self) -> list[list[int]]:
        ids, mask = self._src
        return [list(map(int, r[m.astype(bool)])) for r, m in zip(ids, mask)]
