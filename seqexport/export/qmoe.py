"""`seqexport quantize` of a mixture of experts: each ONNX Runtime `com.microsoft.MoE` node (the
hybrid's `--experts kernel`) becomes a `com.microsoft.QMoE` node over the same experts in 4 or 8
bits. The experts are most of such a model's weights and no MatMul's weight input, so the int8
and int4 MatMul passes leave them float32.

QMoE's integer layout (onnxruntime 1.32's schema, checked against the float kernel on the
dequantised weights): each expert's (N, K) matrix (N outputs, K inputs) as unsigned bytes, 4-bit
values two a byte along K, the lower nibble first; one float32 scale per row (scales (E, N)) or
per `block_size` inputs of a row (scales (E, N, K / block)); no zero points given, so the
kernel's default 2^(bits-1) (symmetric). Measured on this CPU: with per-row scales the 8- and
4-bit kernels equal the float kernel on the dequantised weights (~2e-6); with blocks, 8-bit and
`accuracy_level` 4 quantise the activations to int8 inside.
"""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from seqexport.errors import ExportError

DOMAIN = "com.microsoft"


def moe_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == "MoE"]


def quantized(w: np.ndarray, bits: int, block: int | None) -> tuple[np.ndarray, np.ndarray]:
    """w (E, N, K) float32 -> (packed (E, N, K * bits / 8) uint8, scales (E, N) or (E, N, K / block))."""
    e, n, k = w.shape
    size = block or k
    blocks = w.reshape(e, n, k // size, size)  # (E, N, K / size, size)
    top = 2 ** (bits - 1) - 1
    scales = np.abs(blocks).max(-1) / top  # (E, N, K / size)
    scales[scales == 0] = 1.0  # an all-zero block: any scale gives zeros
    q = np.clip(np.rint(blocks / scales[..., None]), -top - 1, top).astype(np.int16) + 2 ** (bits - 1)
    q = q.reshape(e, n, k).astype(np.uint8)  # (E, N, K), zero point 2^(bits-1)
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)  # (E, N, K / 2): two a byte, the lower nibble first
    return q, (scales if block else scales[..., 0]).astype(np.float32)


def block_for(model: onnx.ModelProto, bits: int, block_size: int | None) -> int | None:
    """The block the experts are quantised in: int4's `block_size` where it divides every expert
    matrix's inputs, else None (one scale per row); int8 always per row (its blocked kernel
    quantises the activations too)."""
    if bits == 8 or not block_size:
        return None
    inits = {i.name: i for i in model.graph.initializer}
    widths = {inits[n.input[i]].dims[-1] for n in moe_nodes(model) for i in (2, 4)}
    return block_size if all(w % block_size == 0 for w in widths) else None


def quantize_experts(model: onnx.ModelProto, bits: int, block: int | None, accuracy_level: int | None,
                     done: dict | None = None) -> int:
    """In place: every MoE node of `model` as QMoE, its experts in `bits` (a block of `block`
    inputs a scale, or a row); the float stacks dropped. `done`: stack name -> its quantised
    tensors, filled and reused across the graphs of one export (prefill and step read the same
    experts: quantised once). Returns the number of nodes."""
    nodes = moe_nodes(model)
    if not nodes:
        return 0
    inits = {i.name: i for i in model.graph.initializer}
    done = {} if done is None else done
    added, dropped = {}, set()
    for node in nodes:
        inputs = list(node.input) + [""] * (5 - len(node.input))
        if any(inputs[i] for i in (3, *range(5, len(inputs)))):  # biases, an fc3
            raise ExportError(f"MoE node {node.name!r} has expert biases or a third projection; the experts' "
                              "quantiser takes fc1 and fc2 only")
        names = []
        for i in (2, 4):
            source = inputs[i]
            if source not in done:
                packed, scales = quantized(numpy_helper.to_array(inits[source]), bits, block)
                done[source] = (numpy_helper.from_array(packed, f"{source}.int{bits}"),
                                numpy_helper.from_array(scales, f"{source}.scales"))
            added[source] = done[source]
            names += [added[source][0].name, added[source][1].name]
            dropped.add(source)
        attributes = list(node.attribute)
        extra = {"expert_weight_bits": bits, **({"block_size": block} if block else {}),
                 **({"accuracy_level": accuracy_level} if accuracy_level is not None else {})}
        node.op_type = "QMoE"
        del node.input[:]
        node.input.extend([inputs[0], inputs[1], names[0], names[1], "", names[2], names[3]])
        del node.attribute[:]
        node.attribute.extend(attributes + [helper.make_attribute(k, v) for k, v in extra.items()])
    still = {i for n in model.graph.node for i in n.input}
    gone = [k for k, i in enumerate(model.graph.initializer) if i.name in dropped and i.name not in still]
    for k in reversed(gone):  # removed where they are (rebuilding the list would copy every weight)
        del model.graph.initializer[k]
    model.graph.initializer.extend([t for pair in added.values() for t in pair])
    return len(nodes)
