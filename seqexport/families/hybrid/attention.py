"""The hybrid's attention layers as ONNX's own `Attention` operator (opset 23), for export.

`models.hybrid.Attention` computes q·Kᵀ, its mask, softmax and the product with V as separate
ops (each kv head's query heads as rows of one product). `fused_attention(model)` gives each
attention layer, while it is exported, a forward that does the same with one
`scaled_dot_product_attention` (`enable_gqa`: the kv heads are not repeated), which torch.onnx
(dynamo, opset 23+) writes as one `Attention` node with q_num_heads / kv_num_heads. Inputs,
outputs and the mask are the model's: the graphs keep their spec (the new positions' K/V out,
written in place by the runtime). Dimension letters as in models/hybrid.py: b batch, l new positions, P cache slots,
nh / nkv query / kv heads, hd head size.
"""

import types
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.nn import functional as F

from seqexport.models.hybrid import Attention, HybridLM, LatentAttention, visible_slots


def _fused_forward(self, x: Tensor, past_key: Tensor, past_value: Tensor, past_lengths: Tensor,
                   rope: tuple[Tensor, Tensor] | None, step: bool = False,
                   adapters: dict | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """`models.hybrid.Attention.forward`, its attention one scaled_dot_product_attention (for a
    step as for a prefill)."""
    b, length, _ = x.shape
    P = past_key.shape[2]
    q, k, v, gate = self.project(x, rope, adapters)  # (b, nh, l, hd), (b, nkv, l, hd) x2, the gate or None
    keys = torch.cat([past_key.to(k.dtype), k], dim=2)  # (b, nkv, P + l, hd)
    values = torch.cat([past_value.to(v.dtype), v], dim=2)  # (b, nkv, P + l, hd)
    # visible: the valid past slots, and the new positions up to and including the query's own
    past_visible, causal = self.visible(past_lengths, P, length)  # (b, 1, 1 or l, P), (l, l); a window's too
    visible = torch.cat([past_visible.expand(b, 1, length, P), causal.expand(b, 1, length, length)],
                        dim=-1)  # (b, 1, l, P + l)
    # enable_gqa only where the kv heads are fewer: torch.onnx's translation refuses it for equal
    # counts (multi-head attention: Zamba2's shared blocks)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=self.scale,
                                         enable_gqa=self.n_heads != self.n_kv_heads)  # (b, nh, l, hd)
    out = out.transpose(1, 2).reshape(b, length, self.n_heads * self.head_dim)  # (b, l, nh * hd)
    return self.output(out, gate), self.new_state(past_key, past_value, k, v)


def _fused_latent_forward(self, x: Tensor, past_latent: Tensor, past_rope: Tensor, past_lengths: Tensor,
                          positions: tuple[Tensor, Tensor] | None = None, step: bool = False
                          ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """`models.hybrid.LatentAttention.forward` with one scaled_dot_product_attention: in the
    latent its heads are multi-query attention over one kv head, keys [c; k_r] (r + rd) and
    values c (r)."""
    b, length, _ = x.shape
    P = past_latent.shape[2]
    q_latent, q_rope, latent, rope = self.project(x, positions)  # (b, nh, l, r | rd), (b, 1, l, r | rd)
    latents = torch.cat([past_latent.to(latent.dtype), latent], dim=2)  # (b, 1, P + l, r)
    keys = torch.cat([latents, torch.cat([past_rope.to(rope.dtype), rope], dim=2)], dim=-1)  # (b, 1, P + l, r + rd)
    past_visible, causal = visible_slots(past_lengths, P, length)  # (b, 1, 1, P), (l, l)
    visible = torch.cat([past_visible.expand(b, 1, length, P), causal.expand(b, 1, length, length)],
                        dim=-1)  # (b, 1, l, P + l)
    mixed = F.scaled_dot_product_attention(torch.cat([q_latent, q_rope], dim=-1), keys, latents, attn_mask=visible,
                                           scale=self.scale, enable_gqa=self.n_heads != 1)  # (b, nh, l, r)
    return self.output(mixed, x), (latent, rope)


@contextmanager
def fused_attention(model: HybridLM, fused: bool = True):
    """Within: every attention layer of `model` runs `_fused_forward` (a latent attention layer
    `_fused_latent_forward`; nothing when not `fused`)."""
    mixers = [m for m in model.modules() if isinstance(m, Attention | LatentAttention)] if fused else []
    for m in mixers:  # (zamba's attention: in shared blocks)
        forward = _fused_latent_forward if isinstance(m, LatentAttention) else _fused_forward
        m.forward = types.MethodType(forward, m)
    try:
        yield model
    finally:
        for m in mixers:
            del m.forward  # the class's own forward again
