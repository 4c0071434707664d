"""ONNX translation of `seqexport::gated_delta_chunked` (see `delta_rule_lowering`): the gated delta rule
in closed form within each chunk of CHUNK tokens, and one `Scan` over the chunks whose body is a
single MatMul and Add over the state.

Dimension letters: b batch, l length, lp l padded to a multiple of CHUNK, c = lp / CHUNK chunks,
C = CHUNK tokens of a chunk, h value heads, dk / dv key / value head sizes.

Per row and head the state S (dk, dv) follows, token by token (`models.hybrid.delta_rule_step`),
S_t = e^{g_t} S_{t-1} + k_t (β_t (v_t - e^{g_t} S_{t-1}ᵀ k_t))ᵀ, y_t = S_tᵀ q_t. Within a chunk,
with G_t = g_1 + … + g_t (log decay so far), D_ij = e^{G_i - G_j} for i >= j and 0 above, and the
chunk's vectors as the rows of (C, .) matrices (transformers' and FLA's chunked form, the WY
representation of the products of Householder-like factors):

    L = strict_lower((βk)·kᵀ ⊙ D),  T = (I + L)⁻¹
    U = T·(βv),  W = T·(βk ⊙ e^G),  A = (q·kᵀ) ⊙ D (diagonal included)
    Y    = (q ⊙ e^G)·S0 + A·(U - W·S0)
    S_C  = e^{G_C} S0 + (k ⊙ e^{G_C - G})ᵀ·(U - W·S0)

so S_C = Gm·S0 + Hm and Y = Qm·S0 + Pm, with every term but S0 known before the scan: all
chunks' coefficients are computed at once (batched GEMMs), and the scan body is one MatMul of
[Gm; Qm] by S0 plus [Hm; Pm].

The decays are taken out of the products before they are formed. With E = diag(e^G), L = E·L'·E⁻¹
where L' = strict_lower((βk)·kᵀ) has no decay, so T = T' ⊙ D with T' = (I + L')⁻¹, A = A' ⊙ D with
A' = lower(q·kᵀ), and W = e^G ⊙ W' with W' = T'·(βk); then

    Gm = e^{G_C} (I - kᵀ·W'),  Qm = e^G ⊙ (q - A'·W')                (rows scaled)
    Hm = (kᵀ·T' ⊙ e^{G_C - G})·(βv),  Pm = (A'·T' ⊙ D)·(βv)           (columns decayed)

Every product of the chunk is of undecayed terms (order 1), and each decay, an exponential of at
most 0, multiplies once: no product of two small decays is ever formed. Such products (e^-50
times e^-50) are subnormal floats, which Intel's cores multiply many times slower: with T and W
built with the decays inside, Qwen3.5-0.8B's Scans (fed with them) took 4.3 ms a chunk for a
MatMul that takes 0.3 ms alone (tests/test_delta_rule_lowering.py checks that no tensor holds
one). No decay is ever divided by (e^{G_C - G} and D are exponentials of differences), so a
decay near 0 is safe. T' is inverted by blocks (`_unit_lower_inverse`). Padding (to lp) has
g = 0 and β = 0: the state passes through unchanged.
"""

import math

import numpy as np
import onnx_ir as ir
from onnxscript import FLOAT
from onnxscript import opset18 as op

from seqexport.export.ir_nodes import check_float32, emit, subgraph, typed_input
from seqexport.families.hybrid.delta_rule_lowering import CHUNK

FLUSH_BELOW = -40.0  # a log decay below this is e^x = 0 (see `_exp`)
# the widest log-decay span across a chunk the factored per-channel form takes: its largest
# factor product, e^{span} (above the diagonal, masked), times dk terms stays a float32
FACTORED_SPAN = 80.0

if CHUNK & (CHUNK - 1):
    raise ValueError(f"CHUNK must be a power of two (the inverse by blocks of doubling size), got {CHUNK}")


