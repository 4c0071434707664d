"""What `validate` feeds a Mamba export's graphs and decodes (see
`seqexport.families.recurrent.parity`): an `unrolled` export's prefill has one fixed length."""

from seqexport.families.mamba.eager import EagerMamba
from seqexport.families.mamba.export import wrapper
from seqexport.families.recurrent.parity import RecurrentCases


class Cases(RecurrentCases):
    eager_class = EagerMamba
    export_wrapper = staticmethod(wrapper)

    @property
    def prompt_len(self) -> int:
        # a prompt longer than two scan chunks (8 steps each), or the unrolled graph's fixed length
        return self.rt.prefill_len or 21

    def prefill_shapes(self):
        fixed = self.rt.prefill_len
        return ((self.batch, fixed, True), (1, fixed, False)) if fixed else super().prefill_shapes()
