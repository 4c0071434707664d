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
from tests.lowering import assert_near_float64, assert_op_is_sequential, subnormal_tensors

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
    loses three digits there). "reflecting": β in (0, 2) and no decay, as OLMo-hybrid's
    allow_neg_eigval gives (a write can flip the state along k); "reflected": one key over and
    over at β = 2, the state reflected by I - 2kkᵀ every token."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, length, H, DK, generator=gen), dim=-1) for _ in range(2))
    if decay in ("repeated", "reflected"):
        k = k[:, :1].expand(k.shape).clone()
    q = q * DK ** -0.5
    v = torch.randn(batch, length, H, DV, generator=gen)
    beta = torch.rand(batch, length, H, generator=gen)
    if decay in ("repeated", "reflected", "reflecting"):
        beta = {"repeated": torch.ones(batch, length, H), "reflected": torch.full((batch, length, H), 2.0),
                "reflecting": 2 * beta}[decay]
    g = {"spread": -torch.rand(batch, length, H, generator=gen) * 3, "total": torch.full((batch, length, H), -60.0)
         }.get(decay, torch.zeros(batch, length, H))
    s0 = torch.randn(batch, H, DK, DV, generator=gen)
    return q, k, v, g, beta, s0


class Rule(nn.Module):
    def forward(self, q, k, v, g, beta, s0):
        return gated_delta_chunked(q, k, v, g, beta, s0)


def exported_rule():
    """The op alone as an ONNX model (dynamic batch and length)."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch, 1: length}
    return torch.onnx.export(
        Rule().eval(), make_inputs(2, 20, seed=0), input_names=["q", "k", "v", "g", "beta", "s0"],
        output_names=["y", "s"], dynamic_shapes=(dims,) * 5 + ({0: batch},),
        custom_translation_table=translation_table(), dynamo=True, verbose=False).model_proto


@pytest.fixture(scope="module")
def session():
    return ort.InferenceSession(exported_rule().SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("decay", ["spread", "none", "total", "repeated", "reflecting"])
def test_ort_matches_the_sequential_rule(session, decay):
    for length in LENGTHS:
        for batch in (1, 3):
            assert_near_float64(session, make_inputs(batch, length, seed=length + batch, decay=decay), sequential,
                                f"{decay} decays, b={batch} l={length}")


def test_exact_reflections_lose_no_more_than_transformers_chunked_rule(session):
    """One key over and over at β = 2: the state is reflected every token, and the chunk's closed
    form cancels terms ~C times the state's size (float32 rounding grows with them): no chunked
    form keeps the sequential rule's error. Ours stays within 2x of transformers' own chunked
    rule in float32 (`torch_chunk_gated_delta_rule`, what OLMo-hybrid runs), both from float64."""
    chunked = pytest.importorskip("transformers.models.olmo_hybrid.modeling_olmo_hybrid").torch_chunk_gated_delta_rule
    for length in (16, CHUNK + 1, 200):
        q, k, v, g, beta, s0 = inputs = make_inputs(3, length, seed=length, decay="reflected")
        got = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)})
        truth = sequential(*(x.double() for x in inputs))
        theirs = chunked(q * DK ** 0.5, k, v, g=g, beta=beta, initial_state=s0, output_final_state=True,
                         use_qk_l2norm_in_kernel=False)  # (they scale q by dk^-0.5 themselves)
        for name, ours, t, their in zip(("y", "state"), got, truth, theirs, strict=True):
            err, their_err = (float((torch.as_tensor(x).double() - t).abs().max()) for x in (ours, their))
            assert err <= 2 * their_err + 1e-6 * float(t.abs().max()), (
                f"l={length} {name}: {err:.2e} from float64, transformers' chunked rule {their_err:.2e}")


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-head", "per-channel"])
def test_a_padded_token_leaves_the_state_as_it_is(request, per_channel):
    """g = 0 and β = 0 past a row's end (how the prefill masks right-padded rows): the state after
    the padding is the state at the row's end, a decay per head or per key channel."""
    run = request.getfixturevalue("channel_session" if per_channel else "session")
    q, k, v, g, beta, s0 = (per_channel_inputs if per_channel else make_inputs)(1, 23, seed=5)
    g[:, 9:], beta[:, 9:] = 0.0, 0.0
    _, state = run.run(None, {i.name: x.numpy() for i, x in zip(run.get_inputs(), (q, k, v, g, beta, s0),
                                                                  strict=True)})
    rule = sequential_per_channel if per_channel else sequential
    _, at_end = rule(*(x[:, :9].double() for x in (q, k, v, g, beta)), s0.double())
    np.testing.assert_allclose(state, at_end.numpy(), rtol=1e-5, atol=1e-5)


def test_eager_op_is_the_model_reference_and_the_reference_is_the_rule():
    inputs = make_inputs(2, 21, seed=3)
    assert_op_is_sequential(gated_delta_chunked, inputs, sequential)
    assert_op_is_sequential(gated_delta_ref, inputs, sequential)


