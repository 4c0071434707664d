"""Building ONNX nodes inside a `custom_translation_table` function while torch.onnx.export
traces it: nodes with several outputs (`Scan`, `Loop`), which an onnxscript op call cannot
ask for, appended to the recording evaluator directly (as torch's own translations of
higher-order ops do), and their body graphs built with onnx_ir. Used by the Mamba scan and
RWKV-7 WKV lowerings (`families/mamba/scan_onnx.py`, `families/rwkv/wkv_onnx.py`)."""

import itertools

import onnx_ir as ir
import onnxscript

_names = itertools.count()


def emit(op_type: str, inputs: list, attributes: dict, num_outputs: int) -> list:
    """Record a node of the default domain with several outputs in the exporter's graph."""
    return emit_in("", None, op_type, inputs, attributes, num_outputs)


def emit_in(domain: str, version: int | None, op_type: str, inputs: list, attributes: dict,
            num_outputs: int) -> list:
    """Record a node of `domain` (its opset `version`; None: the exporter's) in the exporter's
    graph; a None input is an omitted optional one."""
    recorder = onnxscript.evaluator.default()
    if not hasattr(recorder, "nodes"):
        raise RuntimeError(
            f"{op_type} can only be built while torch.onnx.export traces this translation"
        )
    node = ir.Node(
        domain,
        op_type,
        inputs,
        attributes=ir.convenience.convert_attributes(attributes),
        num_outputs=num_outputs,
        version=recorder.opset.version if version is None else version,
    )
    recorder.nodes.append(node)
    return list(node.outputs)


def subgraph(name: str, inputs: list, outputs: list, tape: ir.tape.Tape) -> ir.Graph:
    """A body graph; its values get model-unique names (ORT wants SSA across subgraphs)."""
    prefix = f"seqexport_{name}{next(_names)}_"
    for i, value in enumerate([*inputs, *(v for n in tape.nodes for v in n.outputs)]):
        value.name = f"{prefix}{i}"
    return ir.Graph(inputs, outputs, nodes=tape.nodes, name=f"{prefix}body")


def typed_input(dtype: ir.DataType, dims: list) -> ir.Value:
    """A typed body input (ORT refuses untyped Loop body inputs); None dims are unknown."""
    return ir.Value(type=ir.TensorType(dtype), shape=ir.Shape(dims))


def check_float32(*values: ir.Value) -> None:
    for value in values:
        if value.dtype != ir.DataType.FLOAT:
            raise TypeError(
                f"the scan lowerings take float32 inputs, got {value.dtype} for {value.name}"
            )
