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
