"""Three ONNX lowerings of the Mamba selective scan, drop-in for `selective_scan_ref`.

Dimension letters (as in models/mamba.py): b batch, l sequence length,
d_in mixer width, n d_state; k a chunk of CHUNK time steps.

Every lowering computes, from h = h0, for t = 0 .. l-1:
    h   = exp(Δ_t A) * h + (Δ_t u_t) B_t
    y_t = <h, C_t> + D u_t
and returns (y (b, l, d_in), h_last (b, d_in, n)), all float32.

- `loop`: a custom op whose ONNX translation is ONE `Scan` node over the time
  steps, the state transposed to (b, n, d_in) inside it (exp(ΔA) and ΔBu made
  per step, never for the whole sequence). Dynamic batch and length; the
  fastest on CPU (DESIGN §5). Its eager kernel is `scan_chunked`.
- `unrolled`: plain torch ops, the same chunked recurrence unrolled by the
  tracer; the length is fixed at export time (batch stays dynamic).
- `parallel`: a custom op whose ONNX translation is pure tensor ops inside one
  `Loop` of ceil(log2 l) Hillis–Steele doubling steps over (a_t, b_t) =
  (exp(Δ_t A), Δ_t u_t B_t) pairs; stable for any Δ (no exp of a cumulative
  sum). Materialises (b, l, d_in, n): meant for accelerators.

Usage: `model(..., scan=scan_for(name))` inside the exported forward, and
`torch.onnx.export(..., custom_translation_table=custom_translation_table(name))`
(from `seqexport.families.mamba.scan`, which joins this torch side with its ONNX side).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from seqexport.families.mamba import LOWERINGS  # declared with the family (the CLI lists them)

# time steps per chunk of `scan_chunked` (the unrolled lowering; the loop lowering's eager
# kernel), as once in the loop lowering's Scan body (a prompt shorter than a chunk computes
# all of it). 8 against 16, begin() medians, 1 thread, paired: short prompts
# faster (bundled mamba-dates 4.1 -> 3.2 ms at 4 tokens, 6.4 -> 5.4 at 24; the 130m preset
# 201 -> 175 ms at 16), 1024 tokens the same within noise (130m 5.59 vs 5.61 s; tiny 2-6%
# slower in two paired runs, 13% faster in a third). RWKV-7's WKV chunk stays 16: 8 was
# faster on short prompts but 8% slower at 1024 tokens on its 0.1B preset.
CHUNK = 8

Scan = Callable[..., tuple[Tensor, Tensor]]


def _scan_chunk(
    h: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor
) -> tuple[Tensor, Tensor]:
    """k steps of the recurrence, without the D skip (the ONNX Scan body, in torch).

    h: (b, 1, d_in, n); u, delta: (b, k, d_in); B, C: (b, k, n).
    Returns y (b, k, d_in) and h (b, 1, d_in, n) after the k steps.
    The outer products are matmuls with an inner size of 1 (exact products): traced, ONNX
    Runtime runs them far faster than a Mul broadcasting over n (see onnx_functions).
    """
    ones = torch.ones(1, A.shape[-1], dtype=A.dtype, device=A.device)  # (1, n)
    dA = torch.exp((delta.unsqueeze(-1) @ ones) * A)  # (b, k, d_in, n)
    dBu = (delta * u).unsqueeze(-1) @ B.unsqueeze(2)  # (b, k, d_in, n)
    hs = []
    for dA_i, dBu_i in zip(dA.split(1, dim=1), dBu.split(1, dim=1), strict=True):
        h = dA_i * h + dBu_i  # (b, 1, d_in, n)
        hs.append(h)
    y = torch.cat(hs, dim=1) @ C.unsqueeze(-1)  # (b, k, d_in, 1)
    return y.squeeze(-1), h


def scan_chunked(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The selective scan, CHUNK steps at a time, in plain torch ops.

    The eager kernel of the `loop` custom op, and the `unrolled` lowering: traced
    by torch.export it unrolls every step (≈3 ONNX nodes a step).
    """
    h = h0.unsqueeze(1)  # (b, 1, d_in, n)
    ys = []
    for t0 in range(0, u.shape[1], CHUNK):
        t1 = t0 + CHUNK
        y, h = _scan_chunk(h, u[:, t0:t1], delta[:, t0:t1], A, B[:, t0:t1], C[:, t0:t1])
        ys.append(y)
    y = torch.cat(ys, dim=1) if ys else torch.zeros_like(u)  # (b, l, d_in)
    return y + u * D, h.squeeze(1)


def scan_unrolled(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The `unrolled` lowering: `scan_chunked`, refusing a length that is symbolic at export."""
    if isinstance(u.shape[1], torch.SymInt):
        raise ValueError(
            "the 'unrolled' scan lowering needs a static sequence length at export; "
            "drop the length from dynamic_shapes or use the 'loop' lowering"
        )
    return scan_chunked(u, delta, A, B, C, D, h0)


def scan_doubling(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The selective scan as a Hillis–Steele doubling scan (eager twin of `parallel`).

    Pairs (a_t, b_t) compose as (a1, b1) then (a2, b2) -> (a1 a2, a2 b1 + b2);
    after ceil(log2 l) doubling steps b_t is h_t. h0 is folded into b_0.
    """
    length = u.shape[1]
    a = torch.exp(delta.unsqueeze(-1) * A)  # (b, l, d_in, n)
    bx = (delta * u).unsqueeze(-1) * B.unsqueeze(2)  # (b, l, d_in, n)
    bx = torch.cat([a[:, :1] * h0.unsqueeze(1) + bx[:, :1], bx[:, 1:]], dim=1)
    shift = 1
    while shift < length:
        a_prev = F.pad(a[:, : length - shift], (0, 0, 0, 0, shift, 0), value=1.0)
        b_prev = F.pad(bx[:, : length - shift], (0, 0, 0, 0, shift, 0))
        bx = a * b_prev + bx
        a = a * a_prev
        shift *= 2
    y = (bx @ C.unsqueeze(-1)).squeeze(-1)  # (b, l, d_in)
    return y + u * D, bx[:, -1] if length else h0.clone()


@torch.library.custom_op("seqexport::selective_scan_chunked", mutates_args=())
def selective_scan_chunked(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The `loop` lowering: exported as one ONNX Scan over the time steps."""
    y, h = scan_chunked(u, delta, A, B, C, D, h0)
    return y, h.clone() if u.shape[1] == 0 else h


@torch.library.custom_op("seqexport::selective_scan_doubling", mutates_args=())
def selective_scan_doubling(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The `parallel` lowering: exported as a Loop of ceil(log2 l) doubling steps."""
    return scan_doubling(u, delta, A, B, C, D, h0)


@selective_scan_chunked.register_fake
def _(u, delta, A, B, C, D, h0):
    return torch.empty_like(u), torch.empty_like(h0)


@selective_scan_doubling.register_fake
def _(u, delta, A, B, C, D, h0):
    return torch.empty_like(u), torch.empty_like(h0)


def check_lowering(lowering: str) -> None:
    if lowering not in LOWERINGS:
        raise ValueError(f"unknown scan lowering {lowering!r}; expected one of {LOWERINGS}")


def scan_for(lowering: str) -> Scan:
    """The scan function of a lowering, to pass as the model's `scan=` during export."""
    check_lowering(lowering)
    return {
        "loop": selective_scan_chunked,
        "unrolled": scan_unrolled,
        "parallel": selective_scan_doubling,
    }[lowering]
