"""The eager RWKV-7 behind the runtime's step API (see `seqexport.families.recurrent.eager`):
`model.forward` with the sequential reference recurrence, `model.step`, the token-shift/WKV
state."""

from seqexport.families.recurrent.eager import RecurrentEager
from seqexport.families.rwkv.runtime import RwkvSteps
from seqexport.families.rwkv.specs import KINDS, past
from seqexport.models.rwkv import wkv7_ref


def layer_state(i: int) -> tuple[str, ...]:
    """Layer i's state inputs, in the order of the model's LayerState."""
    return tuple(past(kind, i) for kind in KINDS)


class EagerRwkv(RecurrentEager, RwkvSteps):
    layer_state = staticmethod(layer_state)
    reference_scan = staticmethod(wkv7_ref)


Eager = EagerRwkv
