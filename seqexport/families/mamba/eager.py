"""The eager Mamba behind the runtime's step API (see `seqexport.families.recurrent.eager`):
`model.forward` with the sequential reference scan, `model.step`, the conv/SSM state."""

from seqexport.families.mamba.runtime import MambaSteps
from seqexport.families.mamba.specs import past_conv, past_ssm
from seqexport.families.recurrent.eager import RecurrentEager
from seqexport.models.mamba import selective_scan_ref


def layer_state(i: int) -> tuple[str, str]:
    """Layer i's state inputs, in the order of the model's (conv, ssm) pair."""
    return past_conv(i), past_ssm(i)


class EagerMamba(RecurrentEager, MambaSteps):
    layer_state = staticmethod(layer_state)
    reference_scan = staticmethod(selective_scan_ref)


Eager = EagerMamba
