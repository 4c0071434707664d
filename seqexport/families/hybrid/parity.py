"""What `validate` feeds a hybrid export's graphs and decodes (see
`seqexport.families.recurrent.parity`): every graph case also gives the attention cache a past
(rows at different past_lengths), and the prompt spans more than one SSD chunk."""

from seqexport.families.hybrid.eager import EagerHybrid
from seqexport.families.hybrid.export import chunk_of, wrapper
from seqexport.families.recurrent.parity import RecurrentCases


class Cases(RecurrentCases):
    eager_class = EagerHybrid
    export_wrapper = staticmethod(wrapper)

    @property
    def prompt_len(self) -> int:
        return chunk_of(self.model.config, self.rt.manifest) + 5  # a prompt longer than one chunk

    def graph_cases(self):
        """(graph, sizes, zero state): prefills and steps over caches of 0 to 2 chunks' slots."""
        b, chunk = self.batch, chunk_of(self.model.config, self.rt.manifest)
        for bs, n, past, zero in ((1, 1, 0, True), (b, 7, 9, False), (b, 2 * chunk + 3, chunk + 5, False),
                                  (1, 256, 0, False)):
            yield "prefill", dict(batch=bs, seq_len=n, past_len=past), zero
        for bs, past in ((1, 3), (b, 2 * chunk + 1)):
            yield "step", dict(batch=bs, past_len=past), False
