"""The RWKV-7 step graph's export-side formulation (`families/rwkv/step_graph.py`) is the eager
one-token step: the same logits and state from random states, in float32 and float16, and
its ONNX export keeps the step graph's I/O and the eager parameter names (int8 matches them)."""

import onnx
import pytest
import torch
from seqexport.models.rwkv import RwkvConfig, RwkvLM

from seqexport.checkpoints.presets import build_preset
from seqexport.families.rwkv.export import StepGraph, export_rwkv
from seqexport.families.rwkv.step_graph import FastStepGraph


def _state(model: RwkvLM, batch: int, dtype: torch.dtype, gen: torch.Generator) -> list[torch.Tensor]:
    """A random nonzero state (att_shift, wkv, ffn_shift per layer); the WKV stays float32."""
    out = []
    for att, wkv, ffn in model.allocate_inference_cache(batch):
        out += [torch.randn(att.shape, generator=gen).to(dtype), 0.3 * torch.randn(wkv.shape, generator=gen),
                torch.randn(ffn.shape, generator=gen).to(dtype)]
    return out


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-2)])
@pytest.mark.parametrize("batch", [1, 3])
def test_fast_step_equals_the_eager_step(dtype, tol, batch):
    torch.manual_seed(0)
    model = RwkvLM(RwkvConfig(n_embd=32, n_layer=3, vocab_size=50, head_size=8)).to(dtype).eval()
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, 50, (batch, 1), generator=gen)
    state = _state(model, batch, dtype, gen)
    with torch.no_grad():
        want = StepGraph(model)(ids, *state)  # the eager model's own step
        got = FastStepGraph(model)(ids, *state)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.float(), w.float(), atol=tol, rtol=tol)


def test_exported_step_keeps_its_io_and_parameter_names(tmp_path):
    ckpt = build_preset("rwkv", "tiny", seed=0)
    export_rwkv(ckpt, "tiny", tmp_path / "rwkv")
    model = onnx.load(str(tmp_path / "rwkv" / "step.onnx"), load_external_data=False)
    g = model.graph
    assert [i.name for i in g.input][:4] == ["input_ids", "past_att_shift.0", "past_wkv_state.0", "past_ffn_shift.0"]
    assert [o.name for o in g.output][:2] == ["logits", "present_att_shift.0"]
    weights = {n.input[1] for n in g.node if n.op_type in ("MatMul", "Gemm")}
    for p in ("att.receptance.weight", "att.w1", "att.a2", "ffn.key.weight"):
        assert any(p in w for w in weights), (p, sorted(weights))
