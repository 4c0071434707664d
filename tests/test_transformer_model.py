"""The study-notes Transformer: shapes of the notes' example, masks, checkpoint round trip."""

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
from seqexport.models.transformer import (
    MultiHeadAttention,
    SelfAttentionn,
    Transformer,
    TransformerConfig,
    generate_mask,
    padding_mask,
)

from seqexport.checkpoints.io import load_checkpoint, save_checkpoint
from seqexport.errors import CheckpointError

TINY = TransformerConfig(
    src_vocab_size=50, tgt_vocab_size=60, d_model=32, n_heads=4, d_ff=64, num_layers=2, max_len=64
)


def tiny_model(seed=0, config=TINY):
    torch.manual_seed(seed)
    return Transformer(config).eval()


def test_notes_example_shapes():
    """The notes' test: vocab 10000, default sizes, src [32, 10], tgt [32, 20]."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig()).eval()
    src = torch.randint(1, 10000, (32, 10))
    tgt = torch.randint(1, 10000, (32, 20))
    weights = {}
    for name, mod in model.named_modules():
        if isinstance(mod, SelfAttentionn):
            mod.register_forward_hook(lambda m, i, o, name=name: weights.__setitem__(name, o[1]))
    with torch.no_grad():
        memory = model.encoder(src)
        out = model(src, tgt, tgt_mask=generate_mask(20))
    assert memory.shape == (32, 10, 512)
    assert out.shape == (32, 20, 10000)
    assert weights["decoder.layers.5.self_attn.attention"].shape == (32, 8, 20, 20)
    assert weights["decoder.layers.5.cross_attn.attention"].shape == (32, 8, 20, 10)
    assert weights["encoder.layers.0.self_attn.attention"].shape == (32, 8, 10, 10)


def test_generate_mask_is_lower_triangular():
    m = generate_mask(5)
    assert m.dtype == torch.bool
    for i in range(5):
        for j in range(5):
            assert bool(m[i, j]) == (j <= i)


def test_causal_mask_hides_the_future():
    model = tiny_model()
    src = torch.randint(1, 50, (2, 7))
    tgt = torch.randint(1, 60, (2, 9))
    changed = tgt.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 60
    with torch.no_grad():
        a = model(src, tgt, tgt_mask=generate_mask(9))
        b = model(src, changed, tgt_mask=generate_mask(9))
    assert torch.equal(a[:, :6], b[:, :6])  # positions before the change: bit-identical
    assert not torch.allclose(a[:, 6:], b[:, 6:])  # the change is seen from position 6 on


def test_src_padding_mask_ignores_pad_positions():
    model = tiny_model()
    src = torch.randint(1, 50, (3, 8))
    src[:, 5:] = 0  # pad
    garbage = src.clone()
    garbage[:, 5:] = torch.randint(1, 50, (3, 3))  # other content where the mask says pad
    tgt = torch.randint(1, 60, (3, 4))
    mask = padding_mask(src)
    with torch.no_grad():
        a = model(src, tgt, src_mask=mask, tgt_mask=generate_mask(4), memory_mask=mask)
        b = model(garbage, tgt, src_mask=mask, tgt_mask=generate_mask(4), memory_mask=mask)
        short = model(src[:, :5], tgt, tgt_mask=generate_mask(4))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a, short, atol=1e-5, rtol=1e-5)


def sdpa_reference(mha: MultiHeadAttention, q, k, v, mask=None):
    """MultiHeadAttention written with torch's scaled_dot_product_attention: the same
    projections, heads split and merged here, boolean mask True = visible."""
    b, tq, d = q.shape
    h = mha.n_heads

    def heads(x, lin):  # (b, t, d) -> (b, h, t, d / h)
        return F.linear(x, lin.weight, lin.bias).reshape(b, x.shape[1], h, d // h).permute(0, 2, 1, 3)

    Q, K, V = heads(q, mha.W_q), heads(k, mha.W_k), heads(v, mha.W_v)
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)  # scale 1 / sqrt(d / h)
    out = F.linear(out.permute(0, 2, 1, 3).reshape(b, tq, d), mha.fc.weight, mha.fc.bias)
    return F.layer_norm(out + q, (d,), mha.norm.weight, mha.norm.bias, mha.norm.eps)


def attention_weights_reference(mha: MultiHeadAttention, q, k, mask=None):
    """softmax(Q K^T / sqrt(d_k)) in float64, hidden keys at -inf."""
    b, tq, d = q.shape
    h = mha.n_heads
    Q = F.linear(q, mha.W_q.weight, mha.W_q.bias).reshape(b, tq, h, d // h).permute(0, 2, 1, 3).double()
    K = F.linear(k, mha.W_k.weight, mha.W_k.bias).reshape(b, k.shape[1], h, d // h).permute(0, 2, 1, 3).double()
    scores = Q @ K.transpose(-1, -2) / math.sqrt(d // h)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1)


def _mha(seed=0, d=32, h=4):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d, h).eval()
    with torch.no_grad():  # non-trivial norm parameters
        mha.norm.weight.uniform_(0.5, 1.5)
        mha.norm.bias.uniform_(-0.5, 0.5)
    return mha


def test_multi_head_attention_equals_torch_sdpa_unmasked_and_cross():
    mha = _mha()
    q, kv = torch.randn(3, 5, 32) * 2, torch.randn(3, 7, 32) * 2
    with torch.no_grad():
        for args in ((q, q, q), (q, kv, kv)):
            out, w = mha(*args)
            torch.testing.assert_close(out, sdpa_reference(mha, *args), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(w.double(), attention_weights_reference(mha, *args[:2]), atol=1e-6, rtol=1e-5)


def test_multi_head_attention_equals_torch_sdpa_causal():
    mha = _mha(1)
    x = torch.randn(2, 6, 32) * 2
    mask = generate_mask(6)
    with torch.no_grad():
        out, w = mha(x, x, x, mask)
        torch.testing.assert_close(out, sdpa_reference(mha, x, x, x, mask), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w.double(), attention_weights_reference(mha, x, x, mask), atol=1e-6, rtol=1e-5)
    assert (w[..., ~mask] == 0).all()  # no weight on the future


def test_multi_head_attention_equals_torch_sdpa_with_padding():
    mha = _mha(2)
    q = torch.randn(3, 4, 32) * 2
    ids = torch.tensor([[5, 6, 7, 8, 9, 3], [5, 6, 0, 0, 0, 0], [4, 0, 0, 0, 0, 0]])
    mem = torch.randn(3, 6, 32) * 2
    mask = padding_mask(ids)  # (b, 1, 1, s)
    with torch.no_grad():
        out, w = mha(q, mem, mem, mask)
        torch.testing.assert_close(out, sdpa_reference(mha, q, mem, mem, mask), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w.double(), attention_weights_reference(mha, q, mem, mask), atol=1e-6, rtol=1e-5)
        # self-attention over the padded sequence with causal and padding masks together
        both = generate_mask(6)[None, None] & mask
        out, _ = mha(mem, mem, mem, both)
        torch.testing.assert_close(out, sdpa_reference(mha, mem, mem, mem, both), atol=1e-5, rtol=1e-5)


def test_the_sdpa_reference_notices_a_missing_scale():
    """The comparison can fail: without 1 / sqrt(d_k) the output is far from the reference."""
    mha = _mha()
    x = torch.randn(2, 5, 32) * 2
    with torch.no_grad():
        Q, K, V = (mha.split_heads(lin(x)) for lin in (mha.W_q, mha.W_k, mha.W_v))
        unscaled = torch.softmax(Q @ K.transpose(-1, -2), -1) @ V
        wrong = mha.norm(mha.fc(mha.merge_heads(unscaled)) + x)
        assert (wrong - sdpa_reference(mha, x, x, x)).abs().max() > 1e-2


def test_fully_masked_row_gives_uniform_weights_and_the_mean_of_v():
    """A query that sees no key attends to all of them equally: weights 1 / t_k, output the
    mean of V over the keys. Rows with visible keys are the plain softmax over those."""
    attn = SelfAttentionn()
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of batch row 0 sees nothing
    mask[1, :, 3] = False  # query 3 of batch row 1 sees nothing
    mask[1, :, 0, 2:] = False  # query 0 of batch row 1 sees keys 0 and 1 only
    out, w = attn(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    for b, i in ((0, 1), (1, 3)):
        torch.testing.assert_close(w[b, :, i], torch.full((3, 5), 1 / 5), atol=0, rtol=1e-6)
        torch.testing.assert_close(out[b, :, i], v[b].mean(-2), atol=1e-6, rtol=1e-5)
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(8)
    expected = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    visible = mask.expand(2, 3, 4, 5).any(-1)  # rows with at least one visible key
    torch.testing.assert_close(w.double()[visible], expected[visible], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.double()[visible], (expected @ v.double())[visible], atol=1e-5, rtol=1e-5)


def test_checkpoint_round_trip(tmp_path):
    model = tiny_model(seed=3)
    save_checkpoint(model, TINY, "transformer", tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.family == "transformer" and loaded.config == TINY
    src, tgt = torch.randint(1, 50, (2, 5)), torch.randint(1, 60, (2, 6))
    with torch.no_grad():
        assert torch.equal(model(src, tgt), loaded.model(src, tgt))


def test_pytorch_model_bin_loads(tmp_path):
    model = tiny_model(seed=4)
    folder = tmp_path / "bin"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"family": "transformer", **TINY.to_dict()}))
    loaded = load_checkpoint(folder)
    src, tgt = torch.randint(1, 50, (1, 5)), torch.randint(1, 60, (1, 3))
    with torch.no_grad():
        assert torch.equal(model(src, tgt), loaded.model(src, tgt))


def test_mismatched_checkpoint_lists_keys(tmp_path):
    model = tiny_model()
    save_checkpoint(model, TINY, "transformer", tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "ckpt/config.json").read_text())
    cfg["d_ff"] = 96  # the weights were made with 64
    cfg["num_layers"] = 3  # and two layers
    (tmp_path / "ckpt/config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "ckpt")
    msg = str(e.value)
    assert "missing keys" in msg and "encoder.layers.2.self_attn.W_q.weight" in msg
    assert "mis-shaped keys" in msg and "encoder.layers.0.ffn.fc1.weight (64, 32) (expected (96, 32))" in msg


def test_a_config_far_bigger_than_its_weights_is_refused_before_it_is_built(tmp_path):
    """config.json sizes are checked against the weights on shapes alone: a claimed d_model of
    10^6 was built for real first (a RuntimeError asking for terabytes), a claimed 5,000 layers
    took seconds per thousand before the refusal, and a big mismatch listed every key."""
    save_checkpoint(tiny_model(), TINY, "transformer", tmp_path / "ckpt")
    path = tmp_path / "ckpt/config.json"
    good = json.loads(path.read_text())

    def refusal(**edits):
        path.write_text(json.dumps({**good, **edits}))
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(tmp_path / "ckpt")
        return str(e.value)

    assert "encoder.embedding.weight (50, 32) (expected (50, 1000000))" in refusal(d_model=10**6, d_ff=10**6)
    assert re.search(r"it describes a model of more than \d+ tensors, the weights hold \d+ \(check its layer counts",
                     refusal(num_layers=5000))
    many = refusal(num_layers=5)  # three layers of each stack missing: the first keys and a count
    assert re.search(r"missing keys: decoder\.layers\.2\..*, \.\.\. and \d+ more \(\d+ in all\)", many)
    assert len(many) < 5000


def test_unexpected_keys_are_listed(tmp_path):
    model = tiny_model()
    save_checkpoint(model, TINY, "transformer", tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "ckpt/config.json").read_text())
    cfg["num_layers"] = 1
    (tmp_path / "ckpt/config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"unexpected keys: .*decoder\.layers\.1\."):
        load_checkpoint(tmp_path / "ckpt")


def test_checkpoint_faults_name_the_problem(tmp_path):
    with pytest.raises(CheckpointError, match="is not a folder"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_checkpoint(tmp_path / "empty")
    model = tiny_model()
    save_checkpoint(model, TINY, "transformer", tmp_path / "c")
    with pytest.raises(CheckpointError, match="holds a transformer model; expected a mamba"):
        load_checkpoint(tmp_path / "c", family="mamba")
    (tmp_path / "c/model.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(CheckpointError, match="cannot read weights"):
        load_checkpoint(tmp_path / "c")
    (tmp_path / "c/config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path / "c")


class _Payload:
    def __reduce__(self):
        return (print, ("this would run code",))


def test_pickle_with_code_is_refused(tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    torch.save({"w": _Payload()}, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"family": "transformer", **TINY.to_dict()}))
    with pytest.raises(CheckpointError, match="refused .*pytorch_model.bin"):
        load_checkpoint(folder)
