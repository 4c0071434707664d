"""Weight-only int4 for `seqexport quantize --bits 4`: ONNX Runtime's own `MatMulNBitsQuantizer`
(`onnxruntime.quantization.matmul_nbits_quantizer`), each chosen weight MatMul replaced by one
`com.microsoft` MatMulNBits node: the weight's columns in blocks of `block_size` along K, each
block 4-bit with one float32 scale (symmetric: no zero points), activations float32 in and out.

`accuracy_level` is the kernel's compute type for the activations: 0 (unset) and 1 float32,
4 int8 (each block of the activations quantised on the fly, then VNNI/AVX2 integer dot products).
Measured here (2 threads, a loaded machine, int4 ÷ float32 of a batch-1 GEMV chain over Mamba
130m's in/out projections): level 4 0.21-0.25, level 0 0.38-0.42 — so 4 by default. Block size,
step ratio on the base transformer / Mamba 130m / RWKV-7 0.1b (medians of three alternating
rounds): block 32 0.16 / 0.35 / 0.28, block 128 0.12 / 0.28 / 0.24; but block 128 raised the
mean logit error of the bundled models' copies by 12-22% and cut the bundled Mamba's
teacher-forced top-1 on random tokens from 0.88 to 0.82 — so 32 by default, as onnxruntime-
genai's CPU int4 models; `--block-size 128` for the speed. Symmetric (no zero points): the
asymmetric kernel was 0-14% slower in the same runs for the same state drift on the presets.

ORT's CPU kernel for MatMulNBits is fast only with its weights prepacked at session creation
(unpacked it dequantises every call: Mamba 130m step 1050 ms against 104 ms); the runtime packs
the weights of every graph that holds a MatMulNBits node (`runtime.session.SharedWeights.prepack`).
"""

import logging

import onnx

BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits: a power of two, at least 16
ACCURACY_LEVELS = (0, 1, 2, 3, 4)  # 0: unset (float32), 1 float32, 2 float16, 3 bfloat16, 4 int8
BLOCK_SIZE = 32  # default; see the module docstring for the measurements
ACCURACY_LEVEL = 4
SYMMETRIC = True  # no zero points (see above)
# The output head's bits by default: RWKV-7 0.1b (random weights, near-flat logits over 65536
# tokens), teacher-forced top-1 at decisive positions over three seeds: head 4-bit 95-97%
# (block 16 or asymmetric no better), 8-bit 98-100% as with a float32 head; step ratio with the
# 8-bit head 0.28-0.32 against 0.27-0.28 (Mamba 130m 0.30-0.31 both), alternating rounds.
HEAD_BITS = 8
NBITS = "MatMulNBits"


def matmul_names(graph: onnx.GraphProto, out: set[str] | None = None) -> set[str]:
    """Names of every MatMul in the graph and its subgraphs (a Scan body's included)."""
    out = set() if out is None else out
    for node in graph.node:
        if node.op_type == "MatMul":
            out.add(node.name)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                matmul_names(a.g, out)
            for g in a.graphs:
                matmul_names(g, out)
    return out


def quantizable(model: onnx.ModelProto, nodes) -> list[onnx.NodeProto]:
    """Those of the top-level MatMul `nodes` that MatMulNBits can take: the weight is the B
    operand (input 1), a float32 initializer of rank 2."""
    init = {t.name: t for t in model.graph.initializer}
    return [n for n in nodes if n.op_type == "MatMul" and n.input[1] in init
            and len(init[n.input[1]].dims) == 2 and init[n.input[1]].data_type == onnx.TensorProto.FLOAT]


def quantize_graph(model: onnx.ModelProto, chosen: set[str], bits: int = 4, block_size: int = BLOCK_SIZE,
                   accuracy_level: int = ACCURACY_LEVEL) -> onnx.ModelProto:
    """The graph with exactly the MatMuls named in `chosen` as MatMulNBits (`model` is edited).
    Every other MatMul, in subgraphs too, is excluded by name: the quantiser would otherwise take
    any MatMul whose B is a constant."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer_log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level, quantizer_log.level = quantizer_log.level, logging.WARNING  # a line per node at INFO
    try:
        q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=SYMMETRIC,
                                 accuracy_level=accuracy_level or None, op_types_to_quantize=("MatMul",),
                                 nodes_to_exclude=sorted(matmul_names(model.graph) - chosen))
        q.process()
    finally:
        quantizer_log.level = level
    out = q.model.model
    _dedupe_initializers(out.graph)
    return out


def nbits_nodes(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Top-level MatMulNBits nodes by the name of the MatMul they replaced."""
    return {n.name.rsplit("_Q", 1)[0]: n for n in model.graph.node if n.op_type == NBITS}


def _dedupe_initializers(graph: onnx.GraphProto) -> None:
    """One initializer per name: a weight two MatMuls of one graph read is quantised twice, to
    the same bytes (the quantiser is deterministic), and added twice."""
    seen, keep = set(), []
    for t in graph.initializer:
        if t.name not in seen:
            seen.add(t.name)
            keep.append(t)
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
