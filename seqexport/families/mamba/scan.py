"""The Mamba selective scan in ONNX: three lowerings (torch side in `scan_lowerings`, their
ONNX translations in `scan_onnx`). This module joins each pair for `torch.onnx.export`."""

import torch

from seqexport.families.mamba.scan_lowerings import CHUNK, LOWERINGS, check_lowering, scan_for

__all__ = ["CHUNK", "LOWERINGS", "custom_translation_table", "scan_for"]


def custom_translation_table(lowering: str | None) -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for a Mamba prefill with a
    lowering, or (None) for its step graph: the scan op, and softplus (Δ) in vectorised ops."""
    from seqexport.families.mamba import (
        scan_onnx as onnx_functions,  # onnxscript only when exporting
    )

    table = {torch.ops.aten.softplus.default: onnx_functions.softplus}
    if lowering is None:
        return table
    check_lowering(lowering)
    if lowering == "loop":
        table[torch.ops.seqexport.selective_scan_chunked.default] = onnx_functions.scan_chunked
    elif lowering == "parallel":
        table[torch.ops.seqexport.selective_scan_doubling.default] = onnx_functions.scan_doubling
    return table
