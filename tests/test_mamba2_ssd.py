"""The SSD lowering the Mamba-2 and hybrid prefills are traced from (MatMuls over grouped heads)
against the per-token sequential reference, in float64: any chunk, any length, groups of heads."""

import pytest
import torch
from seqexport.models.mamba2 import ssd_sequential

from seqexport.families.mamba2.ssd import ssd_grouped


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("chunk", [4, 8, 64])
def test_grouped_ssd_equals_the_sequential_recurrence(groups, chunk):
    g = torch.Generator().manual_seed(groups * 100 + chunk)
    b, h, p, n = 2, 4, 3, 5
    for length in (1, chunk - 1 or 1, chunk, chunk + 1, 3 * chunk + 2):
        def rand(*shape):
            return torch.randn(*shape, generator=g, dtype=torch.float64)

        x, B, C, h0 = rand(b, length, h, p), rand(b, length, groups, n), rand(b, length, groups, n), rand(b, h, p, n)
        dt = torch.rand(b, length, h, generator=g, dtype=torch.float64) * 2.5 + 0.5  # softplus ≈ 0.5..3
        A, D = -torch.rand(h, generator=g, dtype=torch.float64) * 2, rand(h)
        y, state = ssd_grouped(x, dt, A, B, C, D, h0, chunk=chunk)
        y_ref, state_ref = ssd_sequential(x, dt, A, B, C, D, h0)
        assert (y - y_ref).abs().max() < 1e-10 and (state - state_ref).abs().max() < 1e-10, (length, chunk)


def test_strong_decays_leave_no_subnormal_float_anywhere_in_the_exported_ssd():
    """The SSD exported alone (float32), with decays as strong as a trained Mamba-2's can be
    (ΔA down to -40 a token): no tensor of the graph (every top-level node's output) holds a
    subnormal float (nonzero, below 1.2e-38), which Intel's cores compute with many times
    slower: each decay's exponential is exactly 0 below e^-40 (nothing beside the terms of
    order 1 it is summed with) instead of passing through the subnormal range."""
    import onnx

    from tests.lowering import subnormal_tensors

    class SSD(torch.nn.Module):
        def forward(self, x, dt, A, B, C, D, h0):
            return ssd_grouped(x, dt, A, B, C, D, h0, chunk=8)

    g = torch.Generator().manual_seed(7)
    b, length, h, p, n, groups = 1, 37, 4, 3, 5, 2
    inputs = (torch.randn(b, length, h, p, generator=g), torch.rand(b, length, h, generator=g) * 2.5 + 0.5,
              -torch.rand(h, generator=g) * 16, torch.randn(b, length, groups, n, generator=g),
              torch.randn(b, length, groups, n, generator=g), torch.randn(h, generator=g), torch.randn(b, h, p, n))
    names = ["x", "dt", "A", "B", "C", "D", "h0"]
    model = torch.onnx.export(SSD().eval(), inputs, input_names=names, output_names=["y", "state"], dynamo=True,
                              verbose=False).model_proto
    assert isinstance(model, onnx.ModelProto)
    seen, subnormal = subnormal_tensors(model, {k: v.numpy() for k, v in zip(names, inputs, strict=True)})
    assert seen > 20, f"only {seen} float tensors seen"
    assert not subnormal, f"subnormal floats in {len(subnormal)} tensors: {dict(list(subnormal.items())[:8])}"
