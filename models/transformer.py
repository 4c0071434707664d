"""The encoder-decoder Transformer of the study notes (post-LN, sinusoidal positions).

Classes, attribute names and behaviour follow the notes module by module:
SelfAttentionn -> MultiHeadAttention -> FeedForward -> EncoderLayer / DecoderLayer
-> PositionalEncoding -> Encoder / Decoder -> Transformer, plus generate_mask.

Dimension letters (reused as ONNX dim names and runtime names):
    b   batch
    s   source length            (src_len)
    t   target length            (tgt_len)
    d   d_model
    h   attention heads          (n_heads)
    k   head dim = d / h         (d_k)
    f   feed-forward width       (d_ff)
    v   vocabulary size

Masks: 1 / True = visible, 0 / False = hidden, broadcast to (b, h, t_q, t_k).
Masked scores are set to the most negative finite value of their dtype rather
than -inf, so a fully masked row gives a uniform softmax instead of NaN; rows with
at least one visible position give exactly the notes' result.
"""

import math
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn


@dataclass
class TransformerConfig:
    src_vocab_size: int = 10000  # source vocabulary (the notes' test uses 10000)
    tgt_vocab_size: int = 10000  # target vocabulary
    d_model: int = 512  # model width
    n_heads: int = 8  # attention heads; d_model must divide by it
    d_ff: int = 2048  # feed-forward hidden width
    num_layers: int = 6  # encoder layers and decoder layers (each)
    dropout: float = 0.1  # dropout in the feed-forward block (training only)
    max_len: int = 5000  # rows of the positional table = longest sequence
    pad_id: int = 0  # padding token id of both vocabularies

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TransformerConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known - {"family"})
        if unknown:
            raise ValueError(f"unknown transformer config keys {unknown}; expected some of {sorted(known)}")
        return cls(**{k: v for k, v in d.items() if k in known})


class SelfAttentionn(nn.Module):
    """Scaled dot-product attention: softmax(Q K^T / sqrt(k)) V. Returns (out, attn)."""

    def __init__(self):
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, Q, K, V, mask=None):
        # Q (b, h, t_q, k), K and V (b, h, t_k, k), mask broadcastable to (b, h, t_q, t_k)
        d_k = Q.size(-1)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(d_k)  # (b, h, t_q, t_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
        attn = self.softmax(scores)
        out = torch.matmul(attn, V)  # (b, h, t_q, k)
        return out, attn


