"""The transformer decoder graph's export-side formulation (`families/transformer/decoder_graph.py`)
is the eager `decode_step_cached`: the same logits and new K/V for rows at different cache
lengths, one or several new tokens, source padding, float32 and float16."""

import pytest
import torch

from seqexport.checkpoints.presets import build_preset
from seqexport.families.transformer.decoder_graph import FastDecoderGraph
from seqexport.families.transformer.export import DecoderGraph


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 5e-3)])
@pytest.mark.parametrize("t", [1, 3])
def test_fast_decoder_equals_the_eager_cached_step(dtype, tol, t):
    model = build_preset("transformer", "tiny", seed=0).model.to(dtype).eval()
    cfg = model.config
    gen = torch.Generator().manual_seed(t)
    b, s, c, h, k = 3, 5, 7, cfg.n_heads, cfg.d_model // cfg.n_heads
    ids = torch.randint(1, cfg.tgt_vocab_size, (b, t), generator=gen)
    mask = torch.ones(b, s, dtype=torch.int64)
    mask[1, 3:] = 0  # a padded source row
    lengths = torch.tensor([0, 4, 7])  # an empty cache, a partly filled one, a full one
    past = [torch.randn(b, h, s, k, generator=gen).to(dtype) for _ in range(2 * cfg.num_layers)]
    past += [torch.randn(b, h, c, k, generator=gen).to(dtype) for _ in range(2 * cfg.num_layers)]
    with torch.no_grad():
        want = DecoderGraph(model)(ids, mask, lengths, *past)
        got = FastDecoderGraph(model)(ids, mask, lengths, *past)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.float(), w.float(), atol=tol, rtol=tol)