def test_strong_decays_leave_no_subnormal_float_anywhere_in_the_graph():
    """Decays as strong as Qwen3.5's initialisation gives them (e^g down to e^-16 a token): no
    float in any of the lowering's tensors (every top-level node's output, the Scan's inputs
    among them) is subnormal (nonzero, below 1.2e-38). Intel's cores multiply those many times
    slower; an earlier form of the lowering formed products of decays that reached them
    (Qwen3.5-0.8B's 1024-token prefill on an Intel Xeon: 13.2 s, 7.6 s with subnormals flushed)."""
    q, k, v, _, beta, s0 = make_inputs(2, 4 * CHUNK + 3, seed=11)
    g = -16 * torch.rand(q.shape[:3], generator=torch.Generator().manual_seed(12))  # e^g from 1 to e^-16
    feeds = dict(zip(["q", "k", "v", "g", "beta", "s0"], (x.numpy() for x in (q, k, v, g, beta, s0)), strict=True))
    seen, subnormal = subnormal_tensors(exported_rule(), feeds)
    assert seen > 30, f"only {seen} float tensors seen"
    assert not subnormal, f"subnormal floats in {len(subnormal)} tensors: {dict(list(subnormal.items())[:8])}"


# ---- a decay per key channel (Kimi-Linear's KDA): the same op, g (b, l, h, dk) ----

def sequential_per_channel(q, k, v, g, beta, s0):
    """Per row and head: S = diag(e^g) S (row a of S times e^{g_a}); S = S + k (β (v - Sᵀk))ᵀ;
    y = Sᵀq, token by token."""
    s, ys = s0.clone(), []
    for t in range(q.shape[1]):
        q_t, k_t, v_t = q[:, t], k[:, t], v[:, t]  # (b, h, dk | dv)
        s = s * torch.exp(g[:, t])[..., None]  # (b, h, dk, dv): each key row its own decay
        recalled = torch.einsum("bhkv,bhk->bhv", s, k_t)
        s = s + torch.einsum("bhk,bhv->bhkv", k_t, (v_t - recalled) * beta[:, t][..., None])
        ys.append(torch.einsum("bhkv,bhk->bhv", s, q_t))
    return torch.stack(ys, 1), s


def per_channel_inputs(batch: int, length: int, seed: int, decay: str = "spread"):
    """`make_inputs` with g (b, l, h, dk): "spread" a rate per channel (e^g from 1 to e^-3 a
    token), "split" half of the channels never decayed and half erased every token (e^-60),
    "total", "none", and "repeated" (one key, β = 1, no decay)."""
    q, k, v, _, beta, s0 = make_inputs(batch, length, seed, "repeated" if decay == "repeated" else "spread")
    gen = torch.Generator().manual_seed(seed + 1)
    shape = (batch, length, H, DK)
    if decay == "spread":
        g = -torch.rand(shape, generator=gen) * 3
    elif decay == "split":
        g = torch.where(torch.arange(DK) < DK // 2, 0.0, -60.0).expand(shape).clone()
    else:
        g = torch.full(shape, -60.0 if decay == "total" else 0.0)
    return q, k, v, g, beta, s0


@pytest.fixture(scope="module")
def channel_session():
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch, 1: length}
    proto = torch.onnx.export(
        Rule().eval(), per_channel_inputs(2, 20, seed=0), input_names=["q", "k", "v", "g", "beta", "s0"],
        output_names=["y", "s"], dynamic_shapes=(dims,) * 5 + ({0: batch},),
        custom_translation_table=translation_table(), dynamo=True, verbose=False).model_proto
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("decay", ["spread", "split", "none", "total", "repeated"])
def test_per_channel_decays_match_the_sequential_rule(channel_session, decay):
    for length in LENGTHS:
        for batch in (1, 3):
            assert_near_float64(channel_session, per_channel_inputs(batch, length, seed=length + batch, decay=decay),
                                sequential_per_channel, f"per-channel {decay} decays, b={batch} l={length}")


def test_per_channel_decays_match_transformers_kda():
    """The eager rule (what the model and the op run) against transformers' own chunked KDA
    (`chunk_kimi_delta_attention`, Kimi-Linear's torch path), both from the same inputs."""
    kda = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear").chunk_kimi_delta_attention
    q, k, v, g, beta, s0 = inputs = per_channel_inputs(2, 70, seed=4)
    y, s = gated_delta_ref(*inputs)
    their_y, their_s = kda(q * DK ** 0.5, k, v, g, beta, initial_state=s0, output_final_state=True)
    torch.testing.assert_close(y, their_y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, their_s, rtol=1e-4, atol=1e-4)


def test_per_channel_eager_rule_is_the_sequential_rule():
    inputs = per_channel_inputs(2, 21, seed=3)
    assert_op_is_sequential(gated_delta_chunked, inputs, sequential_per_channel)
    assert_op_is_sequential(gated_delta_ref, inputs, sequential_per_channel)


# ---- per-channel decays the caller bounds (Ling 3's g = bound σ(·) > bound): the factored form ----

BOUND = -5.0  # Ling 3's kda_lower_bound: a chunk's log decays span at most 15 x 5 = 75


