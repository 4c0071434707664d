"""ONNX translation of the `seqexport::wkv7_chunked` custom op (see `wkv_lowering`), traced by
torch.onnx.export: one `Scan` over chunks of CHUNK tokens, built with onnx_ir as Mamba's
(`onnx_functions`).

Dimension letters: b batch, l length, lp length padded to a multiple of CHUNK, c = lp / CHUNK
chunks, k = CHUNK tokens of a chunk, h heads, n head size. Inside the body the state is
(b, 1, h, n, n) and each token's vectors are (b, 1, h, n, 1) ("columns": r, v, a) or
(b, 1, h, 1, n) ("rows": w, k, b), so that every product is a plain broadcasting MatMul/Mul.
"""

import onnx_ir as ir
from onnxscript import FLOAT
from onnxscript import opset18 as op

from seqexport.export.scan.onnx_functions import _check_float32, _emit, _input, _subgraph
from seqexport.export.scan.wkv_lowering import CHUNK

COLUMNS, ROWS = ("r", "v", "a"), ("w", "k", "b")


def _chunk_body() -> ir.Graph:
    """Scan body: state S (b, 1, h, n, n); one chunk of r, w, k, v, a, b.

    Per token:  S = S·diag(w) + (S·a)·b + v·k;  y = S·r.
    Returns the state after the chunk and the chunk's y (b, k, h, n, 1).
    The two outer products are ONE MatMul of inner size 2, [S·a, v] (b, 1, h, n, 2) @ [b; k]
    (b, 1, h, 2, n) (as the step graph's), each token's [b; k] concatenated for the whole chunk
    at once: a pass over the state less per token than two MatMuls of inner size 1 and an Add.
    """
    s_in = _input(ir.DataType.FLOAT, [None, 1, None, None, None])
    shapes = {x: [None, CHUNK, None, None, 1] if x in COLUMNS else [None, CHUNK, None, 1, None]
              for x in ("r", "w", "k", "v", "a", "b")}
    ins = {x: _input(ir.DataType.FLOAT, dims) for x, dims in shapes.items()}
    t = ir.tape.Tape()
    split = {"axis": 1, "num_outputs": CHUNK}
    tokens = {x: t.op_multi_out("Split", [ins[x]], split, num_outputs=CHUNK)
              for x in ("r", "w", "v", "a")}  # each (b, 1, h, n, 1) or (b, 1, h, 1, n)
    bk = t.op("Concat", [ins["b"], ins["k"]], {"axis": -2})  # (b, k, h, 2, n)
    tokens["bk"] = t.op_multi_out("Split", [bk], split, num_outputs=CHUNK)  # each (b, 1, h, 2, n)
    s, ys = s_in, []
    for i in range(CHUNK):
        r, w, v, a, bk_i = (tokens[x][i] for x in ("r", "w", "v", "a", "bk"))
        sa_v = t.op("Concat", [t.op("MatMul", [s, a]), v], {"axis": -1})  # (b, 1, h, n, 2)
        s = t.op("Add", [t.op("Mul", [s, w]), t.op("MatMul", [sa_v, bk_i])])  # (b, 1, h, n, n)
        ys.append(t.op("MatMul", [s, r]))  # (b, 1, h, n, 1)
    y = t.op("Concat", ys, {"axis": 1})  # (b, k, h, n, 1)
    return _subgraph("wkv", [s_in, *ins.values()], [s, y], t)


def wkv7_chunked(r: FLOAT, w: FLOAT, k: FLOAT, v: FLOAT, a: FLOAT, b: FLOAT, s0: FLOAT) -> tuple[FLOAT, FLOAT]:
    """seqexport::wkv7_chunked -> one Scan over chunks of CHUNK tokens.

    Pads l up to a multiple of CHUNK with w = 1 and k = v = a = b = 0 (the state stays), scans
    the chunks, then cuts y back to l.
    """
    _check_float32(r, w, k, v, a, b, s0)
    length = op.Shape(r, start=1, end=2)  # [l]
    pad = op.Mod(op.Sub(CHUNK, op.Mod(length, CHUNK)), CHUNK)  # [lp - l]
    pads = op.Concat(op.Constant(value_ints=[0, 0, 0, 0, 0]), pad, op.Constant(value_ints=[0, 0]), axis=0)
    heads = op.Shape(r, start=2)  # [h, n]
    to_chunks = op.Concat(op.Constant(value_ints=[0, -1, CHUNK]), heads, axis=0)

    def chunks(x, name, fill):  # (b, l, h, n) -> (b, c, k, h, n, 1) or (b, c, k, h, 1, n)
        x = op.Reshape(op.Pad(x, pads, op.Constant(value_float=fill)), to_chunks)
        return op.Unsqueeze(x, [5] if name in COLUMNS else [4])

    s_last, ys = _emit(
        "Scan",
        [op.Unsqueeze(s0, [1]), chunks(r, "r", 0.0), chunks(w, "w", 1.0), chunks(k, "k", 0.0),
         chunks(v, "v", 0.0), chunks(a, "a", 0.0), chunks(b, "b", 0.0)],
        {"body": _chunk_body(), "num_scan_inputs": 6, "scan_input_axes": [1] * 6, "scan_output_axes": [1]},
        num_outputs=2,
    )  # (b, 1, h, n, n), (b, c, k, h, n, 1)
    y = op.Reshape(ys, op.Concat(op.Constant(value_ints=[0, -1]), heads, axis=0))  # (b, lp, h, n)
    return op.Slice(y, [0], length, [1]), op.Squeeze(s_last, [1])  # (b, l, h, n), (b, h, n, n)
