"""`--ssd linear-attention`, the torch side: the Mamba-2 mixer with its conv and SSD as two
custom ops that export to ONNX Runtime's fused `com.microsoft` kernels (the ONNX side is
`linear_attention_onnx`): `CausalConvWithState` (depthwise causal conv + SiLU) and
`LinearAttention(update_rule="gated")` (the SSD recurrence: S_t = exp(g_t) S_{t-1} + k_t v_tᵀ,
o_t = q_tᵀ S_t with q = C, k = B, v = Δx, g = ΔA).

The model is not changed: `linear_attention_mixers` gives each mixer, while a graph is traced
(or run eagerly), a `forward` and a `step` that are its own with those two calls in place of the
conv and the SSD; eagerly the ops compute what the model does (the chunked SSD, the conv), so
validate's eager side and the traced graph stay one module.

Dimension letters as in models/mamba2.py: b batch, l length, h heads, p head dim, g groups,
n state size, k conv width, c conv channels, d_in mixer width.
"""

import contextlib
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from seqexport.families.mamba2.ssd import ssd_grouped


@torch.library.custom_op("seqexport::mamba2_ssd_gated", mutates_args=())
def ssd_gated(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor,
              chunk: int = 64) -> tuple[Tensor, Tensor]:
    """The SSD with the signature of `models.mamba2.ssd_sequential` (plus the kernel's chunk
    hint): exported as one `com.microsoft.LinearAttention` node."""
    return ssd_grouped(x, dt, A, B, C, D, h0, chunk=chunk)


@ssd_gated.register_fake
def _(x, dt, A, B, C, D, h0, chunk=64):
    return torch.empty_like(x), torch.empty_like(h0)


@torch.library.custom_op("seqexport::mamba2_conv_silu", mutates_args=())
def conv_silu(x: Tensor, weight: Tensor, bias: Tensor, past: Tensor) -> Tensor:
    """SiLU(depthwise causal conv) of x (b, c, l) after past (b, c, k - 1), weight (c, 1, k),
    bias (c,) -> (b, c, l): exported as one `com.microsoft.CausalConvWithState` node."""
    return F.silu(F.conv1d(torch.cat([past, x], dim=-1), weight, bias, groups=x.shape[1]))  # (b, c, l)


@conv_silu.register_fake
def _(x, weight, bias, past):
    return torch.empty_like(x)


@torch.library.custom_op("seqexport::mamba2_conv_silu_state", mutates_args=())
def conv_silu_state(x: Tensor, weight: Tensor, bias: Tensor, past: Tensor) -> tuple[Tensor, Tensor]:
    """`conv_silu` that also returns the kernel's present state: the last k - 1 of (past, x)
    -> (SiLU(conv) (b, c, l), present (b, c, k - 1)); one `com.microsoft.CausalConvWithState`
    node, both of its outputs."""
    return conv_silu(x, weight, bias, past), torch.cat([past, x], dim=-1)[:, :, -past.shape[2]:]


@conv_silu_state.register_fake
def _(x, weight, bias, past):
    return torch.empty_like(x), torch.empty_like(past)


