"""The RWKV-7 step graph's export-side formulation: `RwkvLM.step` (l = 1) written for ONNX
Runtime at any batch. Same function as the eager step (validate compares the two); the eager
model stays the reference and holds no export code.

What differs from tracing `RwkvLM.step`, and why (measured one thread, bundled rwkv-dates):
- every activation is 2-D (b, c), not (b, 1, c): each linear is one GEMM, and no token-shift
  concat, Unsqueeze or last-position slice is left in the graph;
- the WKV update S·diag(w) + (S·a)ᵀb + vᵀk takes its two outer products as ONE MatMul with an
  inner size of 2, [S·a, v] (b, h, n, 2) @ [b; k] (b, h, 2, n), instead of two MatMuls with
  an inner size of 1 and an Add (each a pass over the (b, h, n, n) state);
- ln_x, the per-head GroupNorm, is one LayerNormalization over the head size (the eager
  mean / var / rsqrt chain is ~8 nodes).
- the channel mix's square is a Mul (ORT's Pow is a slower kernel). The bonus's per-head sum
  stays a ReduceSum: as a MatMul by a ones constant, `seqexport quantize` would take that
  constant for a weight and make the sum int8 (the int8 copy then failed validate).
Parameters are used as they are (initializers keep their eager names: int8 matches them).

Dimension letters as in models/rwkv.py: b batch, c n_embd, h heads, n head size.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqexport.models.rwkv import DECAY_SCALE, ChannelMix, RwkvLM, TimeMix


def _vec(p: Tensor) -> Tensor:
    """A (1, 1, c) per-channel parameter as (c,)."""
    return p.reshape(-1)  # (c,)


def time_mix(att: TimeMix, x: Tensor, shift: Tensor, wkv: Tensor, v_first: Tensor | None):
    """`TimeMix.forward` for one token: x, shift (b, c) the ln1 outputs now and before, wkv
    (b, h, n, n) float32, v_first (1, b, c) or None -> out (b, c), new wkv, v_first."""
    b, c = x.shape
    h, n = att.n_head, att.head_size
    # the six token-shift mixes x + (shift - x)·m as one Mul and one Add over a (6, 1, c) stack
    mixes = torch.cat([att.x_r, att.x_w, att.x_k, att.x_v, att.x_a, att.x_g]).reshape(6, 1, c)
    xr, xw, xk, xv, xa, xg = torch.split(x + (shift - x) * mixes, 1, dim=0)  # (1, b, c) each
    # r .. g, kk, v_first stay (1, b, c): a MatMul flattens the leading dims into one GEMM
    r = att.receptance(xr)
    w = torch.tanh(xw @ att.w1) @ att.w2
    k = att.key(xk)
    v = att.value(xv)
    a = torch.sigmoid(_vec(att.a0) + (xa @ att.a1) @ att.a2)
    g = torch.sigmoid(xg @ att.g1) @ att.g2

    kk = (k * _vec(att.k_k)).reshape(b, h, n)  # (b, h, n)
    kk = (kk / kk.norm(dim=-1, keepdim=True).clamp_min(1e-12)).reshape(1, b, c)  # κ̂, unit per head
    k = k * (1 + (a - 1) * _vec(att.k_a))
    if v_first is None:
        v_first = v
    else:
        v = v + (v_first - v) * torch.sigmoid(_vec(att.v0) + (xv @ att.v1) @ att.v2)
    w = torch.exp(-DECAY_SCALE * torch.sigmoid((_vec(att.w0) + w).float()))  # (1, b, c) float32

    def col(t: Tensor) -> Tensor:  # (1, b, c) -> (b, h, n, 1) float32
        return t.float().reshape(b, h, n, 1)

    def row(t: Tensor) -> Tensor:  # (1, b, c) -> (b, h, 1, n) float32
        return t.float().reshape(b, h, 1, n)

    s = wkv.float()
    # S = S·diag(w) + (S·(-κ̂))ᵀ(κ̂·a) + vᵀk, both outer products in one MatMul of inner size 2
    cols = torch.cat([s @ col(-kk), col(v)], dim=-1)  # (b, h, n, 2)
    rows = torch.cat([row(kk * a), row(k)], dim=-2)  # (b, h, 2, n)
    # the decay expanded first: a broadcasting Mul over n-wide rows runs at a third of the speed
    s = s * row(w).expand_as(s) + cols @ rows  # (b, h, n, n)
    y = s @ col(r)  # (b, h, n, 1)
    # ln_x: GroupNorm with one group per head = LayerNorm over (n, 1), then the affine per channel
    y = F.layer_norm(y, (n, 1), eps=att.ln_x_eps)  # (b, h, n, 1)
    y = (y * att.ln_x.weight.float().reshape(h, n, 1) + att.ln_x.bias.float().reshape(h, n, 1)).to(x.dtype)
    bonus = col(r * k * att.r_k.float().reshape(c)).sum(-2, keepdim=True) * col(v)  # (b, h, n, 1)
    y = (y + bonus.to(x.dtype)).reshape(1, b, c)  # (1, b, c)
    return att.output(y * g).reshape(b, c), s, v_first  # (b, c)


def channel_mix(ffn: ChannelMix, x: Tensor, shift: Tensor) -> Tensor:
    """`ChannelMix.forward` for one token: x, shift (b, c) -> out (b, c)."""
    k = x + (shift - x) * _vec(ffn.x_k)
    hidden = torch.relu(ffn.key(k))
    return ffn.value(hidden * hidden)  # the square as a Mul (ORT's Pow is a scalar loop)


class FastStepGraph(nn.Module):
    """(input_ids (b, 1), *state) -> logits (b, 1, v), *new state: the step graph's I/O (as
    export.StepGraph, which traces the eager step), every activation (b, c)."""

    def __init__(self, model: RwkvLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, *state):
        m = self.model
        x = m.emb(input_ids.reshape(-1))  # (b, c)
        v_first, out = None, []
        for i, block in enumerate(m.blocks):
            att_shift, wkv, ffn_shift = state[3 * i: 3 * i + 3]
            if i == 0:
                x = block.ln0(x)
            xa = block.ln1(x)
            y, wkv, v_first = time_mix(block.att, xa, att_shift.to(x.dtype), wkv, v_first)
            x = x + y
            xf = block.ln2(x)
            x = x + channel_mix(block.ffn, xf, ffn_shift.to(x.dtype))
            out += [xa, wkv, xf]
        logits = m.head(m.ln_out(x)).float()  # (b, v)
        return (logits.unsqueeze(1), *out)  # (b, 1, v)
