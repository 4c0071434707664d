"""The attention lowering an attention family's export takes (`--attention`): "matmul", the
scores, mask, softmax and product with V as separate nodes; or "fused", ONNX's own `Attention`
operator (opset 23: torch.onnx writes `scaled_dot_product_attention` as one node). Both give
graphs of one spec; docs/export.md has what each costs."""

from seqexport.errors import UsageError

ATTENTIONS = ("matmul", "fused")
FUSED_OPSET = 23  # the first opset with ONNX's Attention


def check_attention(attention: str, opset: int) -> int:
    """The opset an export with this attention is written at (fused: at least FUSED_OPSET)."""
    if attention not in ATTENTIONS:
        raise UsageError(f"attention: expected one of {list(ATTENTIONS)}, got {attention!r}")
    return max(opset, FUSED_OPSET) if attention == "fused" else opset
