"""`--ssd linear-attention`, the ONNX side: translations of the two custom ops of
`linear_attention` into ONNX Runtime's `com.microsoft` kernels, traced by torch.onnx.export.

onnx 1.23 also defines `LinearAttention` and `CausalConvWithState` as standard opset-27
functions, but onnxruntime 1.32's CPU runs the standard LinearAttention only through its
function body (a Scan over tokens); the `com.microsoft` ones (domain version 1) have native CPU
kernels. Their schemas (onnxruntime 1.32, `get_all_operator_schema`):

    LinearAttention(query (b, l, Hq·dk), key (b, l, Hkv·dk), value (b, l, Hkv·dv),
                    past_state (b, Hkv, dk, dv), decay (b, l, Hkv)) -> output (b, l, max(Hq, Hkv)·dv),
                    present_state (b, Hkv, dk, dv); q_num_heads, kv_num_heads, update_rule, scale, chunk_size
    CausalConvWithState(input (b, c, l), weight (c, 1, k), bias (c,), past_state (b, c, k - 1))
                    -> output (b, c, l), present_state (b, c, k - 1); activation

The SSD maps onto the gated rule with q = C, k = B, v = Δx, decay = ΔA, scale 1: with
Hkv = h heads and Hq = g groups ("inverse GQA": kv head i reads query head i // (h / g), the
group whose B and C it uses), so C goes in as it is and only B is repeated per head. The
kernel's state is (b, h, n, p): ours (b, h, p, n) is transposed in and out.
"""

from onnxscript import FLOAT
from onnxscript import opset18 as op

from seqexport.export.ir_nodes import emit_in

DOMAIN, VERSION = "com.microsoft", 1


def _emit_microsoft(op_type: str, inputs: list, attributes: dict, num_outputs: int) -> list:
    """Record a com.microsoft node (several outputs, which an onnxscript call cannot ask for)."""
    return emit_in(DOMAIN, VERSION, op_type, inputs, attributes, num_outputs)


def _static(value, axes: tuple[int, ...], what: str) -> list[int]:
    dims = [value.shape[a] if value.shape is not None else None for a in axes]
    if not all(isinstance(d, int) for d in dims):
        raise TypeError(f"the linear-attention SSD needs a static {what}, got the shape {value.shape}")
    return dims


def ssd_gated(x: FLOAT, dt: FLOAT, A: FLOAT, B: FLOAT, C: FLOAT, D: FLOAT, h0: FLOAT,
              chunk: int = 64) -> tuple[FLOAT, FLOAT]:
    """seqexport::mamba2_ssd_gated: x (b, l, h, p), dt (b, l, h), A (h,), B and C (b, l, g, n),
    D (h,), h0 (b, h, p, n) -> y (b, l, h, p), the final state (b, h, p, n)."""
    h, p = _static(x, (2, 3), "heads and head dim")
    g, n = _static(B, (2, 3), "groups and state size")
    value = op.Reshape(op.Mul(x, op.Unsqueeze(dt, [-1])), op.Constant(value_ints=[0, 0, h * p]))  # (b, l, h·p): Δx
    decay = op.Mul(dt, A)  # (b, l, h): ΔA, the log of the step's decay
    key = op.Expand(op.Unsqueeze(B, [3]), op.Constant(value_ints=[1, 1, 1, h // g, 1]))  # (b, l, g, h/g, n)
    key = op.Reshape(key, op.Constant(value_ints=[0, 0, h * n]))  # (b, l, h·n): head i has group i // (h/g)'s B
    query = op.Reshape(C, op.Constant(value_ints=[0, 0, g * n]))  # (b, l, g·n)
    past = op.Transpose(h0, perm=[0, 1, 3, 2])  # (b, h, n, p)
    y, state = _emit_microsoft("LinearAttention", [query, key, value, past, decay],
                               dict(q_num_heads=g, kv_num_heads=h, update_rule="gated", scale=1.0,
                                    chunk_size=chunk), 2)
    y = op.Reshape(y, op.Constant(value_ints=[0, 0, h, p]))  # (b, l, h, p)
    y = op.Add(y, op.Mul(op.Unsqueeze(D, [-1]), x))  # + D x
    return y, op.Transpose(state, perm=[0, 1, 3, 2])  # (b, h, p, n)


def conv_silu(x: FLOAT, weight: FLOAT, bias: FLOAT, past: FLOAT) -> FLOAT:
    """seqexport::mamba2_conv_silu: x (b, c, l), weight (c, 1, k), bias (c,), past (b, c, k - 1)
    -> SiLU(conv) (b, c, l)."""
    out, _ = _emit_microsoft("CausalConvWithState", [x, weight, bias, past], dict(activation="silu"), 2)
    return out


def conv_silu_state(x: FLOAT, weight: FLOAT, bias: FLOAT, past: FLOAT) -> tuple[FLOAT, FLOAT]:
    """seqexport::mamba2_conv_silu_state: `conv_silu` and the kernel's present state (b, c, k - 1)."""
    out, present = _emit_microsoft("CausalConvWithState", [x, weight, bias, past], dict(activation="silu"), 2)
    return out, present


def state_update(state: FLOAT, dx: FLOAT, B: FLOAT, log_decay: FLOAT) -> FLOAT:
    """seqexport::mamba2_state_update: state (b, h, p, n), dx (b, h, p, 1), B (b, g, 1, n),
    log_decay (b, 1, h) -> exp(log_decay) state + dx ⊗ B (b, h, p, n), one token's SSM update
    in the state's own layout. LinearAttention's gated rule with dk = p and dv = n is exactly
    that update (key = Δx, value = B, decay = ΔA, the state passed as it is): no Transposes.
    Its output (q·S, over p) is not the SSD's (S·C, over n) and is dropped; the query is the key."""
    h, p = _static(dx, (1, 2), "heads and head dim")
    g, n = _static(B, (1, 3), "groups and state size")
    key = op.Reshape(dx, op.Constant(value_ints=[0, 1, h * p]))  # (b, 1, h·p)
    value = op.Expand(B, op.Constant(value_ints=[1, 1, h // g, 1]))  # (b, g, h/g, n)
    value = op.Reshape(value, op.Constant(value_ints=[0, 1, h * n]))  # (b, 1, h·n): head i has group i // (h/g)'s B
    _, new_state = _emit_microsoft("LinearAttention", [key, key, value, state, log_decay],
                                   dict(q_num_heads=h, kv_num_heads=h, update_rule="gated", scale=1.0), 2)
    return new_state