def _chunk_body(dk: int, dv: int) -> ir.Graph:
    """Scan body: state S (b, h, dk, dv); a chunk's [Gm; Qm] (b, h, dk + C, dk) and [Hm; Pm]
    (b, h, dk + C, dv). Returns Gm·S + Hm (the state after the chunk) and Qm·S + Pm (its y, (b, h, C, dv))."""
    s_in = typed_input(ir.DataType.FLOAT, [None, None, dk, dv])
    gq = typed_input(ir.DataType.FLOAT, [None, None, dk + CHUNK, dk])
    hp = typed_input(ir.DataType.FLOAT, [None, None, dk + CHUNK, dv])
    t = ir.tape.Tape()
    z = t.op("Add", [t.op("MatMul", [gq, s_in]), hp])  # (b, h, dk + C, dv)
    sizes = t.op("Constant", [], {"value": ir.tensor([dk, CHUNK], dtype=ir.DataType.INT64)})
    s_out, y = t.op_multi_out("Split", [z, sizes], {"axis": 2}, num_outputs=2)
    return subgraph("delta_rule", [s_in, gq, hp], [s_out, y], t)


def _t(x):
    """A 5-D value with its last two axes swapped."""
    return op.Transpose(x, perm=[0, 1, 2, 4, 3])


def _diagonal_blocks(x, size: int):
    """x (c, b, h, C, C) -> its C / size diagonal blocks (c, b, h, C / size, size, size)."""
    n = CHUNK // size
    x = op.Reshape(x, op.Constant(value_ints=[0, 0, 0, n, size, n, size]))  # (c, b, h, n, size, n, size)
    on_diagonal = np.eye(n, dtype=np.float32).reshape(n, 1, n, 1)
    return op.ReduceSum(op.Mul(x, op.Constant(value=ir.tensor(on_diagonal))), op.Constant(value_ints=[5]),
                        keepdims=0)


def _unit_lower_inverse(l_mat):
    """(I + L)⁻¹ of a strictly lower-triangular L (c, b, h, C, C), by blocks: the inverses of
    the diagonal blocks of size m give those of size 2m as [[Tₐ, 0], [-T_d·L₂₁·Tₐ, T_d]],
    from m = 1 (each 1) to m = C, every block of a level in one product. Backward stable like
    forward substitution (a Neumann product (I - L)(I + L²)… is not: where a chunk's keys
    repeat, L's powers grow to binomial sizes and cancel)."""
    # the 1 x 1 blocks' inverses, 1 each, shaped as L's blocks (c, b, h, C, 1, 1): L's diagonal (0) + 1
    inverse = op.Add(_diagonal_blocks(l_mat, 1), op.Constant(value_float=1.0))
    size = 1
    while size < CHUNK:
        n = CHUNK // (2 * size)
        lower_left = op.Slice(_diagonal_blocks(l_mat, 2 * size), [size, 0], [2 * size, size], [4, 5])  # (…, n, m, m)
        pairs = op.Reshape(inverse, op.Constant(value_ints=[0, 0, 0, n, 2, size, size]))  # (…, n, 2, m, m)
        first = op.Squeeze(op.Slice(pairs, [0], [1], [4]), [4])  # Tₐ (…, n, m, m)
        second = op.Squeeze(op.Slice(pairs, [1], [2], [4]), [4])  # T_d
        below = op.Neg(op.MatMul(op.MatMul(second, lower_left), first))  # (…, n, m, m)
        inverse = op.Concat(op.Concat(first, op.Mul(first, op.Constant(value_float=0.0)), axis=5),
                            op.Concat(below, second, axis=5), axis=4)  # (…, n, 2m, 2m)
        size *= 2
    return op.Reshape(inverse, op.Constant(value_ints=[0, 0, 0, CHUNK, CHUNK]))  # (c, b, h, C, C)


def _exp(x):
    """e^x, exactly 0 where x < FLUSH_BELOW: a decay of e^-40 (4e-18) or less is nothing beside
    the terms of order 1 it is summed with (float32 keeps 7 digits), and its product with a term
    of order 1e-21 would be a subnormal float (below 1.2e-38), which x86 multiplies many times
    slower."""
    return op.Exp(op.Where(op.Less(x, op.Constant(value_float=FLUSH_BELOW)), op.Constant(value_float=-math.inf), x))


def _split(x, first: int, axis: int):
    """x cut along `axis` into its first `first` entries and the rest (two Slices: onnxscript's
    Split needs its output count, which a sizes input does not give it)."""
    return op.Slice(x, [0], [first], [axis]), op.Slice(x, [first], [2 ** 62], [axis])


