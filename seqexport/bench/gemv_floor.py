"""The fastest a weight-streaming step can be in ONNX Runtime: its linears alone, as Gemms at
batch 1 over random weights of the same shapes, in one session (what ORT's GEMV reads the
weights at, with no other operator and no cache). Beside the bandwidth bound it shows how much
of a step's excess over the bound is the GEMV itself rather than the rest of the graph."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from seqexport.bench.timing import time_paired


def linear_chain(shapes: list[tuple[int, int]], seed: int = 0) -> onnx.ModelProto:
    """One Gemm (transB, bias) per (out, in) weight shape, each reading a (1, in) input of
    its own width: the Gemms are independent, as a step's linears are in what they read."""
    rng = np.random.default_rng(seed)
    nodes, inits, outputs = [], [], []
    widths = sorted({k for _, k in shapes})
    for i, (n, k) in enumerate(shapes):
        inits += [numpy_helper.from_array(rng.standard_normal((n, k), np.float32) * 0.02, f"w{i}"),
                  numpy_helper.from_array(np.zeros(n, np.float32), f"b{i}")]
        nodes.append(helper.make_node("Gemm", [f"x{k}", f"w{i}", f"b{i}"], [f"y{i}"], transB=1))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, n]))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in widths]
    graph = helper.make_graph(nodes, "linear_chain", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def linear_chain_ms(shapes: list[tuple[int, int]], threads: int, repeats: int, sample_s: float) -> float:
    """Median milliseconds of one run of the chain (CPU, `threads` intra-op threads)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(linear_chain(shapes).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal((1, i.shape[1]), np.float32) for i in session.get_inputs()}
    return time_paired({"linears": lambda: session.run(None, feeds)}, repeats, sample_s)["linears"] * 1e3
