"""ONNX translation of the `seqexport::wkv7_chunked` custom op (see `wkv_lowering`), traced by
torch.onnx.export: the recurrence in closed form within each chunk of CHUNK tokens, and one
`Scan` over the chunks whose body is a single MatMul and Add over the state.

Dimension letters: b batch, l length, lp length padded to a multiple of CHUNK, c = lp / CHUNK
chunks, k = CHUNK tokens of a chunk, h heads, n head size (keys and values alike).

Within a chunk, per batch row and head, with S0 the state before it, γ_t = w_1 ⊙ … ⊙ w_t the
decay so far (γ_0 = 1) and u_t = S_{t-1}·a_t, the recurrence of `wkv7_ref` unrolls to

    S_t = (S0 + Σ_{s≤t} u_s·(b_s/γ_s)ᵀ + v_s·(k_s/γ_s)ᵀ)·diag(γ_t)

so, with the chunk's vectors as the rows of (k, n) matrices Ã = a⊙γ_{t-1}, B̃ = b/γ, K̃ = k/γ,
R̃ = r⊙γ, and strictly (L) or inclusively (M) lower-triangular (k, k) products of them:

    U  = (I - L(ÃB̃ᵀ))⁻¹ · (Ã·S0ᵀ + L(ÃK̃ᵀ)·V)                  (the u_t: a triangular system)
    Y  = R̃·S0ᵀ + M(R̃B̃ᵀ)·U + M(R̃K̃ᵀ)·V
    S_k = S0·diag(γ_k) + Uᵀ·(B̃⊙γ_k) + Vᵀ·(K̃⊙γ_k)

Every term but S0 is known before the scan, so all chunks' coefficients are computed at once
(batched GEMMs, no per-token node): S_k = S0·G + H and Yᵀ = S0·Qᵀ + Pᵀ, one MatMul of S0 by
[G | Qᵀ] (n, n + k) plus [H | Pᵀ] a chunk. The inverse of I - L (L nilpotent) is the product
(I + L)(I + L²)(I + L⁴)(I + L⁸) for k = 16. Dividing by γ is safe because RWKV-7 bounds every
decay below by e^-0.607 (models/rwkv.py): 1/γ ≤ e^(0.607·16) ≈ 1.6e4 within a chunk; and
float32 error is that of the sequential recurrence (tests/test_wkv_lowering.py).

Before, the body unrolled the chunk's 16 tokens (six nodes each, each a pass over the state):
ONNX Runtime's per-node cost made a short prompt's prefill cost about a batched step per token.
"""

import math

import numpy as np
import onnx_ir as ir
from onnxscript import FLOAT
from onnxscript import opset18 as op

from seqexport.export.ir_nodes import check_float32 as _check_float32
from seqexport.export.ir_nodes import emit as _emit
from seqexport.export.ir_nodes import subgraph as _subgraph
from seqexport.export.ir_nodes import typed_input as _input
from seqexport.families.rwkv.wkv_lowering import CHUNK

if CHUNK & (CHUNK - 1):
    raise ValueError(f"CHUNK must be a power of two (the inverse by doublings), got {CHUNK}")


def _chunk_body(n: int) -> ir.Graph:
    """Scan body: state S (b, h, n, n); a chunk's [G | Qᵀ] (b, h, n, n + k) and [H | Pᵀ]
    (b, h, n, n + k). Returns S·G + H (the state after the chunk) and S·Qᵀ + Pᵀ (its yᵀ,
    (b, h, n, k))."""
    s_in = _input(ir.DataType.FLOAT, [None, None, n, n])
    gq = _input(ir.DataType.FLOAT, [None, None, n, n + CHUNK])
    hp = _input(ir.DataType.FLOAT, [None, None, n, n + CHUNK])
    t = ir.tape.Tape()
    z = t.op("Add", [t.op("MatMul", [s_in, gq]), hp])  # (b, h, n, n + k)
    sizes = t.op("Constant", [], {"value": ir.tensor([n, CHUNK], dtype=ir.DataType.INT64)})
    s_out, y_t = t.op_multi_out("Split", [z, sizes], {"axis": -1}, num_outputs=2)
    return _subgraph("wkv", [s_in, gq, hp], [s_out, y_t], t)


def _t(x):
    """A 5-D value with its last two axes swapped."""
    return op.Transpose(x, perm=[0, 1, 2, 4, 3])


