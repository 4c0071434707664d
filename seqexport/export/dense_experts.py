"""The experts of a dense-form export (`export hybrid --experts dense`, and Nemotron-H's always)
in int8, still standard ONNX: each expert stack (E, rows, cols), which the prefill's MatMul
takes whole and the step gathers a token's k experts from, is stored as int8 with one float32
scale per expert row (symmetric), and dequantised (Cast, Mul) where it is read: in the step
after the Gather, so only the k experts a token takes. ONNX Runtime's QMoE cannot run these
experts (squared ReLU, grouped sigmoid routing) and its MatMul quantisers take 2-D weights
only: before, an int8 or int4 copy left every expert float32, most of an MoE model's bytes.
int4 copies store these stacks in int8 too (4-bit would need unpacking nodes per read).
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper

BITS = 8
QMAX = 2 ** (BITS - 1) - 1  # symmetric: -127..127


def stacks(model: onnx.ModelProto) -> list[str]:
    """The expert stacks: the `batched_weights` that are parameters. A parameter keeps its module
    path ("model.layers.2.experts.down_proj"); a constant the exporter folded has a name of its
    own without one ("slice_22": the latent attention's key weights per head, which the experts'
    int8 is not for)."""
    return [name for name in batched_weights(model) if "." in name]


def batched_weights(model: onnx.ModelProto) -> list[str]:
    """3-D float32 initializers every reader of which is a MatMul (either operand) or a Gather
    along axis 0 (a depthwise conv kernel is 3-D too, read by a Conv): expert stacks, and weights
    per head. The int8 and int4 MatMul passes take 2-D weights and leave these as they are."""
    inits = {t.name: t for t in model.graph.initializer
             if len(t.dims) == 3 and t.data_type == onnx.TensorProto.FLOAT}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name in inits:
                readers.setdefault(name, []).append(node)
    return [name for name, nodes in readers.items()
            if all(n.op_type == "MatMul" or (n.op_type == "Gather" and n.input[0] == name
                                            and _axis(n) == 0) for n in nodes)]


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def quantized(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E, r, c) float -> int8 (E, r, c) and float32 scales (E, r, 1): w ~ q * scale."""
    amax = np.abs(w).max(axis=-1, keepdims=True)  # (E, r, 1)
    scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale), -QMAX, QMAX).astype(np.int8), scale


def quantize_stacks(model: onnx.ModelProto, done: dict | None = None) -> int:
    """In place: every expert stack of `model` as int8 + scales, dequantised where it is read;
    the float stacks dropped. `done`: stack name -> its (int8, scales) tensors, filled and reused
    across the graphs of one export (quantised once). Returns the number of stacks."""
    names = stacks(model)
    if not names:
        return 0
    wanted = set(names)
    done = {} if done is None else done
    inits = {t.name: t for t in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if name not in wanted:
                continue
            q, s = f"{name}.int{BITS}", f"{name}.scales"
            if node.op_type == "Gather":  # the k experts' rows and scales, then dequantised
                rows, scales, floats = (f"{node.output[0]}_{x}" for x in ("int8", "scales", "float"))
                nodes += [helper.make_node("Gather", [q, node.input[1]], [rows], name=f"{node.name}_int8", axis=0),
                          helper.make_node("Gather", [s, node.input[1]], [scales], name=f"{node.name}_scales", axis=0),
                          helper.make_node("Cast", [rows], [floats], name=f"{node.name}_cast",
                                           to=onnx.TensorProto.FLOAT),
                          helper.make_node("Mul", [floats, scales], [node.output[0]], name=f"{node.name}_dequantized")]
                node = None
                break
            value = f"{node.name}_{k}_dequantized"  # the whole stack (the prefill runs every expert)
            nodes += [helper.make_node("Cast", [q], [value + "_float"], name=value + "_cast", to=onnx.TensorProto.FLOAT),
                      helper.make_node("Mul", [value + "_float", s], [value], name=value)]
            node.input[k] = value
        if node is not None:
            nodes.append(node)
    for name in names:
        if name not in done:
            q, s = quantized(numpy_helper.to_array(inits[name]))
            done[name] = (numpy_helper.from_array(q, f"{name}.int{BITS}"), numpy_helper.from_array(s, f"{name}.scales"))
    gone = [k for k, t in enumerate(model.graph.initializer) if t.name in wanted]
    for k in reversed(gone):  # removed where they are (rebuilding the list would copy every weight)
        del model.graph.initializer[k]
    model.graph.initializer.extend([t for name in names for t in done[name]])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(names)
