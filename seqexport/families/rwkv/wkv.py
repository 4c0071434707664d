"""The RWKV-7 WKV recurrence in ONNX: the torch side (`wkv_lowering`) joined with its ONNX
translation (`wkv_onnx`) for `torch.onnx.export` (no import cycle between the two)."""

import torch

from seqexport.families.rwkv.wkv_lowering import CHUNK, wkv7_chunked

__all__ = ["CHUNK", "wkv7_chunked", "wkv_translation_table"]


def wkv_translation_table() -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for the RWKV-7 WKV Scan."""
    from seqexport.families.rwkv import wkv_onnx  # onnxscript only now

    return {torch.ops.seqexport.wkv7_chunked.default: wkv_onnx.wkv7_chunked}
