"""`seqexport quantize` of a mixture of experts (seqexport/export/qmoe.py): a QMoE node over the
packed experts equals ONNX Runtime's float MoE kernel over the same experts dequantised here by
the documented rule, (q - 2^(bits-1)) * scale, unpacked lower nibble first — 8 and 4 bits, a
scale per row and per block."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from seqexport.export import qmoe

E, D, FE, N, K = 8, 64, 32, 7, 2
ATTRS = dict(k=K, activation_type="swiglu", normalize_routing_weights=1, swiglu_fusion=1, activation_alpha=1.0,
             activation_beta=0.0)


def _run(node: onnx.NodeProto, weights: dict, x, logits):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, ["n", D]),
                                            helper.make_tensor_value_info("r", 1, ["n", E])],
                              [helper.make_tensor_value_info("y", 1, ["n", D])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "r": logits})[0]


def _moe_model(w1, w2) -> onnx.ModelProto:
    node = helper.make_node("MoE", ["x", "r", "w1", "", "w2"], ["y"], domain="com.microsoft", name="moe", **ATTRS)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, ["n", D]),
                                            helper.make_tensor_value_info("r", 1, ["n", E])],
                              [helper.make_tensor_value_info("y", 1, ["n", D])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _dequantized(packed: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """The documented rule, written out: unpack (lower nibble first), subtract 2^(bits-1), scale."""
    if bits == 4:
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    else:
        q = packed
    q = q.astype(np.float32) - 2 ** (bits - 1)  # (E, N, Kin)
    if scales.ndim == 2:  # a scale per row
        return q * scales[..., None]
    e, n, kin = q.shape
    return (q.reshape(e, n, scales.shape[-1], -1) * scales[..., None]).reshape(e, n, kin)


@pytest.mark.parametrize("bits, block", [(8, None), (4, None), (4, 16), (4, 32)])
def test_a_qmoe_node_is_the_float_kernel_on_its_dequantized_experts(bits, block):
    rng = np.random.default_rng(bits + (block or 0))
    w1 = (rng.standard_normal((E, 2 * FE, D)) * 0.3).astype(np.float32)  # gate/up rows interleaved
    w2 = (rng.standard_normal((E, D, FE)) * 0.3).astype(np.float32)
    x, logits = rng.standard_normal((N, D)).astype(np.float32), rng.standard_normal((N, E)).astype(np.float32)
    model = _moe_model(w1, w2)
    assert qmoe.quantize_experts(model, bits, block, None) == 1
    node = model.graph.node[0]
    assert node.op_type == "QMoE" and {i.name for i in model.graph.initializer} == {
        f"w1.int{bits}", "w1.scales", f"w2.int{bits}", "w2.scales"}
    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert arrays[f"w1.int{bits}"].shape == (E, 2 * FE, D * bits // 8) and arrays[f"w1.int{bits}"].dtype == np.uint8
    assert arrays["w1.scales"].shape == ((E, 2 * FE) if block is None else (E, 2 * FE, D // block))
    want = _run(helper.make_node("MoE", ["x", "r", "w1", "", "w2"], ["y"], domain="com.microsoft", **ATTRS),
                {"w1": _dequantized(arrays[f"w1.int{bits}"], arrays["w1.scales"], bits),
                 "w2": _dequantized(arrays[f"w2.int{bits}"], arrays["w2.scales"], bits)}, x, logits)
    got = _run(node, arrays, x, logits)
    np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=0)
    # and the quantisation is close to the float experts: a step of half a scale at most per weight
    back = _dequantized(arrays[f"w1.int{bits}"], arrays["w1.scales"], bits)
    scale = arrays["w1.scales"][..., None] if block is None else np.repeat(arrays["w1.scales"], block, -1)
    assert (np.abs(back - w1) <= 0.5 * scale + 1e-6).all()


def test_the_block_falls_back_to_rows_where_it_divides_no_expert_width():
    model = _moe_model(np.zeros((E, 2 * 48, D), np.float32), np.zeros((E, D, 48), np.float32))
    assert qmoe.block_for(model, 4, 32) is None and qmoe.block_for(model, 4, 16) == 16
    assert qmoe.block_for(model, 8, 16) is None  # int8's blocked kernel quantises the activations too
