"""`skipping_needless_decompositions`: the graph torch.onnx makes without its second trace
is the one it makes with it (names of torch's own constants aside), and runs as eager does;
a program holding an op ONNX lacks still goes through the full decomposition."""

import contextlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

from seqexport.export.decompose import skipping_needless_decompositions
from seqexport.export.type_promotion import skipping_needless_type_promotion


class AsIs(torch.nn.Module):
    """Ops ONNX implements, plus the calls the pass rewrites: to(own dtype), to(other dtype),
    a reshape of a transposed tensor, chunk and split along dim=-1."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 12)
        self.scale = torch.nn.Parameter(torch.rand(6))

    def forward(self, x):  # x: (b, l, 8)
        h = self.proj(x).to(torch.float32)  # (b, l, 12)
        a, b = h.chunk(2, dim=-1)  # (b, l, 6) each
        c, _ = torch.split(a, [4, 2], dim=-1)  # (b, l, 4)
        t = (b * self.scale.to(x.dtype)).transpose(1, 2)  # (b, 6, l)
        flat = t.reshape(t.shape[0], t.shape[1] * t.shape[2])  # (b, 6 * l)
        wide = c.to(torch.float64).sum(-1).to(torch.float32) + 1.0  # (b, l)
        return flat, wide


class Lacking(torch.nn.Module):
    """rot90 has no ONNX translation: the decomposition must run."""

    def forward(self, x):  # x: (b, l, 8)
        return torch.rot90(x, 1, (1, 2)) * 2.0


def export(module, x, skip: bool, stats: dict | None = None, outputs=("flat", "wide")) -> onnx.ModelProto:
    """The ONNX graph of `module` (I/O named, as seqexport names them, so that only torch's own
    value names are left to differ)."""
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}
    ctx = skipping_needless_decompositions(stats) if skip else contextlib.nullcontext()
    with ctx, torch.no_grad():
        program = torch.onnx.export(module, (x,), dynamo=True, opset_version=18, dynamic_shapes=(dims,),
                                    input_names=["x"], output_names=list(outputs))
    return program.model_proto


def canonical(model: onnx.ModelProto) -> list:
    """Nodes in order with inputs/outputs renamed by first appearance (graph I/O and named
    parameters keep theirs; torch's val_N constants are compared by value), attributes sorted."""
    g = model.graph
    keep = {v.name for v in (*g.input, *g.output)}
    values = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    keep |= {n for n in values if not n.startswith("val_")}
    names: dict[str, str] = {}

    def name(v):
        if v in keep or v == "":
            return v
        return names.setdefault(v, f"v{len(names)}")

    def constant(v):
        a = values.get(v)
        return None if a is None else (a.dtype.str, a.shape, a.tobytes())

    return [(n.op_type, n.domain, tuple((name(i), constant(i)) for i in n.input), tuple(name(o) for o in n.output),
             tuple(sorted((a.name, str(onnx.helper.get_attribute_value(a))) for a in n.attribute)))
            for n in g.node]


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})


def test_graph_without_the_second_trace_is_the_same_and_runs_as_eager():
    module = AsIs().eval()
    x = torch.randn(2, 3, 8)
    stats: dict = {}
    fast = export(module, x, skip=True, stats=stats)
    full = export(AsIs().eval(), x, skip=False)
    assert stats == {"skipped": 1}
    assert canonical(fast) == canonical(full)
    assert "scale" in {t.name for t in fast.graph.initializer}  # a parameter keeps its name
    for shape in ((2, 3, 8), (1, 7, 8)):  # other batch and length than traced
        xs = torch.randn(*shape)
        with torch.no_grad():
            want = [t.numpy() for t in module(xs)]
        for got, w in zip(run(fast, xs.numpy()), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_program_with_an_op_onnx_lacks_is_decomposed():
    module = Lacking().eval()
    stats: dict = {}
    model = export(module, torch.randn(2, 3, 8), skip=True, stats=stats, outputs=("y",))
    assert stats == {"decomposed": 1}
    xs = torch.randn(3, 5, 8)
    np.testing.assert_allclose(run(model, xs.numpy())[0], module(xs).numpy(), rtol=1e-6)


@pytest.mark.parametrize("skipping, patched", [(skipping_needless_decompositions, "decompose_with_registry"),
                                               (skipping_needless_type_promotion, "insert_type_promotion_nodes")])
def test_the_exporter_is_restored_afterwards(skipping, patched):
    from torch.onnx._internal.exporter import _fx_passes

    before = getattr(_fx_passes, patched)
    with pytest.raises(RuntimeError), skipping():
        assert getattr(_fx_passes, patched) is not before
        raise RuntimeError("an export failing midway")
    assert getattr(_fx_passes, patched) is before


class CastOut(torch.nn.Module):
    """An output that is a `to(dtype)` call: the program's signature names that node."""

    def forward(self, x):  # x: (b, l, 8)
        return (x * 2.0).to(torch.float64)


def test_a_cast_output_is_left_to_the_decomposition():
    stats: dict = {}
    model = export(CastOut().eval(), torch.randn(2, 3, 8), skip=True, stats=stats, outputs=("y",))
    assert stats == {"decomposed": 1}
    xs = torch.randn(3, 5, 8)
    got = run(model, xs.numpy())[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, (xs * 2.0).double().numpy())
