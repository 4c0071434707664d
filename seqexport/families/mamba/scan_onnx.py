"""ONNX translations of the scan custom ops (see scan_lowerings.py), traced by torch.onnx.export.

Each function is called by the exporter with onnx_ir values and records its
nodes through onnxscript ops. `Scan` and `Loop` have several outputs, which an
onnxscript op call cannot ask for, so those nodes (and their bodies, built with
onnx_ir) are appended to the recording evaluator directly, as torch's own
translations of higher-order ops do.

Dimension letters: b batch, l length, lp length padded to a multiple of CHUNK,
c = lp / CHUNK chunks, k = CHUNK steps of a chunk, d_in mixer width, n d_state.
"""

import onnx_ir as ir
from onnxscript import FLOAT
from onnxscript import opset18 as op

from seqexport.export.ir_nodes import check_float32 as _check_float32
from seqexport.export.ir_nodes import emit as _emit
from seqexport.export.ir_nodes import subgraph as _subgraph
from seqexport.export.ir_nodes import typed_input as _input
from seqexport.families.mamba.scan_lowerings import CHUNK

MAX_DOUBLINGS = 62  # doubling steps the parallel Loop may take: l < 2**62

def _const(tape: ir.tape.Tape, values: list[int]) -> ir.Value:
    return tape.op("Constant", [], {"value": ir.tensor(values, dtype=ir.DataType.INT64)})


def _chunk_body(A: ir.Value, ones: ir.Value) -> ir.Graph:
    """Scan body: state h (b, 1, d_in, n); one chunk of Δ and Δu (b, k, d_in, 1), B (b, k, 1, n)
    and C (b, k, n, 1).

    Returns the state after the chunk and the chunk's y (b, k, d_in, 1) without the D skip.
    A (d_in, n) and ones (1, n) are read from the outer graph. ORT's broadcasting Mul walks
    its output in spans of the innermost broadcast dim (n), one kernel call a span, so the
    outer products are MatMuls with an inner size of 1 (exact products, as the broadcast) and
    the one Mul by A broadcasts over (b, k) only: a span of d_in·n.
    """
    h_in = _input(ir.DataType.FLOAT, [None, 1, None, None])
    delta, du = (_input(ir.DataType.FLOAT, [None, CHUNK, None, 1]) for _ in range(2))
    B = _input(ir.DataType.FLOAT, [None, CHUNK, 1, None])
    C = _input(ir.DataType.FLOAT, [None, CHUNK, None, 1])
    t = ir.tape.Tape()
    dA = t.op("Exp", [t.op("Mul", [t.op("MatMul", [delta, ones]), A])])  # (b, k, d_in, n)
    dBu = t.op("MatMul", [du, B])  # (b, k, d_in, n)
    dAs = t.op_multi_out("Split", [dA], {"axis": 1, "num_outputs": CHUNK}, num_outputs=CHUNK)
    dBus = t.op_multi_out("Split", [dBu], {"axis": 1, "num_outputs": CHUNK}, num_outputs=CHUNK)
    h, hs = h_in, []
    for dA_i, dBu_i in zip(dAs, dBus, strict=True):
        h = t.op("Add", [t.op("Mul", [dA_i, h]), dBu_i])  # (b, 1, d_in, n)
        hs.append(h)
    H = t.op("Concat", hs, {"axis": 1})  # (b, k, d_in, n)
    y = t.op("MatMul", [H, C])  # (b, k, d_in, 1)
    return _subgraph("scan", [h_in, delta, du, B, C], [h, y], t)


def scan_chunked(
    u: FLOAT, delta: FLOAT, A: FLOAT, B: FLOAT, C: FLOAT, D: FLOAT, h0: FLOAT
) -> tuple[FLOAT, FLOAT]:
    """seqexport::selective_scan_chunked -> one Scan over chunks of CHUNK steps.

    Pads l up to a multiple of CHUNK with Δ = u = 0 (exp(0 A) = 1 and 0 B = 0 keep h),
    scans the chunks, then cuts y back to l.
    """
    _check_float32(u, delta, A, B, C, D, h0)
    length = op.Shape(u, start=1, end=2)  # [l]
    pad = op.Mod(op.Sub(CHUNK, op.Mod(length, CHUNK)), CHUNK)  # [lp - l]
    pads = op.Concat(op.Constant(value_ints=[0, 0, 0, 0]), pad, op.Constant(value_ints=[0]), axis=0)
    head = op.Constant(value_ints=[0, -1, CHUNK])

    def chunks(x, last):  # (b, l, m) -> (b, c, k, m, 1) with last, else (b, c, k, 1, m)
        x = op.Reshape(op.Pad(x, pads), op.Concat(head, op.Shape(x, start=2), axis=0))  # (b, c, k, m)
        return op.Unsqueeze(x, [4 if last else 3])

    ones = op.Unsqueeze(op.Expand(op.Constant(value_floats=[1.0]), op.Shape(B, start=2)), [0])  # (1, n)
    h_last, ys = _emit(
        "Scan",
        [op.Unsqueeze(h0, [1]), chunks(delta, True), chunks(op.Mul(delta, u), True), chunks(B, False),
         chunks(C, True)],
        {
            "body": _chunk_body(A, ones),
            "num_scan_inputs": 4,
            "scan_input_axes": [1, 1, 1, 1],
            "scan_output_axes": [1],
        },
        num_outputs=2,
    )  # (b, 1, d_in, n), (b, c, k, d_in, 1)
    y = op.Reshape(ys, op.Concat(op.Constant(value_ints=[0, -1]), op.Shape(u, start=2), axis=0))
    y = op.Slice(y, [0], length, [1])  # (b, l, d_in)
    return op.Add(y, op.Mul(u, D)), op.Squeeze(h_last, [1])


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
