"""The gated delta rule's ONNX lowering (Qwen3.5's Gated DeltaNet prefill: each chunk in closed
form, a Scan over chunks) against the token-by-token rule written out here, evaluated in float64
as the truth.

One export (dynamic batch and length), run in onnxruntime at lengths on both sides of the chunk
size, with decays from none to total (e^g down to e^-60: the closed form never divides by one),
grouped and ungrouped sizes (dk != dv), and a non-zero starting state.
"""

import numpy as np
import onnxruntime as ort
import pytest
import torch
from seqexport.models.hybrid import gated_delta_ref
from torch import nn

from seqexport.families.hybrid.delta_rule import CHUNK, gated_delta_chunked, translation_table

H, DK, DV = 3, 8, 12  # value heads, key and value head sizes
LENGTHS = (1, 5, CHUNK, CHUNK + 1, 3 * CHUNK - 1, 200)

pytestmark = pytest.mark.filterwarnings("ignore:# The axis name")


def sequential(q, k, v, g, beta, s0):
    """Per row and head: S = e^g S; S = S + k (β (v - Sᵀk))ᵀ; y = Sᵀq, token by token."""
    s, ys = s0.clone(), []
    for t in range(q.shape[1]):
        q_t, k_t, v_t = q[:, t], k[:, t], v[:, t]  # (b, h, dk | dv)
        s = s * torch.exp(g[:, t])[..., None, None]
        recalled = torch.einsum("bhkv,bhk->bhv", s, k_t)
        s = s + torch.einsum("bhk,bhv->bhkv", k_t, (v_t - recalled) * beta[:, t][..., None])
        ys.append(torch.einsum("bhkv,bhk->bhv", s, q_t))
    return torch.stack(ys, 1), s


def make_inputs(batch: int, length: int, seed: int, decay: str = "spread"):
    """As a Gated DeltaNet hands them over: q and k L2-normed (q scaled by dk^-0.5), β in (0, 1),
    g = -A·softplus(x) <= 0 (from none, "none", to e^-60 a token, "total"); "repeated": one key
    over and over, written whole (β = 1) and never decayed, as a prompt that repeats a token
    gives (a chunk's triangular system at its least well-conditioned: a Neumann-series inverse
    loses three digits there)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, length, H, DK, generator=gen), dim=-1) for _ in range(2))
    if decay == "repeated":
        k = k[:, :1].expand(k.shape).clone()
    q = q * DK ** -0.5
    v = torch.randn(batch, length, H, DV, generator=gen)
    beta = torch.rand(batch, length, H, generator=gen)
    if decay == "repeated":
        beta = torch.ones(batch, length, H)
    g = {"spread": -torch.rand(batch, length, H, generator=gen) * 3, "none": torch.zeros(batch, length, H),
         "total": torch.full((batch, length, H), -60.0), "repeated": torch.zeros(batch, length, H)}[decay]
    s0 = torch.randn(batch, H, DK, DV, generator=gen)
    return q, k, v, g, beta, s0


class Rule(nn.Module):
    def forward(self, q, k, v, g, beta, s0):
        return gated_delta_chunked(q, k, v, g, beta, s0)


@pytest.fixture(scope="module")
def session():
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch, 1: length}
    program = torch.onnx.export(
        Rule().eval(), make_inputs(2, 20, seed=0), input_names=["q", "k", "v", "g", "beta", "s0"],
        output_names=["y", "s"], dynamic_shapes=(dims,) * 5 + ({0: batch},),
        custom_translation_table=translation_table(), dynamo=True, verbose=False)
    return ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("decay", ["spread", "none", "total", "repeated"])
def test_ort_matches_the_sequential_rule(session, decay):
    for length in LENGTHS:
        for batch in (1, 3):
            inputs = make_inputs(batch, length, seed=length + batch, decay=decay)
            got = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)})
            truth = sequential(*(x.double() for x in inputs))
            plain = sequential(*inputs)  # the float32 rule: the error a float32 export may have
            for name, g, t, p in zip(("y", "state"), got, truth, plain, strict=True):
                t, p = t.numpy(), p.numpy()
                assert g.shape == t.shape, f"{name} shape {g.shape}, expected {t.shape}"
                scale = float(np.abs(t).max())
                err, err32 = float(np.abs(g - t).max()), float(np.abs(p - t).max())
                assert err <= max(4 * err32, 1e-6 * scale), (
                    f"{decay} decays, b={batch} l={length}: {name} max |diff| {err:.2e} from float64 "
                    f"(the float32 sequential rule: {err32:.2e}; values up to {scale:.1f})")


def test_a_padded_token_leaves_the_state_as_it_is(session):
    """g = 0 and β = 0 past a row's end (how the prefill masks right-padded rows): the state after
    the padding is the state at the row's end."""
    q, k, v, g, beta, s0 = make_inputs(1, 23, seed=5)
    g[:, 9:], beta[:, 9:] = 0.0, 0.0
    _, state = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), (q, k, v, g, beta, s0),
                                                                      strict=True)})
    _, at_end = sequential(*(x[:, :9].double() if x.dim() > 3 or x is g or x is beta else x.double()
                             for x in (q, k, v, g, beta)), s0.double())
    np.testing.assert_allclose(state, at_end.numpy(), rtol=1e-5, atol=1e-5)


def test_eager_op_is_the_model_reference_and_the_reference_is_the_rule():
    inputs = make_inputs(2, 21, seed=3)
    y, s = gated_delta_chunked(*inputs)
    want_y, want_s = sequential(*inputs)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5)
    ref_y, ref_s = gated_delta_ref(*inputs)
    torch.testing.assert_close(ref_y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref_s, want_s, rtol=1e-5, atol=1e-5)
