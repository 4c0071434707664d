"""What `validate` feeds an RWKV-7 export's graphs and decodes (see
`seqexport.families.recurrent.parity`)."""

from seqexport.families.recurrent.parity import RecurrentCases
from seqexport.families.rwkv.eager import EagerRwkv
from seqexport.families.rwkv.export import wrapper
from seqexport.families.rwkv.wkv_lowering import CHUNK


class Cases(RecurrentCases):
    eager_class = EagerRwkv
    export_wrapper = staticmethod(wrapper)
    prompt_len = CHUNK + 5  # a prompt longer than one Scan chunk
