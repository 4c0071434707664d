"""The eager RWKV-7 model: the WKV-7 reference recurrence spelled out, forward == step ==
split prefill, and parity with the `rwkv` pip package (BlinkDL's own x070 code) loading the
same `.pth` this test writes."""

import math
import os

import pytest
import torch
from seqexport.models.rwkv import RwkvConfig, RwkvLM, wkv7_ref

# The reference package picks its RWKV-7 code path and its CPU kernels at import time.
os.environ["RWKV_V7_ON"] = "1"
os.environ["RWKV_CUDA_ON"] = "0"

TINY = dict(n_embd=64, n_layer=2, vocab_size=100, head_size=16)
# wider heads, more layers, a channel mix not 4c wide, LoRA ranks of their own
LARGER = dict(n_embd=128, n_layer=4, vocab_size=300, head_size=32, d_ffn=320, d_decay=48, d_aaa=40,
              d_mv=24, d_gate=56)


def literal_wkv(r, w, k, v, a, b, s0):
    """wkv7_ref spelled out per (batch, head, i, j) in Python floats."""
    bsz, length, h, n = r.shape
    s = [[[[float(s0[x, y, i, j]) for j in range(n)] for i in range(n)] for y in range(h)] for x in range(bsz)]
    out = [[[[0.0] * n for _ in range(h)] for _ in range(length)] for _ in range(bsz)]
    for x in range(bsz):
        for t in range(length):
            for y in range(h):
                S = s[x][y]
                sa = [sum(S[i][j] * float(a[x, t, y, j]) for j in range(n)) for i in range(n)]
                for i in range(n):
                    for j in range(n):
                        S[i][j] = (S[i][j] * float(w[x, t, y, j]) + sa[i] * float(b[x, t, y, j])
                                   + float(v[x, t, y, i]) * float(k[x, t, y, j]))
                for i in range(n):
                    out[x][t][y][i] = sum(S[i][j] * float(r[x, t, y, j]) for j in range(n))
    return torch.tensor(out), torch.tensor(s)


@pytest.mark.parametrize("length", [1, 2, 5])
def test_wkv7_ref_matches_literal_loops(length):
    g = torch.Generator().manual_seed(length)
    r, k, v, a, b = (torch.randn(2, length, 3, 4, generator=g) for _ in range(5))
    w = torch.rand(2, length, 3, 4, generator=g)
    s0 = torch.randn(2, 3, 4, 4, generator=g)
    y, s = wkv7_ref(r, w, k, v, a, b, s0)
    y_lit, s_lit = literal_wkv(r, w, k, v, a, b, s0)
    torch.testing.assert_close(y, y_lit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_lit, atol=1e-5, rtol=1e-5)


def model(seed=0, **config) -> RwkvLM:
    torch.manual_seed(seed)
    return RwkvLM(RwkvConfig(**config)).eval()


def test_state_shapes_and_dtypes():
    m = model(**LARGER)
    state = m.allocate_inference_cache(3)
    assert len(state) == 4
    for att, wkv, ffn in state:
        assert att.shape == ffn.shape == (3, 128) and wkv.shape == (3, 4, 32, 32)
        assert wkv.dtype == torch.float32
    logits, new = m(torch.randint(0, 300, (3, 5)), state)
    assert logits.shape == (3, 5, 300) and logits.dtype == torch.float32
    assert [tuple(t.shape) for t in new[0]] == [(3, 128), (3, 4, 32, 32), (3, 128)]
    assert all(not torch.equal(t, torch.zeros_like(t)) for layer in new for t in layer)


@torch.no_grad()
def test_forward_step_and_split_prefill_agree():
    m = model(**TINY)
    ids = torch.randint(0, 100, (2, 9))
    full, full_state = m(ids)
    first, state = m(ids[:, :4])
    rest, state = m(ids[:, 4:], state)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)
    state, steps = m.allocate_inference_cache(2), []
    for t in range(9):
        logits, state = m.step(ids[:, t], state)
        steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(state, full_state, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_config_refuses_unknown_keys_and_bad_sizes():
    with pytest.raises(ValueError, match="unknown RwkvConfig keys \\['n_embed'\\]"):
        RwkvConfig.from_dict({"n_embed": 64})
    with pytest.raises(ValueError, match="not a multiple of head_size"):
        RwkvConfig(n_embd=60, head_size=16)
    assert RwkvConfig(n_embd=768).ranks == {"w": 64, "a": 64, "v": 32, "g": 128}  # the 0.1B release


# ---------------------------------------------------------------- against the rwkv package


def reference(m: RwkvLM, tmp_path):
    """The `rwkv` package's RWKV-7 (cpu fp32) on our weights, written as a BlinkDL .pth."""
    rwkv_model = pytest.importorskip("rwkv.model", reason="the rwkv reference package (pip install rwkv)")
    path = tmp_path / "model.pth"
    torch.save(m.state_dict(), path)
    return rwkv_model.RWKV(str(path)[: -len(".pth")], strategy="cpu fp32")


@pytest.mark.parametrize("config", [TINY, LARGER], ids=["tiny", "larger"])
@torch.no_grad()
def test_logits_and_state_match_the_rwkv_package(config, tmp_path):
    m = model(seed=1, **config)
    ref = reference(m, tmp_path)
    ids = torch.randint(0, config["vocab_size"], (64,), generator=torch.Generator().manual_seed(2)).tolist()

    ref_logits, ref_state = ref.forward(ids, None, full_output=True)  # (64, v), 3 tensors a layer
    logits, state = m(torch.tensor([ids]))
    assert (logits[0] - ref_logits).abs().max().item() < 1e-4
    assert logits.abs().max().item() > 0.5  # not a degenerate model
    for i, layer in enumerate(state):
        for j, ours in enumerate(layer):
            assert (ours[0] - ref_state[3 * i + j]).abs().max().item() < 1e-4, (i, j)

    # token by token: the package's one-token path against our step
    ref_state, ours = None, m.allocate_inference_cache(1)
    for t in ids[:16]:
        ref_logits, ref_state = ref.forward([t], ref_state)
        logits, ours = m.step(torch.tensor([t]), ours)
        assert (logits[0] - ref_logits).abs().max().item() < 1e-4
    assert all(math.isfinite(x) for x in logits[0].tolist())
