"""The RWKV-7 WKV recurrence as one ONNX `Scan`: the torch side (the ONNX side is `wkv_onnx`).

Dimension letters (as in models/rwkv.py): b batch, l sequence length, h heads, n head size.

`wkv7_chunked` is a custom op, drop-in for `models.rwkv.wkv7_ref` (same signature and result):
eagerly it runs the reference recurrence; its ONNX translation computes each chunk of CHUNK
tokens in closed form (batched GEMMs over all chunks at once) and carries the state across
chunks with ONE `Scan` node whose body is a MatMul and an Add (`wkv_onnx`), so the prefill
graph takes any batch and any length.

Usage: `model(..., scan=wkv7_chunked)` inside the exported forward, and
`torch.onnx.export(..., custom_translation_table=wkv_translation_table())` (from
`seqexport.families.rwkv.wkv`, which joins this torch side with its ONNX side).
"""

import torch
from torch import Tensor

from seqexport.models.rwkv import wkv7_ref

CHUNK = 16  # tokens per chunk (a power of two; 1/γ over a chunk stays ≤ e^(0.607·CHUNK))


@torch.library.custom_op("seqexport::wkv7_chunked", mutates_args=())
def wkv7_chunked(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
                 s0: Tensor) -> tuple[Tensor, Tensor]:
    """The WKV-7 recurrence (see `wkv7_ref`): exported as one ONNX Scan over chunks of CHUNK."""
    y, s = wkv7_ref(r, w, k, v, a, b, s0)
    return y, s.clone() if r.shape[1] == 0 else s  # a custom op may not return its input


@wkv7_chunked.register_fake
def _(r, w, k, v, a, b, s0):
    return torch.empty_like(r), torch.empty_like(s0)
