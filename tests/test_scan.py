"""The three ONNX lowerings of the selective scan against a sequential reference.

Each lowering is exported once (dynamic batch; dynamic length except `unrolled`)
and the one graph is run in onnxruntime at every length and batch.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from seqexport.families.mamba.scan import LOWERINGS, custom_translation_table, scan_for

D_IN, N = 8, 4  # d_inner, d_state
LENGTHS = (1, 2, 7, 16, 17, 64, 300)
UNROLLED_LENGTH = 19  # a full chunk and a partial one
ATOL = 1e-4

pytestmark = pytest.mark.filterwarnings("ignore:# The axis name")


def scan_reference(u, delta, A, B, C, D, h0):
    """h = exp(Δ_t A) h + (Δ_t u_t) B_t; y_t = <h, C_t> + D u_t, one step at a time."""
    h, ys = h0, []
    for t in range(u.shape[1]):
        h = (
            torch.exp(delta[:, t, :, None] * A) * h
            + (delta[:, t] * u[:, t])[..., None] * B[:, t, None, :]
        )
        ys.append((h * C[:, t, None, :]).sum(-1) + D * u[:, t])
    return torch.stack(ys, dim=1), h


class ScanModule(nn.Module):
    """A, D as in the Mamba mixer: A = -exp(A_log) computed in forward, D a parameter."""

    def __init__(self, lowering: str):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.A_log = nn.Parameter(torch.log(torch.rand(D_IN, N, generator=g) * 4 + 0.5))
        self.D = nn.Parameter(torch.randn(D_IN, generator=g))
        self.scan = scan_for(lowering)

    def A(self) -> torch.Tensor:
        return -torch.exp(self.A_log)

    def forward(self, u, delta, B, C, h0):
        return self.scan(u, delta, self.A(), B, C, self.D, h0)


def make_inputs(b: int, length: int, seed: int, dt_max: float = 1.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, length, D_IN, generator=g),  # u
        torch.rand(b, length, D_IN, generator=g) * dt_max,  # delta
        torch.randn(b, length, N, generator=g),  # B
        torch.randn(b, length, N, generator=g),  # C
        torch.randn(b, D_IN, N, generator=g),  # h0, non-zero
    )


def reference_of(module: ScanModule, inputs):
    u, delta, B, C, h0 = inputs
    with torch.no_grad():
        return scan_reference(u, delta, module.A(), B, C, module.D, h0)


@pytest.fixture(scope="module", params=LOWERINGS)
def exported(request):
    """(lowering, module, ONNX model, ORT session): one export of a fresh module per lowering."""
    lowering = request.param
    module = ScanModule(lowering).eval()
    batch = torch.export.Dim("batch")
    if lowering == "unrolled":
        example, dims = make_inputs(2, UNROLLED_LENGTH, seed=1), {0: batch}
    else:
        example, dims = make_inputs(2, 20, seed=1), {0: batch, 1: torch.export.Dim("length")}
    program = torch.onnx.export(
        module,
        example,
        input_names=["u", "delta", "B", "C", "h0"],
        output_names=["y", "h_last"],
        dynamic_shapes=(dims, dims, dims, dims, {0: batch}),
        custom_translation_table=custom_translation_table(lowering),
        dynamo=True,
        verbose=False,
    )
    model = program.model_proto
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lowering, module, model, session


def run_ort(session, inputs):
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)}
    return session.run(None, feeds)


def assert_close(got, want, what: str):
    for name, g, w in zip(("y", "h_last"), got, want, strict=True):
        g = np.asarray(g)
        w = w.detach().numpy()
        assert g.shape == w.shape, f"{what}: {name} shape {g.shape} != {w.shape}"
        assert np.isfinite(g).all(), f"{what}: {name} has NaN/Inf"
        err = float(np.abs(g - w).max())
        assert err <= ATOL, f"{what}: {name} max |diff| {err:.2e} > {ATOL}"


def test_ort_matches_reference(exported):
    lowering, module, _, session = exported
    lengths = (UNROLLED_LENGTH,) if lowering == "unrolled" else LENGTHS
    for length in lengths:
        for b in (1, 3):
            inputs = make_inputs(b, length, seed=100 + length + b)
            got = run_ort(session, inputs)
            assert_close(got, reference_of(module, inputs), f"{lowering} ORT b={b} l={length}")


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_eager_matches_reference(lowering):
    module = ScanModule(lowering)
    for length in (1, 7, 17, 64):
        inputs = make_inputs(3, length, seed=length)
        with torch.no_grad():
            got = module(*inputs)
        assert_close(got, reference_of(module, inputs), f"{lowering} eager l={length}")


def test_check_model_and_dynamic_inputs(exported):
    lowering, _, model, _ = exported
    onnx.checker.check_model(model, full_check=True)
    dims = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in model.graph.input
    }
    for name in ("u", "delta", "B", "C", "h0"):
        assert isinstance(dims[name][0], str), f"{lowering}: {name} batch is static: {dims[name]}"
    length = dims["u"][1]
    if lowering == "unrolled":
        assert length == UNROLLED_LENGTH
    else:
        assert isinstance(length, str), f"{lowering}: length is static: {dims['u']}"
        assert all(dims[name][1] == length for name in ("delta", "B", "C"))


def test_control_flow_nodes(exported):
    lowering, _, model, _ = exported
    ops = [node.op_type for node in model.graph.node]
    control = [op for op in ops if op in ("Scan", "Loop", "If")]
    want = {"loop": ["Scan"], "parallel": ["Loop"], "unrolled": []}[lowering]
    assert control == want, f"{lowering}: control-flow nodes {control}"
    assert not model.functions, f"{lowering}: unexpected local functions"


def test_large_dt_is_stable(exported):
    lowering, module, _, session = exported
    if lowering == "unrolled":
        pytest.skip("fixed length")
    inputs = make_inputs(1, 1024, seed=7, dt_max=5.0)
    want = reference_of(module, inputs)
    assert_close(run_ort(session, inputs), want, f"{lowering} ORT dt~U(0,5) l=1024")
    with torch.no_grad():
        assert_close(module(*inputs), want, f"{lowering} eager dt~U(0,5) l=1024")


def test_unknown_lowering_names_the_choices():
    with pytest.raises(ValueError, match=r"'scan'.*loop.*unrolled.*parallel"):
        scan_for("scan")
    with pytest.raises(ValueError, match="'Loop'"):
        custom_translation_table("Loop")
    # the unrolled lowering is plain torch ops: only softplus (Δ) gets a translation of ours
    assert set(custom_translation_table("unrolled")) == {torch.ops.aten.softplus.default}


def test_unrolled_refuses_a_symbolic_length():
    # torch.onnx.export would fall back to strict tracing and come out static
    # (DESIGN §6); plain non-strict torch.export shows the error.
    module, length = ScanModule("unrolled"), torch.export.Dim("length")
    dims = {1: length}
    with pytest.raises(ValueError, match="static sequence length"):
        torch.export.export(
            module,
            make_inputs(2, 20, seed=0),
            dynamic_shapes=(dims, dims, dims, dims, None),
            strict=False,
        )