@torch.library.custom_op("seqexport::mamba2_state_update", mutates_args=())
def state_update(state: Tensor, dx: Tensor, B: Tensor, log_decay: Tensor) -> Tensor:
    """One token's SSM update in the state's layout: state (b, h, p, n), dx = Δx (b, h, p, 1),
    B (b, g, 1, n), log_decay = ΔA (b, 1, h) -> exp(ΔA) state + Δx ⊗ B (head i with group
    i // (h/g)'s B): exported as one `com.microsoft.LinearAttention` node
    (`linear_attention_onnx.state_update`)."""
    b, h, p, n = state.shape
    g = B.shape[1]
    B = B.expand(b, g, h // g, n).reshape(b, h, 1, n)
    return torch.exp(log_decay).reshape(b, h, 1, 1) * state + dx * B


@state_update.register_fake
def _(state, dx, B, log_decay):
    return torch.empty_like(state)


def _conv(mixer, xbc: Tensor, conv_state: Tensor) -> Tensor:
    """xbc (b, c, l) after the state's last k - 1 inputs -> SiLU(conv) (b, c, l), in float32
    (the kernel's type) and back."""
    w = mixer.conv1d.weight
    bias = mixer.conv1d.bias if mixer.conv1d.bias is not None else torch.zeros(w.shape[0], dtype=w.dtype)
    out = conv_silu(xbc.float(), w.float(), bias.float(), conv_state[:, :, 1:].float())  # (b, c, l)
    return out.to(xbc.dtype)


def _ssm_inputs(mixer, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """xbc (b, l, c) after conv and SiLU -> x (b, l, h, p), B and C (b, l, g, n), float32."""
    gn = mixer.ngroups * mixer.d_state
    x, B, C = torch.split(xbc, [mixer.d_inner, gn, gn], dim=-1)
    return (x.unflatten(-1, (mixer.nheads, mixer.headdim)).float(),  # (b, l, h, p)
            B.unflatten(-1, (mixer.ngroups, mixer.d_state)).float(),  # (b, l, g, n)
            C.unflatten(-1, (mixer.ngroups, mixer.d_state)).float())  # (b, l, g, n)


def mixer_forward(mixer, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor, scan=None):
    """`Mamba2Mixer.forward` with the conv as `conv_silu` and the SSD as `scan` (the prefill's
    wrapper of `ssd_gated`): hidden (b, l, d) -> out (b, l, d), conv_state (b, c, k),
    ssm_state (b, h, p, n) float32."""
    dtype = hidden.dtype
    z, xbc, dt = torch.split(mixer.in_proj(hidden), [mixer.d_inner, mixer.conv_dim, mixer.nheads], dim=-1)
    xbc = xbc.transpose(1, 2)  # (b, c, l)
    new_conv_state = torch.cat([conv_state.to(xbc.dtype), xbc], dim=-1)[:, :, -mixer.d_conv:]  # (b, c, k)
    x, B, C = _ssm_inputs(mixer, _conv(mixer, xbc, conv_state).transpose(1, 2))
    A = -torch.exp(mixer.A_log.float())  # (h,)
    y, new_ssm_state = scan(x, mixer._delta(dt), A, B, C, mixer.D.float(), ssm_state.float())  # (b, l, h, p)
    y = mixer.norm(y.flatten(-2), z)  # (b, l, d_in) float32
    return mixer.out_proj(y.to(dtype)), new_conv_state, new_ssm_state


def mixer_step(mixer, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor, chunk: int = 64):
    """`Mamba2Mixer.step` with the same two kernels (one token each): hidden (b, 1, d)."""
    dtype = hidden.dtype
    z, xbc, dt = torch.split(mixer.in_proj(hidden[:, 0]), [mixer.d_inner, mixer.conv_dim, mixer.nheads], dim=-1)
    new_conv_state = torch.cat([conv_state[:, :, 1:].to(xbc.dtype), xbc[:, :, None]], dim=-1)  # (b, c, k)
    x, B, C = _ssm_inputs(mixer, _conv(mixer, xbc[:, :, None], conv_state).transpose(1, 2))  # l = 1
    A = -torch.exp(mixer.A_log.float())  # (h,)
    y, new_ssm_state = ssd_gated(x, mixer._delta(dt)[:, None], A, B, C, mixer.D.float(), ssm_state.float(),
                                 chunk)  # (b, 1, h, p)
    y = mixer.norm(y[:, 0].flatten(-2), z)  # (b, d_in) float32
    return mixer.out_proj(y.to(dtype))[:, None, :], new_conv_state, new_ssm_state  # (b, 1, d)


@contextlib.contextmanager
def linear_attention_mixers(layers, chunk: int = 64):
    """Within: every layer's mixer runs `mixer_forward` / `mixer_step` (instance attributes,
    removed after, so the model is as it was)."""
    mixers = [layer.mixer for layer in layers]
    for mixer in mixers:
        mixer.forward = partial(mixer_forward, mixer)
        mixer.step = partial(mixer_step, mixer, chunk=chunk)
    try:
        yield
    finally:
        for mixer in mixers:
            del mixer.forward, mixer.step


def translation_table() -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for the two ops."""
    from seqexport.families.mamba2 import linear_attention_onnx  # onnxscript only when exporting

    return {torch.ops.seqexport.mamba2_ssd_gated.default: linear_attention_onnx.ssd_gated,
            torch.ops.seqexport.mamba2_conv_silu.default: linear_attention_onnx.conv_silu,
            torch.ops.seqexport.mamba2_conv_silu_state.default: linear_attention_onnx.conv_silu_state,
            torch.ops.seqexport.mamba2_state_update.default: linear_attention_onnx.state_update}