def wkv7_chunked(r: FLOAT, w: FLOAT, k: FLOAT, v: FLOAT, a: FLOAT, b: FLOAT, s0: FLOAT) -> tuple[FLOAT, FLOAT]:
    """seqexport::wkv7_chunked -> the chunks' coefficients, then one Scan over the chunks.

    Pads l up to a multiple of CHUNK with w = 1 and k = v = a = b = 0 (the state stays), then
    cuts y back to l.
    """
    _check_float32(r, w, k, v, a, b, s0)
    n = r.shape[3] if r.shape is not None else None
    if not isinstance(n, int):
        raise TypeError(f"the WKV lowering needs a static head size, got the shape {r.shape}")
    length = op.Shape(r, start=1, end=2)  # [l]
    pad = op.Mod(op.Sub(CHUNK, op.Mod(length, CHUNK)), CHUNK)  # [lp - l]
    pads = op.Concat(op.Constant(value_ints=[0, 0, 0, 0, 0]), pad, op.Constant(value_ints=[0, 0]), axis=0)
    heads = op.Shape(r, start=2)  # [h, n]
    to_chunks = op.Concat(op.Constant(value_ints=[0, -1, CHUNK]), heads, axis=0)

    def chunks(x, fill):  # (b, l, h, n) -> (b, c, h, k, n): a chunk's tokens as rows
        x = op.Reshape(op.Pad(x, pads, op.Constant(value_float=fill)), to_chunks)  # (b, c, k, h, n)
        return op.Transpose(x, perm=[0, 1, 3, 2, 4])

    r, w, k, v, a, b = (chunks(x, fill) for x, fill in ((r, 0.0), (w, 1.0), (k, 0.0), (v, 0.0), (a, 0.0), (b, 0.0)))
    log_w = op.Log(w)
    log_g = op.CumSum(log_w, op.Constant(value_int=3))  # (b, c, h, k, n): log γ_t, t inclusive
    gamma, inv_g = op.Exp(log_g), op.Exp(op.Neg(log_g))  # γ_t, 1/γ_t
    a_t = op.Mul(a, op.Exp(op.Sub(log_g, log_w)))  # Ã = a ⊙ γ_{t-1}
    r_t = op.Mul(r, gamma)  # R̃ = r ⊙ γ_t
    b_t, k_t = op.Mul(b, inv_g), op.Mul(k, inv_g)  # B̃, K̃
    g_end = op.Slice(gamma, [CHUNK - 1], [CHUNK], [3])  # (b, c, h, 1, n): γ_k

    # [Ã; R̃]·[B̃ᵀ | K̃ᵀ] (2k, 2k), masked: [L(ÃB̃ᵀ) | L(ÃK̃ᵀ)] over [M(R̃B̃ᵀ) | M(R̃K̃ᵀ)]
    strict, inclusive = np.tril(np.ones((CHUNK, CHUNK), np.float32), -1), np.tril(np.ones((CHUNK, CHUNK), np.float32))
    mask = np.block([[strict, strict], [inclusive, inclusive]])  # (2k, 2k)
    products = op.MatMul(op.Concat(a_t, r_t, axis=3), _t(op.Concat(b_t, k_t, axis=3)))  # (b, c, h, 2k, 2k)
    products = op.Mul(products, op.Constant(value=ir.tensor(mask)))
    top, bottom = op.Split(products, num_outputs=2, axis=3)  # (b, c, h, k, 2k) each
    l_ab, l_ak = op.Split(top, num_outputs=2, axis=4)  # (b, c, h, k, k) each
    m_rb, m_rk = op.Split(bottom, num_outputs=2, axis=4)

    # T = (I - L_ab)⁻¹ = (I + L)(I + L²)(I + L⁴)…: L_ab is strictly lower, so L^k = 0
    eye = op.Constant(value=ir.tensor(np.eye(CHUNK, dtype=np.float32)))
    inverse, power = op.Add(eye, l_ab), l_ab
    for _ in range(int(math.log2(CHUNK)) - 1):
        power = op.MatMul(power, power)
        inverse = op.MatMul(inverse, op.Add(eye, power))
    # U = T·Ã·S0ᵀ + W: TÃ (b, c, h, k, n) and W = T·L_ak·V (b, c, h, k, n)
    ta, w_u = op.Split(op.MatMul(inverse, op.Concat(a_t, op.MatMul(l_ak, v), axis=4)), num_outputs=2, axis=4)
    # Y = Q·S0ᵀ + P: Q = R̃ + M_rb·TÃ, P = M_rb·W + M_rk·V
    m_ta, m_w = op.Split(op.MatMul(m_rb, op.Concat(ta, w_u, axis=4)), num_outputs=2, axis=4)
    q = op.Add(r_t, m_ta)  # (b, c, h, k, n)
    p = op.Add(m_w, op.MatMul(m_rk, v))  # (b, c, h, k, n)
    # S_k = S0·G + H: G = diag(γ_k) + (TÃ)ᵀ·(B̃⊙γ_k), H = Wᵀ·(B̃⊙γ_k) + Vᵀ·(K̃⊙γ_k)
    b_end, k_end = op.Mul(b_t, g_end), op.Mul(k_t, g_end)
    eye_n = op.Constant(value=ir.tensor(np.eye(n, dtype=np.float32)))
    g = op.Add(op.Mul(_t(g_end), eye_n), op.MatMul(_t(ta), b_end))  # (b, c, h, n, n)
    h = op.MatMul(_t(op.Concat(w_u, v, axis=3)), op.Concat(b_end, k_end, axis=3))  # (b, c, h, n, n)

    s_last, y_t = _emit(
        "Scan",
        [s0, op.Concat(g, _t(q), axis=4), op.Concat(h, _t(p), axis=4)],  # (b, c, h, n, n + k) each
        {"body": _chunk_body(n), "num_scan_inputs": 2, "scan_input_axes": [1, 1], "scan_output_axes": [1]},
        num_outputs=2,
    )  # (b, h, n, n), (b, c, h, n, k)
    y = op.Transpose(y_t, perm=[0, 1, 4, 2, 3])  # (b, c, k, h, n)
    y = op.Reshape(y, op.Concat(op.Constant(value_ints=[0, -1]), heads, axis=0))  # (b, lp, h, n)
    return op.Slice(y, [0], length, [1]), s_last  # (b, l, h, n), (b, h, n, n)
