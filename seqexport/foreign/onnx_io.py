"""A foreign graph's declared inputs, outputs and operators, read without its weights."""

from dataclasses import dataclass
from pathlib import Path

from seqexport.errors import ArtifactError

# ONNX element types a foreign graph's inputs use -> numpy dtype names
ELEM_TYPES = {1: "float32", 10: "float16", 7: "int64", 6: "int32", 9: "bool", 16: "bfloat16"}
# operators of weight-quantised graphs, with the bits they store
QUANT_OPS = {"MatMulNBits": None, "MatMulInteger": 8, "DynamicQuantizeLinear": 8, "QLinearMatMul": 8,
             "DynamicQuantizeMatMul": 8, "MatMulIntegerToFloat": 8, "QGemm": 8}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    dims: tuple  # int (fixed) or str (symbolic, as the graph names it) per axis


@dataclass(frozen=True)
class GraphIO:
    path: Path
    inputs: dict  # name -> Tensor, in the graph's order
    outputs: dict
    ops: frozenset  # operator types, nested subgraphs (If/Loop/Scan bodies) included
    quant_bits: int | None  # 4/8 when weights are quantised, else None


def _tensor(v) -> Tensor:
    t = v.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
    return Tensor(v.name, ELEM_TYPES.get(t.elem_type, f"onnx type {t.elem_type}"), dims)


def _nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _nodes(g)


def read(path: Path) -> GraphIO:
    import onnx  # the graph's record only: external weights are not read

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"graph {path} does not exist")
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and others for a damaged file
        raise ArtifactError(f"graph {path}: not a readable ONNX model: {e}") from None
    initializers = {t.name for t in model.graph.initializer}
    nodes = list(_nodes(model.graph))
    bits = None
    for n in nodes:
        if n.op_type in QUANT_OPS:
            b = QUANT_OPS[n.op_type] or next((a.i for a in n.attribute if a.name == "bits"), 4)
            bits = min(bits or b, b)
    return GraphIO(path, {v.name: _tensor(v) for v in model.graph.input if v.name not in initializers},
                   {v.name: _tensor(v) for v in model.graph.output}, frozenset(n.op_type for n in nodes), bits)
