"""What `validate` feeds a recurrent-state LM's graphs and decodes (see
`seqexport.parity.checks`). A family's `Cases` names its eager class and export wrapper, and
the prompt length that spans more than one chunk of its prefill's scan."""

from collections.abc import Callable

import numpy as np


class RecurrentCases:
    start_id = None
    eager_class: type  # the family's eager model (a `RecurrentEager`)
    export_wrapper: Callable  # (model, graph) -> the module the graph is traced from
    prompt_len: int  # teacher-forced prompt: longer than one chunk of the prefill's scan

    def __init__(self, model, rt, rng: np.random.Generator, batch: int, device="cpu"):
        self.model, self.rt, self.rng, self.batch, self.device = model, rt, rng, batch, device

    def prefill_shapes(self) -> tuple[tuple[int, int, bool], ...]:
        """(batch, tokens, zero state): batch 1 and b, one token, several chunks, a long prompt."""
        b = self.batch
        return (1, 1, True), (b, 7, False), (b, 37, False), (1, 256, False)

    def graph_cases(self):
        """(graph, sizes, zero state): the prefill shapes, then one step at batch 1 and b."""
        for bs, n, zero in self.prefill_shapes():
            yield "prefill", dict(batch=bs, seq_len=n), zero
        for bs in (1, self.batch):
            yield "step", dict(batch=bs), False

    def wrapper(self, graph: str):
        return self.export_wrapper(self.model, graph)

    def eager(self, cache: bool):
        return self.eager_class(self.model, self.rt.tokenizer, cache=cache, device=self.device)

    def start_args(self) -> tuple:
        return (self.batch,)

    def prompts(self) -> list[list[int]]:
        v = self.model.config.vocab_size
        return [list(map(int, self.rng.integers(0, v, 3 + 2 * r))) for r in range(self.batch)]
