"""The kernel form of the hybrid's experts, the ONNX side: `seqexport::hybrid_moe` as one ONNX
Runtime `com.microsoft.MoE` node (schema in onnxruntime 1.32's `get_all_operator_schema`):

    MoE(input (n, d), router_probs (n, E), fc1_experts_weights (E, 2 fe, d), fc1_experts_bias,
        fc2_experts_weights (E, d, fe)) -> output (n, d); k, activation_type, swiglu_fusion,
        normalize_routing_weights, activation_alpha, activation_beta

`router_probs` takes the router's logits: the kernel's softmax over all E then the top k,
renormalised (`normalize_routing_weights` 1), is the softmax over the top k logits, Granite's
rule; not renormalised (0), Jamba's. Its SwiGLU is g·sigmoid(α g)·(u + β): α 1, β 0 is SiLU(g)·u. The CPU kernel takes only
interleaved gate/up rows (`swiglu_fusion=1`), which `experts.interleaved` writes.
"""

from onnxscript import FLOAT

from seqexport.export.ir_nodes import emit_in

DOMAIN, VERSION = "com.microsoft", 1


def moe(x: FLOAT, logits: FLOAT, gate_up: FLOAT, down: FLOAT, k: int, normalize: bool) -> FLOAT:
    """seqexport::hybrid_moe: x (n, d), logits (n, E), gate_up (E, 2 fe, d) interleaved,
    down (E, d, fe) -> (n, d)."""
    (out,) = emit_in(DOMAIN, VERSION, "MoE", [x, logits, gate_up, None, down],
                     dict(k=k, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=int(normalize),
                          activation_alpha=1.0, activation_beta=0.0), 1)
    return out
