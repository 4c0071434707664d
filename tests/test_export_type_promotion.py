"""`skipping_needless_type_promotion`: a program of one dtype skips torch.onnx's type-promotion
pass and comes out as the same graph; a program that mixes dtypes still gets its casts and
runs as eager does. (That the exporter is restored afterwards: test_export_decompose.py.)"""

import contextlib

import numpy as np
import onnx
import onnxruntime as ort
import torch

from seqexport.export.type_promotion import skipping_needless_type_promotion


class OneDtype(torch.nn.Module):
    """float32 throughout (float scalars with float tensors, int scalars with int tensors)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 6)

    def forward(self, x, n):  # x: (b, l, 8) float32, n: (b,) int64
        h = torch.softmax(self.proj(x) * 0.5 + 1.0, dim=-1)  # (b, l, 6)
        hidden = torch.arange(x.shape[1])[None, :] >= n[:, None]  # (b, l)
        return h.masked_fill(hidden[..., None], 0.0), n * 2 + 1


class Mixed(torch.nn.Module):
    """float32 + int64 tensors, an int tensor times a float, a float tensor plus an int: the
    pass must insert casts."""

    def forward(self, x, n):  # x: (b, l, 8) float32, n: (b,) int64
        return x + n[:, None, None] + 1, n * 0.5


def export(module, skip: bool, stats: dict | None = None) -> onnx.ModelProto:
    x, n = torch.randn(2, 3, 8), torch.tensor([1, 3])
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}, {0: torch.export.Dim("batch")})
    ctx = skipping_needless_type_promotion(stats) if skip else contextlib.nullcontext()
    with ctx, torch.no_grad():
        program = torch.onnx.export(module, (x, n), dynamo=True, opset_version=18, dynamic_shapes=dims,
                                    input_names=["x", "n"], output_names=["y", "m"])
    return program.model_proto


def run(model: onnx.ModelProto, x: np.ndarray, n: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "n": n})


def check_runs_as_eager(module, model) -> None:
    x, n = torch.randn(3, 5, 8), torch.tensor([0, 2, 5])  # other batch and length than traced
    with torch.no_grad():
        want = [t.numpy() for t in module(x, n)]
    for got, w in zip(run(model, x.numpy(), n.numpy()), want, strict=True):
        assert got.dtype == w.dtype
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_one_dtype_skips_the_pass_and_gives_the_same_graph():
    stats: dict = {}
    fast = export(OneDtype().eval(), skip=True, stats=stats)
    full = export(OneDtype().eval(), skip=False)
    assert stats == {"skipped": 1}
    assert fast.graph == full.graph  # the pass inserts nothing here: not even a name differs
    check_runs_as_eager(OneDtype().eval(), fast)


def test_mixed_dtypes_still_get_their_casts():
    stats: dict = {}
    model = export(Mixed().eval(), skip=True, stats=stats)
    assert stats == {"promoted": 1}
    assert "Cast" in {node.op_type for node in model.graph.node}
    check_runs_as_eager(Mixed().eval(), model)



class HalfAndFloat(torch.nn.Module):
    """A float16 tensor added to a float32 one (the result float32): one float width to the other,
    the cast the pass must still insert."""

    def forward(self, x, n):  # x: (b, l, 8) float32, n: (b,) int64
        return x.half() + x, n + 1


def test_two_float_widths_still_get_their_cast():
    stats: dict = {}
    model = export(HalfAndFloat().eval(), skip=True, stats=stats)
    assert stats == {"promoted": 1}
    check_runs_as_eager(HalfAndFloat().eval(), model)