class MultiHeadAttention(nn.Module):
    """Project q, k, v, split heads, attend, merge heads, fc, residual + LayerNorm."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.fc = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.attention = SelfAttentionn()

    def split_heads(self, x):
        batch_size = x.size(0)
        return x.view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)  # (b, h, t, k)

    def merge_heads(self, out):
        batch_size = out.size(0)
        out = out.transpose(1, 2).contiguous()  # (b, t, h, k)
        return out.view(batch_size, -1, self.n_heads * self.d_k)  # (b, t, d)

    def attend(self, x, K, V, mask=None):
        """`forward(x, ., ., mask)` with K and V already projected and split (b, h, t_k, k):
        the cached decode path, where K and V come from the cache."""
        Q = self.split_heads(self.W_q(x))  # (b, h, t, k)
        out, _ = self.attention(Q, K, V, mask)
        return self.norm(self.fc(self.merge_heads(out)) + x)  # (b, t, d)

    def attend_cached(self, x, past_kv, new_kv, past_visible, causal):
        """`attend` over a preallocated cache plus the new positions, without concatenating
        them (a step then reads the cache once and copies none of it).

        x (b, t, d); past_kv (K, V) each (b, h, c, k), slot j of row r valid where
        past_visible (b, 1, 1, c) is True; new_kv (K, V) each (b, h, t, k) of x itself;
        causal (t, t): new position i sees new positions 0..i. Equal to `attend` over the
        concatenation of the valid slots and the new positions.
        """
        Q = self.split_heads(self.W_q(x))  # (b, h, t, k)
        scale = math.sqrt(self.d_k)
        fill = torch.finfo(Q.dtype).min
        past = torch.matmul(Q, past_kv[0].transpose(-2, -1)) / scale  # (b, h, t, c)
        new = torch.matmul(Q, new_kv[0].transpose(-2, -1)) / scale  # (b, h, t, t)
        scores = torch.cat([past.masked_fill(~past_visible, fill), new.masked_fill(~causal, fill)], dim=-1)
        attn = self.attention.softmax(scores)  # (b, h, t, c + t)
        c = past_kv[0].shape[2]
        out = torch.matmul(attn[..., :c], past_kv[1]) + torch.matmul(attn[..., c:], new_kv[1])  # (b, h, t, k)
        return self.norm(self.fc(self.merge_heads(out)) + x)  # (b, t, d)

    def project_kv(self, x):
        """K and V of `x` (b, t, d), split into heads: each (b, h, t, k)."""
        return self.split_heads(self.W_k(x)), self.split_heads(self.W_v(x))

    def forward(self, q, k, v, mask=None):
        Q = self.split_heads(self.W_q(q))  # (b, h, t_q, k)
        K = self.split_heads(self.W_k(k))  # (b, h, t_k, k)
        V = self.split_heads(self.W_v(v))  # (b, h, t_k, k)
        out, attn = self.attention(Q, K, V, mask)
        out = self.fc(self.merge_heads(out))  # (b, t_q, d)
        return self.norm(out + q), attn


class FeedForward(nn.Module):
    """Position-wise fc1 -> relu -> dropout -> fc2, residual + LayerNorm."""

    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):
        out = self.fc2(self.dropout(torch.relu(self.fc1(x))))  # (b, t, d)
        return self.norm(out + x)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)

    def forward(self, src, src_mask=None):
        out, _ = self.self_attn(src, src, src, src_mask)
        return self.ffn(out)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention (memory as both K and V), feed-forward."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = MultiHeadAttention(d_model, n_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        out, _ = self.self_attn(tgt, tgt, tgt, tgt_mask)
        out, _ = self.cross_attn(out, memory, memory, memory_mask)
        return self.ffn(out)

    def step(self, x, self_kv, cross_kv, causal, memory_mask):
        """`forward` for t new positions after a cached past: x (b, t, d); self_kv the past
        (K, V) each (b, h, past, k); cross_kv the memory's (K, V) each (b, h, s, k); causal
        (t, past + t). Returns the output (b, t, d) and the self-attention (K, V) of
        past + t positions (new tensors; the cache is never written in place)."""
        K_new, V_new = self.self_attn.project_kv(x)  # (b, h, t, k)
        K = torch.cat([self_kv[0], K_new], dim=2)  # (b, h, past + t, k)
        V = torch.cat([self_kv[1], V_new], dim=2)
        out = self.self_attn.attend(x, K, V, causal)
        out = self.cross_attn.attend(out, *cross_kv, memory_mask)
        return self.ffn(out), (K, V)

    def step_cached(self, x, cache_kv, cross_kv, past_visible, causal, memory_mask):
        """`step` against a preallocated cache: cache_kv (K, V) each (b, h, c, k) with the
        valid slots of each row marked by past_visible (b, 1, 1, c); causal (t, t) over the t
        new positions. Returns the output (b, t, d) and the new positions' own (K, V), each
        (b, h, t, k), for the caller to write into the cache (never written here)."""
        new_kv = self.self_attn.project_kv(x)  # (b, h, t, k) each
        out = self.self_attn.attend_cached(x, cache_kv, new_kv, past_visible, causal)
        out = self.cross_attn.attend(out, *cross_kv, memory_mask)
        return self.ffn(out), new_kv


class PositionalEncoding(nn.Module):
    """Sinusoidal table pe (max_len, d) added to the (unscaled) embeddings."""

    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)  # (max_len, 1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x, start=0):
        # x (b, t, d); positions start..start+t-1 (start > 0 when decoding with a cache)
        return x + self.pe[start : start + x.size(1)]

    def at(self, x, positions):
        # x (b, t, d); positions (b, t): each row's own positions (rows at different points)
        return x + self.pe[positions]


class LayerStack(nn.Module):
    """What Encoder and Decoder share: token embedding, positional table, `num_layers` layers."""

    layer_type: type[nn.Module]

    def __init__(self, vocab_size, d_model, n_heads, d_ff, num_layers, dropout=0.1, max_len=5000):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pe = PositionalEncoding(d_model, max_len)
        self.layers = nn.ModuleList(
            [self.layer_type(d_model, n_heads, d_ff, dropout) for _ in range(num_layers)]
        )


class Encoder(LayerStack):
    layer_type = EncoderLayer

    def forward(self, src, src_mask=None):
        x = self.pe(self.embedding(src))  # (b, s, d)
        for layer in self.layers:
            x = layer(x, src_mask)
        return x  # memory (b, s, d)


class Decoder(LayerStack):
    layer_type = DecoderLayer

    def __init__(self, vocab_size, d_model, n_heads, d_ff, num_layers, dropout=0.1, max_len=5000):
        super().__init__(vocab_size, d_model, n_heads, d_ff, num_layers, dropout, max_len)
        self.fc_out = nn.Linear(d_model, vocab_size)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None):
        x = self.pe(self.embedding(tgt))  # (b, t, d)
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return self.fc_out(x)  # (b, t, v)


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        c = config
        self.encoder = Encoder(
            c.src_vocab_size, c.d_model, c.n_heads, c.d_ff, c.num_layers, c.dropout, c.max_len
        )
        self.decoder = Decoder(
            c.tgt_vocab_size, c.d_model, c.n_heads, c.d_ff, c.num_layers, c.dropout, c.max_len
        )

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None):
        memory = self.encoder(src, src_mask)  # (b, s, d)
        return self.decoder(tgt, memory, tgt_mask, memory_mask)  # (b, t, v)

    # --- cached decoding: encode once, then decode_step with the KV cache ------------------

    def cross_kv(self, memory):
        """Every decoder layer's cross-attention (K, V) of the memory, computed once per
        source: list over layers of (K, V), each (b, h, s, k)."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder.layers]

    def allocate_inference_cache(self, batch, dtype=torch.float32, device=None):
        """The empty self-attention cache: list over layers of (K, V), each (b, h, 0, k)."""
        c = self.config
        empty = torch.zeros(batch, c.n_heads, 0, c.head_dim, dtype=dtype, device=device)
        return [(empty, empty) for _ in range(c.num_layers)]

    def decode_step(self, tgt, memory_mask, cross_kv, self_kv):
        """t new target tokens after a cached past, equal to the last t positions of `forward`.

        tgt (b, t) ids; memory_mask (b, s) 1 = source token, 0 = padding; cross_kv from
        `cross_kv`; self_kv the cache of past positions (`allocate_inference_cache` at
        first). Returns logits (b, t, v) and the new cache (past + t positions).
        """
        dec = self.decoder
        t = tgt.shape[1]
        past = self_kv[0][0].shape[2]
        x = dec.pe(dec.embedding(tgt), start=past)  # (b, t, d): positions past .. past + t - 1
        # query i sits at position past + i and sees keys 0 .. past + i
        q_pos = torch.arange(t, device=x.device) + past
        k_pos = torch.arange(past + t, device=x.device)
        causal = k_pos[None, :] <= q_pos[:, None]  # (t, past + t)
        cross_mask = memory_mask[:, None, None, :]  # (b, 1, 1, s)
        new_cache = []
        for layer, kv, ckv in zip(dec.layers, self_kv, cross_kv, strict=True):
            x, kv = layer.step(x, kv, ckv, causal, cross_mask)
            new_cache.append(kv)
        return dec.fc_out(x), new_cache  # (b, t, v)

    def allocate_cache_buffer(self, batch, capacity, dtype=torch.float32, device=None):
        """A zeroed preallocated self-attention cache: list over layers of (K, V), each
        (b, h, capacity, k), for `decode_step_cached` (no slot valid yet)."""
        c = self.config
        return [tuple(torch.zeros(batch, c.n_heads, capacity, c.head_dim, dtype=dtype, device=device)
                      for _ in range(2)) for _ in range(c.num_layers)]

    def decode_step_cached(self, tgt, memory_mask, cross_kv, cache, lengths):
        """`decode_step` over a preallocated cache whose rows may sit at different positions:
        what continuous batching and an in-place cache both need.

        tgt (b, t) ids; memory_mask (b, s); cross_kv from `cross_kv`; cache list over layers
        of (K, V) buffers, each (b, h, c, k), of which row r's slots 0 .. lengths[r] - 1 are
        valid (the rest are ignored, whatever they hold); lengths (b,) int64. Row r's new
        tokens take positions lengths[r] .. lengths[r] + t - 1. Returns logits (b, t, v) and
        per layer the new positions' (K, V), each (b, h, t, k): writing them into slots
        lengths[r] .. lengths[r] + t - 1 makes the cache of the next step.
        """
        dec = self.decoder
        t, c = tgt.shape[1], cache[0][0].shape[2]
        positions = lengths[:, None] + torch.arange(t, device=tgt.device)  # (b, t)
        x = dec.pe.at(dec.embedding(tgt), positions)  # (b, t, d)
        past_visible = (torch.arange(c, device=tgt.device)[None, :] < lengths[:, None])[:, None, None, :]  # (b, 1, 1, c)
        causal = generate_mask(t).to(tgt.device)  # (t, t)
        cross_mask = memory_mask[:, None, None, :]  # (b, 1, 1, s)
        new_kv = []
        for layer, kv, ckv in zip(dec.layers, cache, cross_kv, strict=True):
            x, kv = layer.step_cached(x, kv, ckv, past_visible, causal, cross_mask)
            new_kv.append(kv)
        return dec.fc_out(x), new_kv  # (b, t, v)


def generate_mask(size):
    """Causal mask (size, size): True on and below the diagonal (visible), False above."""
    mask = torch.triu(torch.ones(size, size), diagonal=1).bool()
    return mask == 0


def padding_mask(ids, pad_id=0):
    """(b, s) token ids -> (b, 1, 1, s) mask, True where the token is not padding."""
    return (ids != pad_id)[:, None, None, :]
