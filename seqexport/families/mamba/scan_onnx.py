"""ONNX translations of the scan custom ops (see scan_lowerings.py), traced by torch.onnx.export.

Each function is called by the exporter with onnx_ir values and records its
nodes through onnxscript ops. `Scan` and `Loop` have several outputs, which an
onnxscript op call cannot ask for, so those nodes (and their bodies, built with
onnx_ir) are appended to the recording evaluator directly, as torch's own
translations of higher-order ops do.

Dimension letters: b batch, l length, d_in mixer width, n d_state.
"""

import onnx_ir as ir
from onnxscript import FLOAT
from onnxscript import opset18 as op

from seqexport.export.ir_nodes import check_float32 as _check_float32
from seqexport.export.ir_nodes import emit as _emit
from seqexport.export.ir_nodes import subgraph as _subgraph
from seqexport.export.ir_nodes import typed_input as _input

MAX_DOUBLINGS = 62  # doubling steps the parallel Loop may take: l < 2**62

def _const(tape: ir.tape.Tape, values: list[int]) -> ir.Value:
    return tape.op("Constant", [], {"value": ir.tensor(values, dtype=ir.DataType.INT64)})


def _step_body() -> ir.Graph:
    """Scan body, one time step, the state transposed: h (b, n, d_in); Δ_t and Δ_t u_t (b, 1, d_in),
    B_t (b, n, 1) and C_t (b, 1, n). Returns the new state and y_t (b, 1, d_in) without the D skip.

    AT = Aᵀ (n, d_in) rides along as a second state, returned as it came (OpenVINO converts a
    Scan whose body reads only constants from the outer graph). With d_in innermost every broadcast runs in
    spans of d_in (ORT's broadcasting Mul makes one kernel call a span of its innermost dim), and
    the Scan slices its inputs per step without copies: six nodes a step, each one pass over
    the (b, n, d_in) state or less. Chunks of 8 steps unrolled in the body (the body before) cost
    more: splitting a chunk's exp(ΔA) and ΔBu into steps and joining the states again are copies,
    the chunk's temporaries spill out of the L2 cache, and the (b, d_in, n) layout needed a
    MatMul by ones for each outer product (the scan alone, d_in 1536, 1024 steps, 1 thread:
    18.5 against 26 ms, fastest of 11 runs).
    """
    h_in = _input(ir.DataType.FLOAT, [None, None, None])
    AT = _input(ir.DataType.FLOAT, [None, None])
    delta, du = (_input(ir.DataType.FLOAT, [None, 1, None]) for _ in range(2))
    B = _input(ir.DataType.FLOAT, [None, None, 1])
    C = _input(ir.DataType.FLOAT, [None, 1, None])
    t = ir.tape.Tape()
    dA = t.op("Exp", [t.op("Mul", [delta, AT])])  # (b, n, d_in)
    dBu = t.op("Mul", [B, du])  # (b, n, d_in), exact products
    h = t.op("Add", [t.op("Mul", [dA, h_in]), dBu])  # (b, n, d_in)
    y = t.op("MatMul", [C, h])  # (b, 1, d_in)
    return _subgraph("scan", [h_in, AT, delta, du, B, C], [h, AT, y], t)


def _transposed(A: ir.Value, u: ir.Value) -> ir.Value:
    """Aᵀ (n, d_in), made at run time. torch.onnx folds A = -exp(A_log) into one stored constant,
    which the step graph reads too; a constant Aᵀ would be folded into a second stored copy. Adding
    0·l (l = u's length, known only at run time) keeps the transpose out of the exporter's reach;
    ONNX Runtime makes it once a run (d_in·n values a layer)."""
    zero = op.CastLike(op.Mul(op.Shape(u, start=1, end=2), op.Constant(value_ints=[0])), A)  # [0.]
    return op.Transpose(op.Add(A, zero), perm=[1, 0])


def scan_chunked(
    u: FLOAT, delta: FLOAT, A: FLOAT, B: FLOAT, C: FLOAT, D: FLOAT, h0: FLOAT
) -> tuple[FLOAT, FLOAT]:
    """seqexport::selective_scan_chunked -> one Scan over the time steps, the state (b, n, d_in).

    (The custom op keeps its name: its eager kernel is the chunked torch scan.)
    """
    _check_float32(u, delta, A, B, C, D, h0)
    h_last, _, ys = _emit(
        "Scan",
        [op.Transpose(h0, perm=[0, 2, 1]), _transposed(A, u), op.Unsqueeze(delta, [2]),
         op.Unsqueeze(op.Mul(delta, u), [2]), op.Unsqueeze(B, [3]), op.Unsqueeze(C, [2])],
        {
            "body": _step_body(),
            "num_scan_inputs": 4,
            "scan_input_axes": [1, 1, 1, 1],
            "scan_output_axes": [1],
        },
        num_outputs=3,
    )  # (b, n, d_in), Aᵀ, (b, l, 1, d_in)
    y = op.Squeeze(ys, [2])  # (b, l, d_in)
    return op.Add(y, op.Mul(u, D)), op.Transpose(h_last, perm=[0, 2, 1])


