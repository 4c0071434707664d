"""The transformer decoder graph's export-side formulation: `Transformer.decode_step_cached`
written for ONNX Runtime at batch. Same function and I/O as export.DecoderGraph (which traces
the eager step; validate compares the two); the eager model stays the reference.

What differs from tracing `decode_step_cached`, and why:
- the residual stream is 2-D (b·t, d) between attentions: every linear is one Gemm with its
  bias fused (a (b, t, d) input exports as MatMul + a separate Add per linear);
- the masks are computed once as "hidden" masks for all layers (the eager code inverts or
  compares them again in every layer: one node each);
- q is scaled by 1/√k as it leaves its linear, before its heads are split, not the scores
  after q·Kᵀ: ORT folds a scale next to a MatMul into it (FusedMatMul alpha ≠ 1), and MLAS
  then runs its general GEMM, which packs the whole cache, instead of its one-row kernel: at
  context 4096 each layer's q·Kᵀ took 2.1 ms instead of about 0.8 (one thread). Scaling
  before the product keeps the eager order's magnitudes (float16 scores stay in range).
  Cross-attention scales its scores after q·Kᵀ instead, as the eager model does: ORT folds
  that Div into the product (a FusedMatMul with alpha), one node fewer a layer, and over a
  source's few keys the general GEMM's packing costs nothing measurable;
- self-attention's two score blocks (cache, new positions) are concatenated first and masked
  once, by a (b, 1, t, c + t) mask made once for all layers: one Where a layer instead of two.
Parameters are used as they are (initializers keep their eager names: int8 matches them).

Dimension letters as in models/transformer.py: b batch, t new positions, c cache slots,
s source length, h heads, k head size, d model width, v vocabulary.
"""

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from seqexport.models.transformer import MultiHeadAttention, Transformer


def _heads(x: Tensor, b: int, mha: MultiHeadAttention) -> Tensor:
    """(b·t, d) -> (b, h, t, k)"""
    return x.reshape(b, -1, mha.n_heads, mha.d_k).transpose(1, 2)  # (b, h, t, k)


def _merge(out: Tensor, d: int) -> Tensor:
    """(b, h, t, k) -> (b·t, d)"""
    return out.transpose(1, 2).reshape(-1, d)  # (b·t, d)


