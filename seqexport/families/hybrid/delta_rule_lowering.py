"""The gated delta rule as a custom op: the torch side (the ONNX side is `delta_rule_onnx`;
`delta_rule` joins the two). Drop-in for `models.hybrid.gated_delta_ref` (same signature and
result): eagerly it runs the reference rule."""

import torch
from torch import Tensor

from seqexport.models.hybrid import gated_delta_ref

CHUNK = 16  # tokens per chunk (a power of two: the triangular inverse by blocks of doubling size)


@torch.library.custom_op("seqexport::gated_delta_chunked", mutates_args=())
def gated_delta_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s0: Tensor,
                        lower_bound: float | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule (see `gated_delta_ref`): exported as one ONNX Scan over chunks of CHUNK.
    `lower_bound`: the caller's promise that every g >= it (Ling 3's bounded decay), which lets
    the lowering factor per-channel decays out of the chunk's products (`delta_rule_onnx`)."""
    y, s = gated_delta_ref(q, k, v, g, beta, s0)
    return y, s.clone() if q.shape[1] == 0 else s  # a custom op may not return its input


@gated_delta_chunked.register_fake
def _(q, k, v, g, beta, s0, lower_bound=None):
    return torch.empty(v.shape, dtype=torch.float32), torch.empty(s0.shape, dtype=torch.float32)
