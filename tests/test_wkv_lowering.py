"""The RWKV-7 WKV recurrence's ONNX lowering (one chunk in closed form, a Scan over chunks)
against the sequential recurrence, evaluated in float64 as the truth.

One export (dynamic batch and length), run in onnxruntime at lengths on both sides of the
chunk size, with the decays RWKV-7 allows, down to the bound itself at every token (the
largest 1/γ a chunk divides by), and a non-zero starting state.
"""

import math

import onnxruntime as ort
import pytest
import torch
from seqexport.models.rwkv import DECAY_SCALE
from torch import nn

from seqexport.families.rwkv.wkv import CHUNK, wkv7_chunked, wkv_translation_table
from tests.lowering import assert_near_float64, assert_op_is_sequential

H, N = 2, 16  # heads, head size
LENGTHS = (1, 5, CHUNK, CHUNK + 1, 3 * CHUNK - 1, 300)

pytestmark = pytest.mark.filterwarnings("ignore:# The axis name")


def sequential(r, w, k, v, a, b, s0):
    """S = S·diag(w_t) + (S·a_t)·b_tᵀ + v_t·k_tᵀ; y_t = S·r_t, token by token, per row and head."""
    s, ys = s0.clone(), []
    for t in range(r.shape[1]):
        r_t, w_t, k_t, v_t, a_t, b_t = (x[:, t] for x in (r, w, k, v, a, b))  # (b, h, n)
        sa = torch.einsum("bhij,bhj->bhi", s, a_t)
        s = s * w_t[:, :, None, :] + sa[..., None] * b_t[:, :, None, :] + v_t[..., None] * k_t[:, :, None, :]
        ys.append(torch.einsum("bhij,bhj->bhi", s, r_t))
    return torch.stack(ys, 1), s


def make_inputs(batch: int, length: int, seed: int, decay: str = "spread"):
    """RWKV-7's operands: a = -κ̂ (unit per head), b = κ̂·rate, w = exp(-e^-0.5·sigmoid(x))."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, length, H, N)
    r, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    kk = torch.nn.functional.normalize(torch.randn(shape, generator=g), dim=-1)
    rate = torch.rand(shape, generator=g)
    x = torch.full(shape, 40.0) if decay == "bound" else torch.randn(shape, generator=g) * 3
    w = torch.exp(-DECAY_SCALE * torch.sigmoid(x))
    s0 = torch.randn(batch, H, N, N, generator=g)
    return r, w, k, v, -kk, kk * rate, s0


class Wkv(nn.Module):
    def forward(self, r, w, k, v, a, b, s0):
        return wkv7_chunked(r, w, k, v, a, b, s0)


@pytest.fixture(scope="module")
def session():
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch, 1: length}
    program = torch.onnx.export(
        Wkv().eval(), make_inputs(2, 20, seed=0), input_names=list("rwkvab") + ["s0"], output_names=["y", "s"],
        dynamic_shapes=(dims,) * 6 + ({0: batch},), custom_translation_table=wkv_translation_table(),
        dynamo=True, verbose=False)
    return ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("decay", ["spread", "bound"])
def test_ort_matches_the_sequential_recurrence(session, decay):
    for length in LENGTHS:
        for batch in (1, 3):
            assert_near_float64(session, make_inputs(batch, length, seed=length + batch, decay=decay), sequential,
                                f"{decay} decays, b={batch} l={length}")


def test_the_bound_decays_over_a_chunk_stay_in_float32_range():
    """The closed form divides by γ over up to CHUNK tokens: at RWKV-7's smallest decay that is
    e^(0.607·CHUNK), far inside float32 (the test above runs it)."""
    assert math.exp(DECAY_SCALE * CHUNK) < 1e6


def test_eager_op_is_the_reference():
    assert_op_is_sequential(wkv7_chunked, make_inputs(2, 21, seed=3), sequential)