class BoundedRule(nn.Module):
    def __init__(self, lower_bound: float):
        super().__init__()
        self.lower_bound = lower_bound

    def forward(self, q, k, v, g, beta, s0):
        return gated_delta_chunked(q, k, v, g, beta, s0, lower_bound=self.lower_bound)


def bounded_inputs(batch: int, length: int, seed: int, decay: str = "spread", bound: float = BOUND):
    """`per_channel_inputs` with g in [bound, 0]: "spread" bound σ(A x) as Ling 3's gate gives it
    (most near 0 or the bound), "bound" every g at the bound (the widest span a chunk can have),
    "split" half of the channels never decayed and half at the bound, "repeated" (one key, β = 1,
    no decay)."""
    q, k, v, g, beta, s0 = per_channel_inputs(batch, length, seed, "repeated" if decay == "repeated" else "none")
    gen = torch.Generator().manual_seed(seed + 2)
    if decay == "spread":
        g = bound * torch.sigmoid(torch.randn(g.shape, generator=gen) * (1 + 15 * torch.rand(H, 1, generator=gen)))
    elif decay == "bound":
        g = torch.full(g.shape, bound)
    elif decay == "split":
        g = torch.where(torch.arange(DK) < DK // 2, 0.0, bound).expand(g.shape).clone()
    return q, k, v, g, beta, s0


def _bounded_proto(bound: float):
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch, 1: length}
    return torch.onnx.export(
        BoundedRule(bound).eval(), bounded_inputs(2, 20, seed=0, bound=bound),
        input_names=["q", "k", "v", "g", "beta", "s0"], output_names=["y", "s"],
        dynamic_shapes=(dims,) * 5 + ({0: batch},), custom_translation_table=translation_table(), dynamo=True,
        verbose=False).model_proto


def _reduce_sums(proto) -> int:
    return sum(n.op_type == "ReduceSum" for n in proto.graph.node)


@pytest.fixture(scope="module")
def bounded_session():
    return ort.InferenceSession(_bounded_proto(BOUND).SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("decay", ["spread", "bound", "split", "none", "repeated"])
def test_bounded_per_channel_decays_match_the_sequential_rule(bounded_session, channel_session, decay):
    """The factored form (the decays taken out of the chunk's key products about its middle
    token), down to every g at the bound: from the float64 rule, within 4x the float32 rule's
    error, 1e-6 of the values, or the summed per-channel form's own error on the same inputs,
    whichever is largest (at Ling 3's gate both chunked forms reach 1.9e-6 where the float32 rule
    has 2.6e-7: a chunk's closed form, not the factoring)."""
    for length in LENGTHS:
        for batch in (1, 3):
            inputs = bounded_inputs(batch, length, seed=length + batch, decay=decay)
            truth = sequential_per_channel(*(x.double() for x in inputs))
            plain = sequential_per_channel(*inputs)
            feeds = {i.name: x.numpy() for i, x in zip(bounded_session.get_inputs(), inputs, strict=True)}
            got, summed = bounded_session.run(None, feeds), channel_session.run(None, feeds)
            for name, g, s, t, p in zip(("y", "state"), got, summed, truth, plain, strict=True):
                t = t.numpy()
                err, bound = float(np.abs(g - t).max()), max(4 * float(np.abs(p.numpy() - t).max()),
                                                             1e-6 * float(np.abs(t).max()), float(np.abs(s - t).max()))
                assert err <= bound, f"bounded {decay}, b={batch} l={length}: {name} {err:.2e} from float64 > {bound:.2e}"


def test_a_bound_takes_the_factored_form_only_where_a_chunk_stays_in_float32():
    """Told g >= -5, the lowering forms L and A as plain products: no (C, C, dk) decays summed (two
    ReduceSums fewer than without a bound). A bound of -6 would let a chunk span e^90, past
    float32 once multiplied out: that export keeps the summed form, and is right at its bound."""
    unbounded = _reduce_sums(torch.onnx.export(
        Rule().eval(), per_channel_inputs(2, 20, seed=0), custom_translation_table=translation_table(), dynamo=True,
        verbose=False).model_proto)
    assert _reduce_sums(_bounded_proto(BOUND)) == unbounded - 2
    wide = _bounded_proto(-6.0)
    assert _reduce_sums(wide) == unbounded
    session = ort.InferenceSession(wide.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_near_float64(session, bounded_inputs(2, 3 * CHUNK + 5, seed=9, decay="bound", bound=-6.0),
                        sequential_per_channel, "bound -6, every g at it")


def test_bounded_strong_decays_leave_no_subnormal_float_in_the_graph():
    """The factored form's factors lie within e^{±40} (the chunk's middle token its reference):
    at Ling 3's gate, most decays near the bound, no tensor of the graph holds a subnormal float."""
    feeds = dict(zip(["q", "k", "v", "g", "beta", "s0"],
                     (x.numpy() for x in bounded_inputs(2, 4 * CHUNK + 3, seed=11)), strict=True))
    seen, subnormal = subnormal_tensors(_bounded_proto(BOUND), feeds)
    assert seen > 30, f"only {seen} float tensors seen"
    assert not subnormal, f"subnormal floats in {len(subnormal)} tensors: {dict(list(subnormal.items())[:8])}"
