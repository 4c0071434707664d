"""The eager Mamba-2 behind the runtime's step API (see `seqexport.families.recurrent.eager`):
`model.forward` with the per-token sequential SSD, `model.step`, the conv/SSM state."""

from seqexport.families.mamba2.runtime import Mamba2Steps
from seqexport.families.mamba2.specs import past_conv, past_ssm
from seqexport.families.recurrent.eager import RecurrentEager
from seqexport.models.mamba2 import ssd_sequential


def layer_state(i: int) -> tuple[str, str]:
    """Layer i's state inputs, in the order of the model's (conv, ssm) pair."""
    return past_conv(i), past_ssm(i)


class EagerMamba2(RecurrentEager, Mamba2Steps):
    layer_state = staticmethod(layer_state)
    reference_scan = staticmethod(ssd_sequential)


Eager = EagerMamba2
