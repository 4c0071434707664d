"""What `validate` feeds a Mamba-2 export's graphs and decodes (see
`seqexport.families.recurrent.parity`): the prompt spans more than one SSD chunk."""

from seqexport.families.mamba2.eager import EagerMamba2
from seqexport.families.mamba2.export import chunk_of, wrapper
from seqexport.families.recurrent.parity import RecurrentCases


class Cases(RecurrentCases):
    eager_class = EagerMamba2
    export_wrapper = staticmethod(wrapper)

    @property
    def prompt_len(self) -> int:
        return chunk_of(self.model.config, self.rt.manifest) + 5  # a prompt longer than one chunk

    def prefill_shapes(self):
        b, chunk = self.batch, chunk_of(self.model.config, self.rt.manifest)
        return (1, 1, True), (b, 7, False), (b, 2 * chunk + 3, False), (1, 256, False)