class FastDecoderGraph(nn.Module):
    """(input_ids, encoder_attention_mask, past_lengths, *past K/V) -> logits (b, t, v), the
    new positions' self-attention K/V, each (b, h, t, k): export.DecoderGraph's I/O."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def _embedded(self, input_ids, past_lengths):
        """The new tokens' embeddings plus their positions' encodings, each row from its own
        past length: (b, t) ids -> (b·t, d)."""
        dec = self.model.decoder
        b, t = input_ids.shape
        positions = past_lengths[:, None] + torch.arange(t, device=input_ids.device)  # (b, t)
        return (dec.embedding(input_ids) + dec.pe.pe[positions]).reshape(b * t, dec.embedding.embedding_dim)

    def forward(self, input_ids, encoder_attention_mask, past_lengths, *past):
        dec = self.model.decoder
        n = len(dec.layers)
        b, t = input_ids.shape
        c = past[2 * n].shape[2]
        d = dec.embedding.embedding_dim
        x = self._embedded(input_ids, past_lengths)  # (b·t, d)
        # True where a score is hidden: cache slots at or past the row's length, later new
        # positions, source padding
        past_hidden = (torch.arange(c, device=x.device)[None, :] >= past_lengths[:, None])[:, None, None, :]  # (b, 1, 1, c)
        later = torch.arange(t, device=x.device)
        causal_hidden = later[None, :] > later[:, None]  # (t, t)
        self_hidden = torch.cat([past_hidden.expand(b, 1, t, c), causal_hidden.expand(b, 1, t, t)], dim=-1)  # (b, 1, t, c + t)
        cross_hidden = (encoder_attention_mask == 0)[:, None, None, :]  # (b, 1, 1, s)
        fill = torch.finfo(x.dtype).min
        new_kv = []
        for i, layer in enumerate(dec.layers):
            sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.ffn
            past_k, past_v = past[2 * n + 2 * i], past[2 * n + 2 * i + 1]  # (b, h, c, k)
            cross_k, cross_v = past[2 * i], past[2 * i + 1]  # (b, h, s, k)
            scale = math.sqrt(sa.d_k)
            q = _heads(sa.W_q(x) / scale, b, sa)  # (b, h, t, k)
            k_new, v_new = _heads(sa.W_k(x), b, sa), _heads(sa.W_v(x), b, sa)
            scores = torch.cat([q @ past_k.transpose(-2, -1), q @ k_new.transpose(-2, -1)], dim=-1)
            attn = sa.attention.softmax(scores.masked_fill(self_hidden, fill))  # (b, h, t, c + t)
            out = attn[..., :c] @ past_v + attn[..., c:] @ v_new  # (b, h, t, k)
            x = sa.norm(sa.fc(_merge(out, d)) + x)  # (b·t, d)

            q = _heads(ca.W_q(x), b, ca)
            scores = ((q @ cross_k.transpose(-2, -1)) / math.sqrt(ca.d_k)).masked_fill(cross_hidden, fill)
            out = ca.attention.softmax(scores) @ cross_v  # (b, h, t, k)
            x = ca.norm(ca.fc(_merge(out, d)) + x)

            x = ffn.norm(ffn.fc2(torch.relu(ffn.fc1(x))) + x)  # dropout: the export is in eval mode
            new_kv += [k_new, v_new]
        return (dec.fc_out(x).reshape(b, t, -1), *new_kv)  # (b, t, v)


class FusedDecoderGraph(FastDecoderGraph):
    """FastDecoderGraph with each attention as one `scaled_dot_product_attention`, which
    torch.onnx (dynamo, opset 23+) writes as ONNX's own `Attention` operator: the scores, their
    mask, softmax and the product with V in one kernel. Self-attention attends over the cache
    and the new positions concatenated (b, h, c + t, k): the graph returns only the new K/V, as
    the MatMul form does, so both share one spec and one runtime. The mask says what is
    attended (True), the cache's slots below the row's length and the new positions up to each."""

    def forward(self, input_ids, encoder_attention_mask, past_lengths, *past):
        dec = self.model.decoder
        n = len(dec.layers)
        b, t = input_ids.shape
        c = past[2 * n].shape[2]
        d = dec.embedding.embedding_dim
        x = self._embedded(input_ids, past_lengths)  # (b·t, d)
        slots = torch.arange(c, device=x.device)[None, :] < past_lengths[:, None]  # (b, c)
        later = torch.arange(t, device=x.device)
        causal = later[None, :] <= later[:, None]  # (t, t)
        self_seen = torch.cat([slots[:, None, None, :].expand(b, 1, t, c),
                               causal[None, None].expand(b, 1, t, t)], dim=-1)  # (b, 1, t, c + t)
        # expanded over t: ORT's Attention wants the mask's query axis to be q's own
        cross_seen = (encoder_attention_mask != 0)[:, None, None, :].expand(b, 1, t, -1)  # (b, 1, t, s)
        new_kv = []
        for i, layer in enumerate(dec.layers):
            sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.ffn
            past_k, past_v = past[2 * n + 2 * i], past[2 * n + 2 * i + 1]  # (b, h, c, k)
            cross_k, cross_v = past[2 * i], past[2 * i + 1]  # (b, h, s, k)
            q = _heads(sa.W_q(x), b, sa)  # (b, h, t, k)
            k_new, v_new = _heads(sa.W_k(x), b, sa), _heads(sa.W_v(x), b, sa)
            out = F.scaled_dot_product_attention(q, torch.cat([past_k, k_new], dim=2), torch.cat([past_v, v_new], dim=2),
                                                 attn_mask=self_seen)  # (b, h, t, k)
            x = sa.norm(sa.fc(_merge(out, d)) + x)  # (b·t, d)

            q = _heads(ca.W_q(x), b, ca)
            out = F.scaled_dot_product_attention(q, cross_k, cross_v, attn_mask=cross_seen)  # (b, h, t, k)
            x = ca.norm(ca.fc(_merge(out, d)) + x)

            x = ffn.norm(ffn.fc2(torch.relu(ffn.fc1(x))) + x)  # dropout: the export is in eval mode
            new_kv += [k_new, v_new]
        return (dec.fc_out(x).reshape(b, t, -1), *new_kv)  # (b, t, v)
