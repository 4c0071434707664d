"""The gated delta rule (Qwen3.5's Gated DeltaNet) in a prefill graph: a custom op, drop-in for
`models.hybrid.gated_delta_ref` (same signature and result), whose ONNX translation
(`delta_rule_onnx`) computes each chunk of CHUNK tokens in closed form, every chunk at once, and
carries the state across chunks with one `Scan` whose body is a MatMul and an Add.

Usage: `model(..., delta_rule=gated_delta_chunked)` inside the exported forward, and
`torch.onnx.export(..., custom_translation_table=translation_table())`.
"""

import torch

from seqexport.families.hybrid.delta_rule_lowering import CHUNK, gated_delta_chunked

__all__ = ["CHUNK", "gated_delta_chunked", "translation_table"]


def translation_table() -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for the gated delta rule."""
    from seqexport.families.hybrid import delta_rule_onnx  # onnxscript only now

    return {torch.ops.seqexport.gated_delta_chunked.default: delta_rule_onnx.gated_delta_chunked}
