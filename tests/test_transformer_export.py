"""Transformer export: ONNX Runtime CPU vs the unmodified eager model's full forward (no cache)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from seqexport.models.transformer import generate_mask, padding_mask

from seqexport.families.transformer import specs as S

ATOL = 1e-4


@pytest.fixture(scope="module")
def sessions(transformer_tiny):
    ckpt, out = transformer_tiny
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    enc = ort.InferenceSession(str(out / "encoder.onnx"), opts, providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(out / "decoder.onnx"), opts, providers=["CPUExecutionProvider"])
    return ckpt.model, ckpt.config, enc, dec


def eager_logits(model, src, tgt):
    """Full forward, no cache: the reference for every position of tgt."""
    mask = padding_mask(src, 0)
    with torch.no_grad():
        return model(src, tgt, src_mask=mask, tgt_mask=generate_mask(tgt.shape[1]), memory_mask=mask).numpy()


def run_encoder(enc, src):
    outs = enc.run(None, {S.INPUT_IDS: src.numpy(), S.ATTENTION_MASK: (src != 0).long().numpy()})
    names = [o.name for o in enc.get_outputs()]
    return dict(zip(names, outs))


def decoder_feed(config, enc_out, src, tgt, self_past):
    feed = {S.INPUT_IDS: tgt.numpy(), S.ENCODER_ATTENTION_MASK: (src != 0).long().numpy()}
    for i in range(config.num_layers):
        for kv in ("key", "value"):
            feed[S.past_kv(i, "encoder", kv)] = enc_out[S.present_kv(i, "encoder", kv)]
            feed[S.past_kv(i, "decoder", kv)] = self_past[(i, kv)]
    return feed


def empty_past(config, batch):
    return {(i, kv): np.zeros((batch, config.n_heads, 0, config.head_dim), np.float32)
            for i in range(config.num_layers) for kv in ("key", "value")}


def run_decoder(dec, config, enc_out, src, tgt, self_past):
    outs = dec.run(None, decoder_feed(config, enc_out, src, tgt, self_past))
    names = [o.name for o in dec.get_outputs()]
    out = dict(zip(names, outs))
    present = {(i, kv): out[S.present_kv(i, "decoder", kv)]
               for i in range(config.num_layers) for kv in ("key", "value")}
    return out[S.LOGITS], present


def test_graphs_are_valid_and_dynamic(transformer_tiny):
    _, out = transformer_tiny
    manifest = json.loads((out / "manifest.json").read_text())
    for name in ("encoder", "decoder"):
        model = onnx.load(str(out / f"{name}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
        assert dims[S.INPUT_IDS][0] == "batch"
        assert [i["name"] for i in manifest["graphs"][name]["inputs"]] == [i.name for i in model.graph.input]
    dec = onnx.load(str(out / "decoder.onnx"))
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in dec.graph.input}
    assert dims[S.INPUT_IDS] == ["batch", "tgt_len"]
    assert dims[S.past_kv(0, "decoder", "key")] == ["batch", 4, "past_len", 16]
    assert dims[S.past_kv(1, "encoder", "value")] == ["batch", 4, "src_len", 16]
    assert not any(n.op_type == "If" for n in dec.graph.node)


@pytest.mark.parametrize("batch", [1, 3])
def test_encoder_matches_eager(sessions, batch):
    model, config, enc, _ = sessions
    torch.manual_seed(batch)
    src = torch.randint(1, config.src_vocab_size, (batch, 9))
    got = run_encoder(enc, src)
    with torch.no_grad():
        memory = model.encoder(src, padding_mask(src))
    np.testing.assert_allclose(got[S.ENCODER_HIDDEN_STATES], memory.numpy(), atol=ATOL, rtol=0)
    for i, layer in enumerate(model.decoder.layers):
        ca = layer.cross_attn
        with torch.no_grad():
            k = ca.W_k(memory).view(batch, -1, config.n_heads, config.head_dim).transpose(1, 2)
        np.testing.assert_allclose(got[S.present_kv(i, "encoder", "key")], k.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("past_len", [0, 1, 17])
@pytest.mark.parametrize("tgt_len", [1, 5])
def test_decoder_with_past_matches_full_forward(sessions, batch, past_len, tgt_len):
    model, config, enc, dec = sessions
    torch.manual_seed(100 * batch + 10 * past_len + tgt_len)
    src = torch.randint(1, config.src_vocab_size, (batch, 7))
    tgt = torch.randint(1, config.tgt_vocab_size, (batch, past_len + tgt_len))
    enc_out = run_encoder(enc, src)
    past = empty_past(config, batch)
    if past_len:
        _, past = run_decoder(dec, config, enc_out, src, tgt[:, :past_len], past)
    logits, present = run_decoder(dec, config, enc_out, src, tgt[:, past_len:], past)
    assert present[(0, "key")].shape == (batch, config.n_heads, past_len + tgt_len, config.head_dim)
    ref = eager_logits(model, src, tgt)[:, past_len:]
    np.testing.assert_allclose(logits, ref, atol=ATOL, rtol=0)


def test_greedy_decode_20_steps_matches_full_forward_each_step(sessions):
    model, config, enc, dec = sessions
    torch.manual_seed(7)
    src = torch.randint(1, config.src_vocab_size, (2, 11))
    enc_out = run_encoder(enc, src)
    tokens = torch.ones(2, 1, dtype=torch.long)  # a start token
    past = empty_past(config, 2)
    for _ in range(20):
        logits, past = run_decoder(dec, config, enc_out, src, tokens[:, -1:], past)
        ref = eager_logits(model, src, tokens)[:, -1]
        np.testing.assert_allclose(logits[:, -1], ref, atol=ATOL, rtol=0)
        tokens = torch.cat([tokens, torch.from_numpy(logits[:, -1].argmax(-1))[:, None]], dim=1)
    assert past[(1, "value")].shape[2] == 20


def test_padded_batch_rows_equal_rows_alone(sessions):
    model, config, enc, dec = sessions
    torch.manual_seed(11)
    lengths = [3, 10, 6]
    rows = [torch.randint(1, config.src_vocab_size, (n,)) for n in lengths]
    src = torch.zeros(3, max(lengths), dtype=torch.long)
    for r, row in enumerate(rows):
        src[r, : len(row)] = row
    tgt = torch.randint(1, config.tgt_vocab_size, (3, 4))
    enc_out = run_encoder(enc, src)
    _, past = run_decoder(dec, config, enc_out, src, tgt[:, :2], empty_past(config, 3))
    batch_logits, _ = run_decoder(dec, config, enc_out, src, tgt[:, 2:], past)
    for r, row in enumerate(rows):
        alone_src = row[None]
        alone_enc = run_encoder(enc, alone_src)
        _, p = run_decoder(dec, config, alone_enc, alone_src, tgt[r : r + 1, :2], empty_past(config, 1))
        alone, _ = run_decoder(dec, config, alone_enc, alone_src, tgt[r : r + 1, 2:], p)
        np.testing.assert_allclose(batch_logits[r], alone[0], atol=ATOL, rtol=0)
        np.testing.assert_allclose(alone[0], eager_logits(model, alone_src, tgt[r : r + 1])[0, 2:], atol=ATOL)
