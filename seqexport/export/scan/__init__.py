"""The Mamba selective scan in ONNX: three lowerings (torch side in `lowerings`, their ONNX
translations in `onnx_functions`), and the RWKV-7 WKV recurrence as a chunked Scan (torch side
in `wkv_lowering`, ONNX in `wkv_onnx`). This module joins each pair for `torch.onnx.export`."""

import torch

from seqexport.export.scan.lowerings import CHUNK, LOWERINGS, check_lowering, scan_for

__all__ = ["CHUNK", "LOWERINGS", "custom_translation_table", "scan_for", "wkv_translation_table"]


def custom_translation_table(lowering: str | None) -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for a Mamba prefill with a
    lowering, or (None) for its step graph: the scan op, and softplus (Δ) in vectorised ops."""
    from seqexport.export.scan import onnx_functions  # onnxscript only when exporting

    table = {torch.ops.aten.softplus.default: onnx_functions.softplus}
    if lowering is None:
        return table
    check_lowering(lowering)
    if lowering == "loop":
        table[torch.ops.seqexport.selective_scan_chunked.default] = onnx_functions.scan_chunked
    elif lowering == "parallel":
        table[torch.ops.seqexport.selective_scan_doubling.default] = onnx_functions.scan_doubling
    return table


def wkv_translation_table() -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for the RWKV-7 WKV Scan."""
    from seqexport.export.scan import wkv_lowering, wkv_onnx  # noqa: F401 (registers the op); onnxscript only now

    return {torch.ops.seqexport.wkv7_chunked.default: wkv_onnx.wkv7_chunked}
