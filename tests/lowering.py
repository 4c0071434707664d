"""What the recurrences' ONNX lowerings are tested with (tests/test_wkv_lowering.py,
tests/test_delta_rule_lowering.py): a lowering's outputs against its sequential rule evaluated
in float64 as the truth, within the error the float32 sequential rule itself makes."""

import numpy as np


def assert_near_float64(session, inputs, sequential, label: str) -> None:
    """Run `inputs` (torch tensors, in the session's input order) through the ONNX `session` and
    `sequential` in float64 and float32: each output within 4x the float32 rule's error from
    float64, or 1e-6 of the output's largest value."""
    got = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)})
    truth = sequential(*(x.double() for x in inputs))
    plain = sequential(*inputs)  # the float32 rule: the error a float32 export may have
    for name, g, t, p in zip(("y", "state"), got, truth, plain, strict=True):
        t, p = t.numpy(), p.numpy()
        assert g.shape == t.shape, f"{name} shape {g.shape}, expected {t.shape}"
        scale = float(np.abs(t).max())
        err, err32 = float(np.abs(g - t).max()), float(np.abs(p - t).max())
        # within float32 rounding of the values, and of the order of the sequential float32 error
        assert err <= max(4 * err32, 1e-6 * scale), (
            f"{label}: {name} max |diff| {err:.2e} from float64 (the float32 sequential rule: {err32:.2e}; "
            f"values up to {scale:.1f})")


def assert_op_is_sequential(op, inputs, sequential) -> None:
    """A lowering's custom op run eagerly gives its sequential rule's outputs (float32)."""
    import torch

    for got, want in zip(op(*inputs), sequential(*inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def subnormal_tensors(model, feeds: dict) -> tuple[int, dict[str, int]]:
    """Run `model` (an onnx ModelProto, edited: every top-level node's outputs made graph outputs)
    on `feeds` with ORT's graph optimisations off; returns how many float tensors were seen and,
    by name, those holding subnormal floats (nonzero, below 1.2e-38) with their counts."""
    import onnx
    import onnxruntime as ort

    listed = {o.name for o in model.graph.output}
    for node in model.graph.node:
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in node.output
                                  if o and o not in listed)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    tiny = np.finfo(np.float32).tiny
    seen = {name: int(np.count_nonzero((np.abs(x) < tiny) & (x != 0)))
            for name, x in zip(names, session.run(None, feeds), strict=True)
            if isinstance(x, np.ndarray) and x.dtype == np.float32}
    return len(seen), {name: n for name, n in seen.items() if n}
