"""`--attention fused`: the attention of the transformer's decoder and of the hybrid's attention
layers as ONNX's own `Attention` operator (opset 23), judged as the MatMul form is: the
transformer's decoder against the unmodified eager model's full forward (the helpers of
tests/test_transformer_export.py), the hybrid's graphs through the runtime against transformers'
own models (those of tests/test_hybrid_export.py), validate PASS; and bad values refused."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.checkpoints.presets import build_preset
from seqexport.cli import cli
from seqexport.errors import UsageError
from seqexport.families.transformer.export import export_transformer
from seqexport.parity.validate import validate
from tests.test_hybrid_export import assert_decode_equals_transformers, kinds_of
from tests.test_hybrid_model import _hf
from tests.test_transformer_export import ATOL, eager_logits, empty_past, run_decoder, run_encoder

TOL = 1e-4


def op_types(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


@pytest.fixture(scope="module")
def fused_transformer(tmp_path_factory):
    """(checkpoint, folder) of the tiny transformer preset exported with fused attention."""
    torch.manual_seed(0)
    ckpt = build_preset("transformer", "tiny", seed=0)
    out = tmp_path_factory.mktemp("fused") / "transformer-tiny-fused"
    export_transformer(ckpt, "tiny", out, attention="fused")
    return ckpt, out


@pytest.fixture(scope="module")
def sessions(fused_transformer):
    ckpt, out = fused_transformer
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    enc = ort.InferenceSession(str(out / "encoder.onnx"), opts, providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(out / "decoder.onnx"), opts, providers=["CPUExecutionProvider"])
    return ckpt.model, ckpt.config, enc, dec


def test_the_decoder_attends_through_onnx_attention(fused_transformer):
    ckpt, out = fused_transformer
    ops = op_types(out / "decoder.onnx")
    # every layer's self- and cross-attention one node; no softmax left of the MatMul form
    assert ops.count("Attention") == 2 * ckpt.config.num_layers and "Softmax" not in ops
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["opset"] >= 23 and manifest["export_options"]["attention"] == "fused"
    assert onnx.load(str(out / "decoder.onnx"), load_external_data=False).opset_import[0].version >= 23


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("past_len", [0, 1, 17])
@pytest.mark.parametrize("tgt_len", [1, 5])
def test_fused_decoder_with_past_matches_full_forward(sessions, batch, past_len, tgt_len):
    model, config, enc, dec = sessions
    torch.manual_seed(100 * batch + 10 * past_len + tgt_len)
    src = torch.randint(1, config.src_vocab_size, (batch, 7))
    src[1:, 5:] = 0  # padded sources: the cross-attention's mask
    tgt = torch.randint(1, config.tgt_vocab_size, (batch, past_len + tgt_len))
    enc_out = run_encoder(enc, src)
    past, lengths = empty_past(config, batch), None  # slots past each row's length hold garbage
    if past_len:
        _, past, lengths = run_decoder(dec, config, enc_out, src, tgt[:, :past_len], past)
    logits, _, lengths = run_decoder(dec, config, enc_out, src, tgt[:, past_len:], past, lengths)
    np.testing.assert_allclose(logits, eager_logits(model, src, tgt)[:, past_len:], atol=ATOL, rtol=0)


def test_fused_rows_at_different_positions_share_one_call(sessions):
    model, config, enc, dec = sessions
    torch.manual_seed(13)
    src = torch.randint(1, config.src_vocab_size, (3, 6))
    enc_out = run_encoder(enc, src)
    positions = [0, 3, 17]
    tgt = torch.randint(1, config.tgt_vocab_size, (3, max(positions) + 1))
    cache = empty_past(config, 3, capacity=24, seed=5)
    for r, n in enumerate(positions):  # row r's first n slots from its own prefix, alone
        if n:
            row_out = {k: v[r : r + 1] for k, v in enc_out.items()}
            row_cache = {k: v[r : r + 1] for k, v in cache.items()}
            _, row_cache, _ = run_decoder(dec, config, row_out, src[r : r + 1], tgt[r : r + 1, :n], row_cache)
            for k in cache:
                cache[k][r] = row_cache[k][0]
    ids = torch.stack([tgt[r, n] for r, n in enumerate(positions)])[:, None]
    logits, _, _ = run_decoder(dec, config, enc_out, src, ids, cache, positions)
    for r, n in enumerate(positions):
        want = eager_logits(model, src[r : r + 1], tgt[r : r + 1, : n + 1])[0, -1]
        np.testing.assert_allclose(logits[r, 0], want, atol=ATOL, rtol=0)


def test_fused_transformer_validates_and_generates_as_the_matmul_form(fused_transformer, transformer_tiny):
    _, fused = fused_transformer
    assert validate(fused, steps=6, write_summary=False)
    a, b = rt.load(fused, provider="cpu"), rt.load(transformer_tiny[1], provider="cpu")
    options = rt.SearchOptions(max_new_tokens=12, eos_id=-1)
    prompts = [[5, 9, 13, 2], [7, 7]]
    assert rt.generate(a, prompts, options) == rt.generate(b, prompts, options)


@pytest.fixture(scope="module", params=["granite-rope", "falcon_h1", "lfm2", "lfm3", "zamba2", "kimi_linear-q",
                                        "ling3"])
def fused_hybrid(tmp_path_factory, request):
    """transformers' Granite-4.0-H (dense, RoPE, GQA 4:2), Falcon-H1 (attention beside the
    Mamba-2 mixer in every layer, a key multiplier), LFM2 (short convs, per-head q/k norms) or
    LFM3 (sliding-window layers beside full ones, head gates) or Zamba2 (shared blocks, adapters)
    or Kimi-Linear (latent attention: multi-query attention in the latent, keys and values of
    different sizes) or Ling 3 (its latent attention with RoPE and a gate per head), exported
    with fused attention."""
    tmp = tmp_path_factory.mktemp(f"{request.param}-fused")
    hf = _hf(request.param, seed=3)
    hf.save_pretrained(tmp / "hf")
    result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(tmp / "hf"), "--out",
                                      str(tmp / "export"), "--attention", "fused"])
    assert result.exit_code == 0, result.output
    return hf, rt.load(tmp / "export", provider="cpu", threads=1), tmp / "export"


@pytest.mark.parametrize("length", [1, 17])
def test_fused_hybrid_prefill_then_steps_equal_transformers(fused_hybrid, length):
    hf, m, out = fused_hybrid
    attention_layers = sum(kind in ("full_attention", "sliding_attention", "hybrid") for kind in kinds_of(hf))
    for graph in ("prefill", "step"):
        ops = op_types(out / f"{graph}.onnx")
        assert ops.count("Attention") == attention_layers and "Softmax" not in ops
    assert_decode_equals_transformers(hf, m, length, 8, seed=length)


def test_fused_export_takes_multi_head_attention(tmp_path):
    """As many kv heads as query heads (no GQA): the fused export writes ONNX's Attention and
    validates (torch.onnx refused `enable_gqa` there, so every multi-head hybrid failed)."""
    from seqexport.models.hybrid import HybridConfig, HybridLM

    from seqexport.checkpoints.io import save_checkpoint

    config = HybridConfig(layer_types=["mamba2", "attention"], n_heads=4, n_kv_heads=4)
    save_checkpoint(HybridLM(config), config, "hybrid", tmp_path / "ckpt")
    result = CliRunner().invoke(cli, ["export", "hybrid", "--checkpoint", str(tmp_path / "ckpt"), "--out",
                                      str(tmp_path / "x"), "--attention", "fused"])
    assert result.exit_code == 0, result.output
    assert op_types(tmp_path / "x" / "step.onnx").count("Attention") == 1
    assert validate(tmp_path / "x", steps=3, write_summary=False)


def test_fused_hybrid_validates(fused_hybrid):
    assert validate(fused_hybrid[2], steps=4, write_summary=False)


def test_bad_attention_values_are_refused(tmp_path):
    ckpt = build_preset("transformer", "tiny", seed=0)
    with pytest.raises(UsageError, match="attention: expected one of \\['matmul', 'fused'\\], got 'flash'"):
        export_transformer(ckpt, "tiny", tmp_path / "x", attention="flash")
    assert not (tmp_path / "x").exists()
    result = CliRunner().invoke(cli, ["export", "transformer", "--preset", "tiny", "--out", str(tmp_path / "y"),
                                      "--attention", "flash"])
    assert result.exit_code == 2 and "'flash' is not one of 'matmul', 'fused'" in result.output


def test_the_tensorscatter_probe_writes_the_cache_in_place_and_matches_the_matmul_decoder(
        fused_transformer, transformer_tiny):
    """seqexport.bench.attention_scatter: the fused decoder rewritten to write its cache with
    TensorScatter (bound in place) gives the MatMul export's logits (same weights)."""
    from seqexport.bench.attention_scatter import probe

    rows = probe(transformer_tiny[1], fused_transformer[1], [3, 20], threads=1, repeats=2)
    assert [r["context"] for r in rows] == [3, 20]
    assert all(r["max_abs_logits_diff"] < ATOL and r["max_abs_written_key_diff"] < ATOL and r["scatter_ms"] > 0
               for r in rows)
    ops = op_types(fused_transformer[1] / "decoder_scatter.onnx")
    assert ops.count("TensorScatter") == 2 * transformer_tiny[0].config.num_layers