def _static(value: FLOAT, axis: int, what: str) -> int:
    n = value.shape[axis] if value.shape is not None else None
    if not isinstance(n, int):
        raise TypeError(f"the gated delta rule's lowering needs a static {what}, got the shape {value.shape}")
    return n


def gated_delta_chunked(q: FLOAT, k: FLOAT, v: FLOAT, g: FLOAT, beta: FLOAT, s0: FLOAT,
                        lower_bound: float | None = None) -> tuple[FLOAT, FLOAT]:
    """seqexport::gated_delta_chunked -> the chunks' coefficients, then one Scan over the chunks.
    `lower_bound` (every g >= it): per-channel decays bounded within FACTORED_SPAN over a chunk
    take the factored form (`_per_channel`)."""
    check_float32(q, k, v, g, beta, s0)
    dk, dv = _static(q, 3, "key head size"), _static(v, 3, "value head size")
    length = op.Shape(q, start=1, end=2)  # [l]
    pad = op.Mod(op.Sub(CHUNK, op.Mod(length, CHUNK)), CHUNK)  # [lp - l]
    zero = op.Constant(value_ints=[0])
    heads = op.Shape(q, start=2, end=3)  # [h]

    # chunk-major from the start: the Scan runs over axis 0, and every batched product below
    # takes (c, b, h) as its batch axes alike (no transpose of the coefficients before the Scan)
    def chunks(x, n: int | None = None):  # (b, l, h[, n]) -> (c, b, h, C[, n]): a chunk's tokens as rows
        rank = 3 if n is None else 4
        pads = op.Concat(op.Constant(value_ints=[0] * (rank + 1)), pad, op.Constant(value_ints=[0] * (rank - 2)),
                         axis=0)  # nothing before; lp - l after the tokens
        shape = op.Concat(op.Constant(value_ints=[0, -1, CHUNK]), heads,
                          *([] if n is None else [op.Constant(value_ints=[n])]), axis=0)
        x = op.Reshape(op.Pad(x, pads, op.Constant(value_float=0.0)), shape)  # (b, c, C, h[, n])
        return op.Transpose(x, perm=[1, 0, 3, 2] if n is None else [1, 0, 3, 2, 4])

    per_channel = g.shape is not None and len(g.shape) == 4  # Kimi's KDA: (b, l, h, dk)
    q, k, v = chunks(q, dk), chunks(k, dk), chunks(v, dv)  # (c, b, h, C, dk | dv)
    g, beta = chunks(g, dk if per_channel else None), chunks(beta)  # (c, b, h, C[, dk]), (c, b, h, C)
    if per_channel:
        factored = lower_bound is not None and -lower_bound * (CHUNK - 1) <= FACTORED_SPAN
        g_q, h_p = _per_channel(q, k, v, g, beta, dk, factored)
    else:
        g_q, h_p = _per_head(q, k, v, g, beta, dk)
    s_last, y = emit(
        "Scan",
        [s0, g_q, h_p],  # (c, b, h, dk + C, dk | dv)
        {"body": _chunk_body(dk, dv), "num_scan_inputs": 2},
        num_outputs=2,
    )  # (b, h, dk, dv), (c, b, h, C, dv)
    y = op.Transpose(y, perm=[1, 0, 3, 2, 4])  # (b, c, C, h, dv)
    y = op.Reshape(y, op.Concat(op.Constant(value_ints=[0, -1]), heads, op.Constant(value_ints=[dv]), axis=0))
    return op.Slice(y, zero, length, op.Constant(value_ints=[1])), s_last  # (b, l, h, dv), (b, h, dk, dv)


