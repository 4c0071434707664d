"""Transformer export: ONNX Runtime CPU vs the unmodified eager model's full forward (no cache)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from seqexport.models.transformer import generate_mask, padding_mask

from seqexport.cli import cli
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


def decoder_feed(config, enc_out, src, tgt, cache, lengths):
    feed = {S.INPUT_IDS: tgt.numpy(), S.ENCODER_ATTENTION_MASK: (src != 0).long().numpy(),
            S.PAST_LENGTHS: np.asarray(lengths, np.int64)}
    for i in range(config.num_layers):
        for kv in ("key", "value"):
            feed[S.past_kv(i, "encoder", kv)] = enc_out[S.present_kv(i, "encoder", kv)]
            feed[S.past_kv(i, "decoder", kv)] = cache[(i, kv)]
    return feed


def empty_past(config, batch, capacity=32, seed=0):
    """A cache buffer of `capacity` slots holding garbage: no slot is valid yet, and the graph
    must ignore whatever the slots past each row's length hold."""
    rng = np.random.default_rng(seed)
    return {(i, kv): rng.standard_normal((batch, config.n_heads, capacity, config.head_dim)).astype(np.float32)
            for i in range(config.num_layers) for kv in ("key", "value")}


def run_decoder(dec, config, enc_out, src, tgt, cache, lengths=None):
    """One decoder call; returns the logits, the cache with the new K/V written at each row's
    length (the test's own bookkeeping, not the runtime's) and the new lengths."""
    lengths = np.zeros(tgt.shape[0], np.int64) if lengths is None else np.asarray(lengths, np.int64)
    outs = dec.run(None, decoder_feed(config, enc_out, src, tgt, cache, lengths))
    out = dict(zip([o.name for o in dec.get_outputs()], outs))
    cache = {k: v.copy() for k, v in cache.items()}
    t = tgt.shape[1]
    for (i, kv), buf in cache.items():
        new = out[S.present_kv(i, "decoder", kv)]
        assert new.shape == (tgt.shape[0], config.n_heads, t, config.head_dim)  # only the new positions
        for r, n in enumerate(lengths):
            buf[r, :, n : n + t] = new[r]
    return out[S.LOGITS], cache, lengths + t


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
    past, lengths = empty_past(config, batch), None
    if past_len:
        _, past, lengths = run_decoder(dec, config, enc_out, src, tgt[:, :past_len], past)
    logits, _, lengths = run_decoder(dec, config, enc_out, src, tgt[:, past_len:], past, lengths)
    assert (lengths == past_len + tgt_len).all()
    ref = eager_logits(model, src, tgt)[:, past_len:]
    np.testing.assert_allclose(logits, ref, atol=ATOL, rtol=0)


def test_greedy_decode_20_steps_matches_full_forward_each_step(sessions):
    model, config, enc, dec = sessions
    torch.manual_seed(7)
    src = torch.randint(1, config.src_vocab_size, (2, 11))
    enc_out = run_encoder(enc, src)
    tokens = torch.ones(2, 1, dtype=torch.long)  # a start token
    past, lengths = empty_past(config, 2), None
    for _ in range(20):
        logits, past, lengths = run_decoder(dec, config, enc_out, src, tokens[:, -1:], past, lengths)
        ref = eager_logits(model, src, tokens)[:, -1]
        np.testing.assert_allclose(logits[:, -1], ref, atol=ATOL, rtol=0)
        tokens = torch.cat([tokens, torch.from_numpy(logits[:, -1].argmax(-1))[:, None]], dim=1)
    assert (lengths == 20).all()


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
    _, past, lengths = run_decoder(dec, config, enc_out, src, tgt[:, :2], empty_past(config, 3))
    batch_logits, _, _ = run_decoder(dec, config, enc_out, src, tgt[:, 2:], past, lengths)
    for r, row in enumerate(rows):
        alone_src = row[None]
        alone_enc = run_encoder(enc, alone_src)
        _, p, n = run_decoder(dec, config, alone_enc, alone_src, tgt[r : r + 1, :2], empty_past(config, 1, seed=r))
        alone, _, _ = run_decoder(dec, config, alone_enc, alone_src, tgt[r : r + 1, 2:], p, n)
        np.testing.assert_allclose(batch_logits[r], alone[0], atol=ATOL, rtol=0)
        np.testing.assert_allclose(alone[0], eager_logits(model, alone_src, tgt[r : r + 1])[0, 2:], atol=ATOL)


def test_rows_at_different_positions_share_one_call(sessions):
    """Continuous batching at the graph: rows with 0, 3 and 17 valid slots of one buffer, each
    fed its next token in one call, equal each row's full forward alone."""
    model, config, enc, dec = sessions
    torch.manual_seed(13)
    src = torch.randint(1, config.src_vocab_size, (3, 6))
    enc_out = run_encoder(enc, src)
    positions = [0, 3, 17]
    tgt = torch.randint(1, config.tgt_vocab_size, (3, max(positions) + 1))
    cache = empty_past(config, 3, capacity=24, seed=5)
    for r, n in enumerate(positions):  # fill row r's first n slots from its own prefix, alone
        if n:
            row_out = {k: v[r : r + 1] for k, v in enc_out.items()}
            row_cache = {k: v[r : r + 1] for k, v in cache.items()}
            _, row_cache, _ = run_decoder(dec, config, row_out, src[r : r + 1], tgt[r : r + 1, :n], row_cache)
            for k in cache:
                cache[k][r] = row_cache[k][0]
    step = torch.stack([tgt[r, n] for r, n in enumerate(positions)])[:, None]  # (3, 1)
    logits, _, lengths = run_decoder(dec, config, enc_out, src, step, cache, positions)
    assert lengths.tolist() == [1, 4, 18]
    for r, n in enumerate(positions):
        ref = eager_logits(model, src[r : r + 1], tgt[r : r + 1, : n + 1])[0, -1]
        np.testing.assert_allclose(logits[r, 0], ref, atol=ATOL, rtol=0)


def test_export_cli_opset_and_seed_reach_the_graphs(transformer_tiny, tmp_path):
    """`seqexport export transformer --preset tiny --opset 20 --seed 3`: every graph imports
    opset 20 (the manifest says so too) and holds the weights of seed 3's preset, not seed 0's."""
    out = tmp_path / "t20"
    result = CliRunner().invoke(cli, ["export", "transformer", "--preset", "tiny", "--opset", "20", "--seed", "3",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["opset"] == 20
    for entry in manifest["graphs"].values():
        model = onnx.load(str(out / entry["file"]), load_external_data=False)
        assert {o.domain: o.version for o in model.opset_import}[""] == 20, entry["file"]
    seed3 = load_file(out / "checkpoint" / "model.safetensors")
    seed0 = load_file(transformer_tiny[1] / "checkpoint" / "model.safetensors")
    name = next(k for k in seed3 if k in seed0 and seed3[k].numel() > 100)
    assert not torch.equal(seed3[name], seed0[name])
