"""The Mamba step graph's export-side formulation (`step_graph.lm_step`) and the softplus
translation, against the unmodified eager model: eagerly, and through ONNX Runtime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from seqexport.families.mamba import specs as S
from seqexport.families.mamba.scan import custom_translation_table
from seqexport.families.mamba.step_graph import lm_step
from tests.conftest import mamba_tiny_that_depends_on_everything


def random_state(model, batch, g):
    c = model.config
    return [(torch.randn(batch, c.d_inner, c.d_conv, generator=g), torch.randn(batch, c.d_inner, c.d_state, generator=g))
            for _ in range(c.n_layer)]


@pytest.mark.parametrize("batch", [1, 5])
def test_lm_step_equals_the_eager_step(batch):
    model = mamba_tiny_that_depends_on_everything().model.eval()
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), generator=g)
    state = random_state(model, batch, g)
    with torch.no_grad():
        want_logits, want_state = model.step(ids, state)
        logits, new_state = lm_step(model, ids, state)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    for (c, s), (wc, ws) in zip(new_state, want_state, strict=True):
        torch.testing.assert_close(c, wc, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(s, ws, atol=1e-5, rtol=1e-5)


class Softplus(torch.nn.Module):
    def __init__(self, beta=1.0):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        return F.softplus(x, beta=self.beta)


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_softplus_translation_matches_torch_without_overflow(beta, tmp_path):
    x = torch.cat([torch.linspace(-120, 120, 2001), torch.tensor([-1e4, -30.0, -1e-3, 0.0, 1e-3, 19.9, 20.1, 1e4])])
    program = torch.onnx.export(Softplus(beta), (x,), dynamo=True, custom_translation_table=custom_translation_table(None))
    types = {n.op_type for n in program.model_proto.graph.node}
    assert "Softplus" not in types and "Sigmoid" in types
    path = tmp_path / "softplus.onnx"
    program.save(str(path))
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    want = F.softplus(x.double(), beta=beta).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-6)


def test_step_graph_at_batch_matches_the_eager_step(mamba_exports):
    """step.onnx (traced from lm_step) at batch 6 from a random state vs `MambaLM.step`."""
    ckpt, folder = mamba_exports("loop")
    model = ckpt.model.eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (6, 1), generator=g)
    state = random_state(model, 6, g)
    feed = {S.INPUT_IDS: ids.numpy()}
    for i, (c, s) in enumerate(state):
        feed[S.past_conv(i)], feed[S.past_ssm(i)] = c.numpy(), s.numpy()
    sess = ort.InferenceSession(str(folder / "step.onnx"), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    graph = onnx.load(str(folder / "step.onnx"), load_external_data=False).graph
    assert "Softplus" not in {n.op_type for n in graph.node}  # the vectorised translation
    with torch.no_grad():
        want_logits, want_state = model.step(ids, state)
    np.testing.assert_allclose(out[S.LOGITS][:, 0], want_logits.numpy(), atol=1e-4, rtol=1e-4)
    for i, (wc, ws) in enumerate(want_state):
        np.testing.assert_allclose(out[S.present_conv(i)], wc.numpy(), atol=1e-6, rtol=0)
        np.testing.assert_allclose(out[S.present_ssm(i)], ws.numpy(), atol=1e-4, rtol=1e-4)
