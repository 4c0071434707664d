"""The Mamba selective scan in ONNX: three lowerings (torch side in `lowerings`, their ONNX
translations in `onnx_functions`). This module joins the two for `torch.onnx.export`."""

import torch

from seqexport.export.scan.lowerings import CHUNK, LOWERINGS, check_lowering, scan_for

__all__ = ["CHUNK", "LOWERINGS", "custom_translation_table", "scan_for"]


def custom_translation_table(lowering: str) -> dict | None:
    """What `torch.onnx.export(custom_translation_table=...)` needs for a lowering, or None."""
    check_lowering(lowering)
    if lowering == "unrolled":
        return None
    from seqexport.export.scan import onnx_functions  # onnxscript only when exporting

    if lowering == "loop":
        return {torch.ops.seqexport.selective_scan_chunked.default: onnx_functions.scan_chunked}
    return {torch.ops.seqexport.selective_scan_doubling.default: onnx_functions.scan_doubling}