def _per_head(q, k, v, g, beta, dk: int):
    """A chunk's [Gm; Qm] (c, b, h, dk + C, dk) and [Hm; Pm] (c, b, h, dk + C, dv) from q, k
    (c, b, h, C, dk), v (…, dv), g and beta (c, b, h, C): one decay per head and token."""
    # the decays, each an exponential of at most 0 taken once (see the module's docstring)
    cum = op.CumSum(g, op.Constant(value_int=3))  # (c, b, h, C): G_t, t inclusive
    last = op.Slice(cum, [CHUNK - 1], [CHUNK], [3])  # (c, b, h, 1): G_C
    lower = np.tril(np.ones((CHUNK, CHUNK), bool))
    diff = op.Sub(op.Unsqueeze(cum, [4]), op.Unsqueeze(cum, [3]))  # (c, b, h, C, C): G_i - G_j
    decay = _exp(op.Where(op.Constant(value=ir.tensor(lower)), diff,
                          op.Constant(value_float=-math.inf)))  # D: 0 above the diagonal
    to_end = op.Unsqueeze(_exp(op.Sub(last, cum)), [3])  # (c, b, h, 1, C): e^{G_C - G_j}
    rows = op.Concat(op.Expand(_exp(last), op.Constant(value_ints=[1, 1, 1, dk])), _exp(cum),
                     axis=3)  # (c, b, h, dk + C): e^{G_C} for Gm's rows, e^{G_t} for Qm's

    # the undecayed products: T' = (I + L')⁻¹, A', W' = T'·βk, and [kᵀ; A']·[W' | T']
    k_beta = op.Mul(k, op.Unsqueeze(beta, [4]))  # (c, b, h, C, dk)
    strict = op.Constant(value=ir.tensor(np.tril(np.ones((CHUNK, CHUNK), np.float32), -1)))
    t_prime = _unit_lower_inverse(op.Mul(op.MatMul(k_beta, _t(k)), strict))  # (c, b, h, C, C)
    a_prime = op.Mul(op.MatMul(q, _t(k)), op.Constant(value=ir.tensor(lower.astype(np.float32))))  # (…, C, C)
    w_prime = op.MatMul(t_prime, k_beta)  # (c, b, h, C, dk)
    products = op.MatMul(op.Concat(_t(k), a_prime, axis=3),
                         op.Concat(w_prime, t_prime, axis=4))  # (c, b, h, dk + C, dk + C)
    with_w, with_t = _split(products, dk, axis=4)  # [kᵀW'; A'W'] (…, dk + C, dk), [kᵀT'; A'T'] (…, dk + C, C)

    # [Gm; Qm] = rows ⊙ ([I; q] - [kᵀW'; A'W']);  [Hm; Pm] = ([kᵀT' ⊙ e^{G_C - G}; A'T' ⊙ D])·(βv)
    eye_over_q = op.Add(op.Pad(q, op.Constant(value_ints=[0, 0, 0, dk, 0] + [0] * 5)),
                        op.Constant(value=ir.tensor(np.eye(dk + CHUNK, dk, dtype=np.float32))))  # [I; q]
    g_q = op.Mul(op.Sub(eye_over_q, with_w), op.Unsqueeze(rows, [4]))  # (c, b, h, dk + C, dk)
    decays = op.Concat(op.Expand(to_end, op.Constant(value_ints=[1, 1, 1, dk, 1])), decay,
                       axis=3)  # (c, b, h, dk + C, C)
    h_p = op.MatMul(op.Mul(with_t, decays), op.Mul(v, op.Unsqueeze(beta, [4])))  # (c, b, h, dk + C, dv)
    return g_q, h_p


