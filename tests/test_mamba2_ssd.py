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