def _doubling_body() -> ir.Graph:
    """Loop body: one Hillis–Steele step at distance `shift` over (a, bx) (b, l, d_in, n).

    Element t takes the pair at t - shift (the identity (1, 0) before the start)
    as its earlier half: (a, bx)_t <- (a_{t-s} a_t, a_t bx_{t-s} + bx_t).
    """
    i, cond = _input(ir.DataType.INT64, []), _input(ir.DataType.BOOL, [])
    shift = _input(ir.DataType.INT64, [1])
    a, bx = _input(ir.DataType.FLOAT, [None] * 4), _input(ir.DataType.FLOAT, [None] * 4)
    t = ir.tape.Tape()
    start, axis1 = _const(t, [0]), _const(t, [1])
    keep = t.op("Sub", [t.op("Shape", [a], {"start": 1, "end": 2}), shift])  # [l - shift]
    pads = t.op("Concat", [start, shift, _const(t, [0] * 6)], {"axis": 0})
    one = t.op("Constant", [], {"value": ir.tensor(1.0, dtype=ir.DataType.FLOAT)})
    a_prev = t.op("Pad", [t.op("Slice", [a, start, keep, axis1]), pads, one])
    b_prev = t.op("Pad", [t.op("Slice", [bx, start, keep, axis1]), pads])
    bx_out = t.op("Add", [t.op("Mul", [a, b_prev]), bx])
    a_out = t.op("Mul", [a, a_prev])
    shift_out = t.op("Mul", [shift, _const(t, [2])])
    cond_out = t.op("Identity", [cond])
    return _subgraph("loop", [i, cond, shift, a, bx], [cond_out, shift_out, a_out, bx_out], t)


def scan_doubling(
    u: FLOAT, delta: FLOAT, A: FLOAT, B: FLOAT, C: FLOAT, D: FLOAT, h0: FLOAT
) -> tuple[FLOAT, FLOAT]:
    """seqexport::selective_scan_doubling -> a Loop of ceil(log2 l) doubling steps.

    (a_t, bx_t) = (exp(Δ_t A), Δ_t u_t B_t), h0 folded into bx_0; afterwards bx_t = h_t.
    """
    _check_float32(u, delta, A, B, C, D, h0)
    length = op.Shape(u, start=1, end=2)  # [l]
    ones = op.Unsqueeze(op.Expand(op.Constant(value_floats=[1.0]), op.Shape(B, start=2)), [0])  # (1, n)
    # outer products as MatMuls with an inner size of 1, as in the chunk body
    a = op.Exp(op.Mul(op.MatMul(op.Unsqueeze(delta, [3]), ones), A))  # (b, l, d_in, n)
    bx = op.MatMul(op.Unsqueeze(op.Mul(delta, u), [3]), op.Unsqueeze(B, [2]))  # (b, l, d_in, n)
    first = op.Add(
        op.Mul(op.Slice(a, [0], [1], [1]), op.Unsqueeze(h0, [1])), op.Slice(bx, [0], [1], [1])
    )  # (b, 1, d_in, n)
    bx = op.Concat(first, op.Slice(bx, [1], [2**62], [1]), axis=1)
    powers = op.Constant(value_ints=[2**k for k in range(MAX_DOUBLINGS)])
    trips = op.ReduceSum(op.Cast(op.Less(powers, length), to=ir.DataType.INT64), keepdims=0)
    _, _, h = _emit(
        "Loop",
        [trips, None, op.Constant(value_ints=[1]), a, bx],
        {"body": _doubling_body()},
        num_outputs=3,
    )  # shift, a, h: (b, l, d_in, n)
    y = op.Squeeze(op.MatMul(h, op.Unsqueeze(C, [3])), [3])  # (b, l, d_in)
    h_last = op.Squeeze(op.Slice(h, [-1], [2**62], [1]), [1])  # (b, d_in, n)
    return op.Add(y, op.Mul(u, D)), h_last


def softplus(x: FLOAT, beta: float = 1.0, threshold: float = 20.0) -> FLOAT:
    """aten::softplus (Δ of the scan) -> relu(x) - log(sigmoid(|x|)) = log(1 + exp(x)).

    ORT's Softplus is a scalar log1p(exp) loop, its Relu, Abs, Sigmoid and Log vectorised
    kernels (measured on (16, 256), one thread: about a tenth of the time). No overflow for any
    x; past the threshold it is x + log(1 + exp(-|x|)), within exp(-threshold) of torch's x.
    """
    if beta != 1.0:  # softplus(βx) / β
        return op.Div(softplus(op.Mul(x, op.CastLike(beta, x))), op.CastLike(beta, x))
    return op.Sub(op.Relu(x), op.Log(op.Sigmoid(op.Abs(x))))