def _per_channel(q, k, v, g, beta, dk: int, factored: bool = False):
    """`_per_head`'s [Gm; Qm] and [Hm; Pm] where g (c, b, h, C, dk) decays each key channel on
    its own (Kimi's KDA: row a of S times e^{g_a}). The decays no longer factor out of a
    product of keys, so they are taken inside it, per channel, as transformers' chunked KDA
    does: with G the cumulative log decays (C, dk) and D_ija = e^{G_ia - G_ja} (i >= j, else 0),

        L = strict_lower(Σ_a (βk)_ia k_ja D_ija),  T = (I + L)⁻¹,  A = lower(Σ_a q_ia k_ja D_ija)
        W = T·(βk ⊙ e^G),  U = T·(βv),  K = k ⊙ e^{G_C - G}
        Gm = diag(e^{G_C}) - Kᵀ·W,  Hm = Kᵀ·U,  Qm = q ⊙ e^G - A·W,  Pm = A·U

    (so S_C = Gm·S0 + Hm and Y = Qm·S0 + Pm, as in the module's docstring). Every exponential is
    of a difference of at most 0; the (C, C, dk) terms of L and A are summed over a, (c, b, h,
    C, C, dk) at once: C times the keys' size, C = 16.

    `factored` (the caller bounds every g, so that G spans at most FACTORED_SPAN over a chunk:
    Ling 3's g > -5): D_ija = e^{G_ia - R_a} e^{R_a - G_ja}, R the chunk's middle token's G, and
    L and A become plain products, strict_lower((βk ⊙ e^{G - R})·(k ⊙ e^{R - G})ᵀ) (FLA's form).
    Each factor lies within e^{±span/2}; their products above the diagonal, up to e^{span},
    are masked."""
    cum = op.CumSum(g, op.Constant(value_int=3))  # (c, b, h, C, dk): G_t, t inclusive
    last = op.Slice(cum, [CHUNK - 1], [CHUNK], [3])  # (c, b, h, 1, dk): G_C
    diff = op.Sub(op.Unsqueeze(cum, [4]), op.Unsqueeze(cum, [3]))  # (c, b, h, C, C, dk): G_i - G_j
    lower = np.tril(np.ones((CHUNK, CHUNK), bool))[:, :, None]  # (C, C, 1): i >= j
    decay = _exp(op.Where(op.Constant(value=ir.tensor(lower)), diff, op.Constant(value_float=-math.inf)))  # D

    def summed(x, y):  # x, y (c, b, h, C, dk) -> Σ_a x_ia y_ja D_ija (c, b, h, C, C)
        return op.ReduceSum(op.Mul(op.Mul(op.Unsqueeze(x, [4]), op.Unsqueeze(y, [3])), decay),
                            op.Constant(value_ints=[5]), keepdims=0)

    k_beta = op.Mul(k, op.Unsqueeze(beta, [4]))  # (c, b, h, C, dk)
    strict = op.Constant(value=ir.tensor(np.tril(np.ones((CHUNK, CHUNK), np.float32), -1)))
    if factored:
        from_middle = op.Sub(cum, op.Slice(cum, [CHUNK // 2 - 1], [CHUNK // 2], [3]))  # (c, b, h, C, dk): G - R
        k_back_t = _t(op.Mul(k, op.Exp(op.Neg(from_middle))))  # (c, b, h, dk, C): (k ⊙ e^{R - G})ᵀ
        ahead = op.Exp(from_middle)  # (c, b, h, C, dk): e^{G - R}
        l_mat = op.MatMul(op.Mul(k_beta, ahead), k_back_t)  # (c, b, h, C, C), above the diagonal masked next
        on_or_below = op.Constant(value=ir.tensor(lower[:, :, 0].astype(np.float32)))  # (C, C): i >= j
        a = op.Mul(op.MatMul(op.Mul(q, ahead), k_back_t), on_or_below)  # (c, b, h, C, C)
    else:
        l_mat, a = summed(k_beta, k), summed(q, k)  # (c, b, h, C, C) each: D is 0 above the diagonal
    t = _unit_lower_inverse(op.Mul(l_mat, strict))  # (c, b, h, C, C)
    so_far = _exp(cum)  # (c, b, h, C, dk): e^G
    w = op.MatMul(t, op.Mul(k_beta, so_far))  # (c, b, h, C, dk)
    u = op.MatMul(t, op.Mul(v, op.Unsqueeze(beta, [4])))  # (c, b, h, C, dv)
    k_end_t = _t(op.Mul(k, _exp(op.Sub(last, cum))))  # (c, b, h, dk, C): (k ⊙ e^{G_C - G})ᵀ
    diagonal = op.Mul(_t(_exp(last)), op.Constant(value=ir.tensor(np.eye(dk, dtype=np.float32))))  # (…, dk, dk)
    g_m = op.Sub(diagonal, op.MatMul(k_end_t, w))  # (c, b, h, dk, dk)
    q_m = op.Sub(op.Mul(q, so_far), op.MatMul(a, w))  # (c, b, h, C, dk)
    h_p = op.MatMul(op.Concat(k_end_t, a, axis=3), u)  # [Kᵀ; A]·U (c, b, h, dk + C, dv)
    return op.Concat(g_m, q_m, axis=3), h_p
