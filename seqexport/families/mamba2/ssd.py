"""The chunked SSD as the export traces it: `models.mamba2.ssd_chunked` (same arguments, same
results) written with MatMuls instead of Einsums, heads grouped as B and C are.

ONNX Runtime's CPU Einsum ran the einsum form's five products at 58% of a 1024-token prefill of
the mamba2-130m shape (2 layers: 2.18 of 3.74 s, profiled); as MatMuls over (b, g, h/g, chunk,
...) blocks they are batched GEMMs, and C·Bᵀ — shared by the heads of a group — is computed once
per group instead of once per head (mamba2-130m: 24 heads, 1 group).

Dimension letters as in models/mamba2.py: b batch, l length, h heads, p head dim, g groups,
r = h / g heads per group, n state size, c chunks, t positions in a chunk.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from seqexport.models.mamba2 import segsum

FLUSH_BELOW = -40.0  # a log decay below this is e^x = 0 (see `_exp`)


def _exp(x: Tensor) -> Tensor:
    """e^x, exactly 0 where x < FLUSH_BELOW: a decay of e^-40 (4e-18) or less is nothing beside
    the terms of order 1 it is summed with (float32 keeps 7 digits), and between e^-87 and e^-103
    e^x is a subnormal float, which Intel's cores compute with many times slower (as the delta
    rule's lowering does, families/hybrid/delta_rule_onnx.py)."""
    return torch.exp(x.masked_fill(x < FLUSH_BELOW, -torch.inf))


def ssd_grouped(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor,
                chunk: int = 64) -> tuple[Tensor, Tensor]:
    """x (b, l, h, p), dt (b, l, h), A (h,), B and C (b, l, g, n), D (h,), h0 (b, h, p, n) ->
    y (b, l, h, p), the final state (b, h, p, n); see `models.mamba2.ssd_chunked`."""
    b, length, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    nc = (length + chunk - 1) // chunk
    pad = nc * chunk - length  # Δ = 0 on the padding: the state passes it unchanged

    def blocks(t: Tensor, *tail: int) -> Tensor:
        """(b, l, h or g, *tail) padded to nc chunks -> (b, ·, nc, chunk, *tail), heads before chunks."""
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        t = t.reshape(b, nc, chunk, t.shape[2], *tail)  # (b, nc, chunk, ·, *tail)
        return t.permute(0, 3, 1, 2, *range(4, 4 + len(tail)))

    xdt = blocks(x * dt[..., None], p).reshape(b, g, r, nc, chunk, p)  # (b, g, r, c, t, p): Δx
    Adt = blocks((A * dt)[..., None], 1)[..., 0].reshape(b, g, r, nc, chunk)  # (b, g, r, c, t): ΔA
    Bc = blocks(B, n)[:, :, None]  # (b, g, 1, c, t, n)
    Cc = blocks(C, n)[:, :, None]  # (b, g, 1, c, t, n)
    A_cumsum = torch.cumsum(Adt, dim=-1)  # (b, g, r, c, t)

    # 1. within each chunk: y_i = sum_{j<=i} (C_i . B_j) exp(ΔA_j+1 + .. + ΔA_i) Δx_j
    scores = (Cc @ Bc.transpose(-1, -2)) * _exp(segsum(Adt))  # (b, g, r, c, t, t)
    y_diag = scores @ xdt  # (b, g, r, c, t, p)
    # 2. each chunk's contribution to the state at its end
    decay_to_end = _exp(A_cumsum[..., -1:] - A_cumsum)  # (b, g, r, c, t)
    states = (xdt * decay_to_end[..., None]).transpose(-1, -2) @ Bc  # (b, g, r, c, p, n)
    # 3. the state at every chunk start and the final one: a segsum matrix over chunks
    h0 = h0.reshape(b, g, r, 1, p, n).to(states.dtype)
    states = torch.cat([h0, states], dim=3)  # (b, g, r, c + 1, p, n)
    decay_chunk = _exp(segsum(F.pad(A_cumsum[..., -1], (1, 0))))  # (b, g, r, c + 1, c + 1)
    states = (decay_chunk @ states.reshape(b, g, r, nc + 1, p * n)).reshape(b, g, r, nc + 1, p, n)
    final = states[:, :, :, -1].reshape(b, h, p, n)  # (b, h, p, n)
    # 4. the chunk start states read out by C, decayed to each position
    y_off = (Cc @ states[:, :, :, :-1].transpose(-1, -2)) * _exp(A_cumsum)[..., None]  # (b, g, r, c, t, p)

    y = (y_diag + y_off).reshape(b, h, nc * chunk, p).transpose(1, 2)[:, :length]  # (b, l, h, p)
    return y + D[:, None] * x, final
