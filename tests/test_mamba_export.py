"""Mamba export, each scan lowering: ONNX Runtime CPU vs the eager model's full forward."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import seqexport.runtime as rt
from seqexport.families.mamba import specs as S
from tests.conftest import UNROLLED_LEN

ATOL = 1e-4
LOWERINGS = ["loop", "unrolled", "parallel"]


class Graphs:
    def __init__(self, ckpt, folder):
        self.model, self.config = ckpt.model, ckpt.config
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        cpu = ["CPUExecutionProvider"]
        self.prefill = ort.InferenceSession(str(folder / "prefill.onnx"), opts, providers=cpu)
        self.step = ort.InferenceSession(str(folder / "step.onnx"), opts, providers=cpu)

    def zeros(self, batch):
        c = self.config
        return [(np.zeros((batch, c.d_inner, c.d_conv), np.float32), np.zeros((batch, c.d_inner, c.d_state), np.float32))
                for _ in range(c.n_layer)]

    def run(self, sess, ids, state):
        feed = {S.INPUT_IDS: ids}
        for i, (conv, ssm) in enumerate(state):
            feed[S.past_conv(i)] = conv
            feed[S.past_ssm(i)] = ssm
        names = [i.name for i in sess.get_inputs()]
        if S.ATTENTION_MASK in names:
            feed[S.ATTENTION_MASK] = np.ones_like(ids)  # every row all tokens
        if S.LOGITS_TO_KEEP in names:
            feed[S.LOGITS_TO_KEEP] = np.array([0], np.int64)  # every position's logits
        out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
        return out[S.LOGITS], [(out[S.present_conv(i)], out[S.present_ssm(i)]) for i in range(len(state))]


def eager(model, ids, state=None):
    st = None if state is None else [(torch.from_numpy(c), torch.from_numpy(s)) for c, s in state]
    with torch.no_grad():
        logits, new = model(torch.from_numpy(ids), st)
    return logits.numpy(), [(c.numpy(), s.numpy()) for c, s in new]


def assert_states_close(a, b, atol=ATOL):
    for (ca, sa), (cb, sb) in zip(a, b, strict=True):
        np.testing.assert_allclose(ca, cb, atol=atol, rtol=0)
        np.testing.assert_allclose(sa, sb, atol=atol, rtol=0)


@pytest.fixture(scope="module", params=LOWERINGS)
def graphs(request, mamba_exports):
    return request.param, Graphs(*mamba_exports(request.param))


def lengths_for(lowering):
    return [UNROLLED_LEN] if lowering == "unrolled" else [1, 2, 7, 64, 300]


def test_graphs_valid_dynamic_and_shaped_as_lowering(mamba_exports):
    for lowering in LOWERINGS:
        _, folder = mamba_exports(lowering)
        pre = onnx.load(str(folder / "prefill.onnx"))
        onnx.checker.check_model(pre, full_check=True)
        dims = [d.dim_param or d.dim_value for d in pre.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["batch", UNROLLED_LEN if lowering == "unrolled" else "seq_len"]
        ops = [n.op_type for n in pre.graph.node]
        if lowering == "loop":
            assert sum(op in ("Scan", "Loop") for op in ops) == 2  # one per layer, nothing else loops
        step = onnx.load(str(folder / "step.onnx"))
        assert not any(n.op_type in ("Scan", "Loop") for n in step.graph.node)


@pytest.mark.parametrize("batch", [1, 3])
def test_prefill_matches_eager(graphs, batch):
    lowering, g = graphs
    rng = np.random.default_rng(batch)
    for length in lengths_for(lowering):
        ids = rng.integers(0, g.config.vocab_size, (batch, length))
        logits, state = g.run(g.prefill, ids, g.zeros(batch))
        ref_logits, ref_state = eager(g.model, ids)
        np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0, err_msg=f"L={length}")
        assert_states_close(state, ref_state)


def test_prefill_from_nonzero_state(graphs):
    lowering, g = graphs
    rng = np.random.default_rng(5)
    c = g.config
    state = [(rng.normal(size=(2, c.d_inner, c.d_conv)).astype(np.float32),
              rng.normal(size=(2, c.d_inner, c.d_state)).astype(np.float32)) for _ in range(c.n_layer)]
    ids = rng.integers(0, c.vocab_size, (2, lengths_for(lowering)[-1]))
    logits, new = g.run(g.prefill, ids, state)
    ref_logits, ref_new = eager(g.model, ids, state)
    np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0)
    assert_states_close(new, ref_new)


def test_50_steps_after_prefill_match_full_forward(graphs):
    lowering, g = graphs
    rng = np.random.default_rng(9)
    length = UNROLLED_LEN if lowering == "unrolled" else 21  # a prompt longer than two scan chunks (8 each)
    ids = rng.integers(0, g.config.vocab_size, (2, length))
    logits, state = g.run(g.prefill, ids, g.zeros(2))
    seq = np.concatenate([ids, logits[:, -1].argmax(-1)[:, None]], axis=1)
    for _ in range(50):
        logits, state = g.run(g.step, seq[:, -1:], state)
        ref, _ = eager(g.model, seq)  # full forward over the whole sequence, no state carried
        np.testing.assert_allclose(logits[:, -1], ref[:, -1], atol=ATOL, rtol=0)
        seq = np.concatenate([seq, logits[:, -1].argmax(-1)[:, None]], axis=1)


def test_prefill_state_equals_stepped_state(graphs):
    lowering, g = graphs
    rng = np.random.default_rng(13)
    length = lengths_for(lowering)[-1] if lowering == "unrolled" else 20
    ids = rng.integers(0, g.config.vocab_size, (3, length))
    _, pre_state = g.run(g.prefill, ids, g.zeros(3))
    state = g.zeros(3)
    for t in range(length):
        _, state = g.run(g.step, ids[:, t : t + 1], state)
    assert_states_close(pre_state, state)


@pytest.mark.parametrize("length", [5, 2 * UNROLLED_LEN + 3])
def test_the_runtime_takes_any_prompt_length_through_an_unrolled_export(mamba_exports, length):
    """An unrolled prefill graph takes exactly UNROLLED_LEN tokens: the runtime feeds whole pieces
    of that length through it and the rest a token at a time through the step graph. Every
    position's logits and the final state equal the eager model's one full forward."""
    ckpt, folder = mamba_exports("unrolled")
    model = rt.load(folder, provider="cpu")
    ids = np.random.default_rng(length).integers(0, ckpt.config.vocab_size, (2, length))
    logits, state = model.step(ids, model.start(2))  # (2, length, v)
    ref_logits, ref_state = eager(ckpt.model, ids)
    np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0)
    assert state.length == length
    assert_states_close([(state.arrays[S.past_conv(i)], state.arrays[S.past_ssm(i)])
                         for i in range(ckpt.config.n_layer)], ref_state)
