"""The gated delta rule (Qwen3.5's Gated DeltaNet) in a prefill graph: a custom op, drop-in for
`models.hybrid.gated_delta_ref` (same signature and result), whose ONNX translation
(`delta_rule_onnx`) computes each chunk of CHUNK tokens in closed form, every chunk at once, and
carries the state across chunks with one `Scan` whose body is a MatMul and an Add.

Usage: `model(..., delta_rule=gated_delta_chunked)` inside the exported forward, and
`torch.onnx.export(..., custom_translation_table=translation_table())`.
"""

import torch
from torch import Tensor

from seqexport.models.hybrid import gated_delta_ref

CHUNK = 16  # tokens per chunk (a power of two: the triangular inverse by doublings)

__all__ = ["CHUNK", "gated_delta_chunked", "translation_table"]


@torch.library.custom_op("seqexport::gated_delta_chunked", mutates_args=())
def gated_delta_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """The gated delta rule (see `gated_delta_ref`): exported as one ONNX Scan over chunks of CHUNK."""
    y, s = gated_delta_ref(q, k, v, g, beta, s0)
    return y, s.clone() if q.shape[1] == 0 else s  # a custom op may not return its input


@gated_delta_chunked.register_fake
def _(q, k, v, g, beta, s0):
    return torch.empty(v.shape, dtype=torch.float32), torch.empty(s0.shape, dtype=torch.float32)


def translation_table() -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for the gated delta rule."""
    from seqexport.families.hybrid import delta_rule_onnx  # onnxscript only now

    return {torch.ops.seqexport.gated_delta_chunked.default: delta_rule_onnx.gated_delta_chunked}
