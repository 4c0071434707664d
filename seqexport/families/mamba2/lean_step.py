"""The step graph in few plain ONNX ops: `Mamba2LM.step` (one token, no loop) written for ONNX
Runtime's CPU, used by `--ssd matmul` and `--ssd mixed`.

What the traced model's own `step` costs at the mamba2-130m shape (2 threads, ORT profiled,
2026-12-02): 1333 nodes (mobius' graph of the same model: 772), and with the fused kernels two
Transposes of every layer's (b, h, p, n) state (the kernel keeps (b, h, n, p)), 4 ms of its
30. Here, per layer:

- the RMSNorms as x / sqrt(mean(x²) + eps) · w, which ORT fuses into one
  SimplifiedLayerNormalization node (and, with the residual Add before it, into
  SkipSimplifiedLayerNormalization); the model's x · rsqrt(...) stays six nodes;
- the SSM update in the state's own layout, heads grouped as B and C are
  (b, g, h/g, p, n): S' = exp(ΔA) S + Δx ⊗ B, y = S' C as one batched MatMul
  (the model's Mul + ReduceSum writes a state-sized product first);
- Δ = clamp(softplus(dt + dt_bias)) as the model computes it.

Same inputs, outputs and numbers as the model's step (the same float32 operations up to
rounding order); dimension letters as in models/mamba2.py.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqexport.families.mamba2 import linear_attention
from seqexport.models.mamba2 import Mamba2LM


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x (..., d) -> x / sqrt(mean(x²) + eps) · weight, in float32 and back to x's dtype: the
    pattern ORT's SimplifiedLayerNormFusion matches (the model's rsqrt form it does not)."""
    xf = x.float()
    return (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _gated_norm(norm, y: Tensor, z: Tensor) -> Tensor:
    """`RMSNormGated` of y (b, d_in) float32 gated by z: one normalisation per group."""
    gate = F.silu(z.float())
    if not norm.norm_before_gate:
        y = y * gate
    if norm.group_size == y.shape[-1]:  # one group (the usual case): no reshapes around it
        y = rms_norm(y, norm.weight.float(), norm.eps)
    else:
        ones = torch.ones(norm.group_size, dtype=y.dtype)
        y = rms_norm(y.unflatten(-1, (-1, norm.group_size)), ones, norm.eps).flatten(-2) * norm.weight.float()
    return y * gate if norm.norm_before_gate else y


@torch.library.custom_op("seqexport::softplus", mutates_args=())
def softplus(x: Tensor) -> Tensor:
    """softplus(x): exported as one ONNX Softplus node (ORT's is stable at any x), where
    torch.onnx writes softplus as Softplus, Greater and Where (its threshold of 20)."""
    return F.softplus(x)


@softplus.register_fake
def _(x):
    return torch.empty_like(x)


def _conv(mixer, xbc: Tensor, conv_state: Tensor, fused: bool) -> tuple[Tensor, Tensor]:
    """xbc (b, 1, c) -> SiLU(conv) (b, c, 1) and the new conv state (b, c, k): as Slice, Concat,
    Mul and ReduceSum, or (fused) one CausalConvWithState node whose present state is the new
    state: its weight padded to k + 1 taps with a zero in front, so that its past is all k
    columns of ours (the oldest one times 0) and its present the last k of (state, x)."""
    b, c = xbc.shape[0], xbc.shape[2]
    xbc = xbc.reshape(b, c, 1)  # (b, c, 1): the same memory, no Transpose
    w = mixer.conv1d.weight
    if fused:
        bias = mixer.conv1d.bias if mixer.conv1d.bias is not None else torch.zeros(w.shape[0], dtype=w.dtype)
        out, new_conv_state = linear_attention.conv_silu_state(xbc.float(), F.pad(w.float(), (1, 0)), bias.float(),
                                                               conv_state.float())
        return out.to(xbc.dtype), new_conv_state.to(conv_state.dtype)
    new_conv_state = torch.cat([conv_state[:, :, 1:].to(xbc.dtype), xbc], dim=-1)  # (b, c, k)
    out = (new_conv_state * w[:, 0, :]).sum(-1, keepdim=True)  # (b, c, 1)
    if mixer.conv1d.bias is not None:
        out = out + mixer.conv1d.bias[:, None]
    return F.silu(out), new_conv_state


def _update(state: Tensor, dx: Tensor, B: Tensor, dA: Tensor, fused: bool) -> Tensor:
    """exp(ΔA) state + Δx ⊗ B: state (b, h, p, n), dx (b, h, p, 1), B (b, g·n, 1), dA (b, 1, h)
    -> (b, h, p, n). Plain: three passes over the state (Mul, Mul, Add); fused: one
    LinearAttention node (`linear_attention.state_update`), which reads and writes it once."""
    b, h, p, n = state.shape
    g = B.shape[1] // n
    if fused:
        return linear_attention.state_update(state, dx, B.reshape(b, g, 1, n), dA)
    decay = torch.exp(dA).reshape(b, h, 1, 1)
    if g == 1:  # B broadcasts over the heads as it is
        return decay * state + dx * B.reshape(b, 1, 1, n)
    r = h // g  # heads grouped as B is: (b, g, h/g, p, n)
    new = decay.reshape(b, g, r, 1, 1) * state.reshape(b, g, r, p, n) + dx.reshape(b, g, r, p, 1) * \
        B.reshape(b, g, 1, 1, n)
    return new.reshape(b, h, p, n)


def _read(state: Tensor, C: Tensor) -> Tensor:
    """state (b, h, p, n) · C (b, g·n, 1), head i with group i // (h/g)'s C -> (b, h, p, 1): one MatMul."""
    b, h, p, n = state.shape
    g = C.shape[1] // n
    if g == 1:
        return state @ C.reshape(b, 1, n, 1)
    return (state.reshape(b, g, h // g, p, n) @ C.reshape(b, g, 1, n, 1)).reshape(b, h, p, 1)


def mixer_step(mixer, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor,
               fused: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """`Mamba2Mixer.step` in fewer ops: hidden (b, 1, d) normalised -> out (b, 1, d), new
    conv_state (b, c, k), new ssm_state (b, h, p, n) float32."""
    b = hidden.shape[0]
    h, p, gn = mixer.nheads, mixer.headdim, mixer.ngroups * mixer.d_state
    dtype = hidden.dtype
    z, xbc, dt = torch.split(mixer.in_proj(hidden), [mixer.d_inner, mixer.conv_dim, h], dim=-1)  # (b, 1, ·)
    xbc, new_conv_state = _conv(mixer, xbc, conv_state, fused)  # (b, c, 1)
    x, B, C = torch.split(xbc.float(), [mixer.d_inner, gn, gn], dim=1)  # (b, ·, 1)
    delta = softplus(dt.float() + mixer.dt_bias.float())
    if mixer.dt_min_limit > 0 or mixer.dt_max_limit is not None:  # softplus is > 0: clamp(min=0) is no-op
        delta = delta.clamp(min=mixer.dt_min_limit, max=mixer.dt_max_limit)
    x = x.reshape(b, h, p, 1)
    new_state = _update(ssm_state.float(), delta.reshape(b, h, 1, 1) * x, B,
                        delta * -torch.exp(mixer.A_log.float()), fused)  # (b, h, p, n)
    y = _read(new_state, C) + mixer.D.float()[:, None, None] * x  # (b, h, p, 1)
    y = _gated_norm(mixer.norm, y.reshape(b, 1, h * p), z)  # (b, 1, d_in) float32
    return mixer.out_proj(y.to(dtype)), new_conv_state, new_state


def step(model: Mamba2LM, input_ids: Tensor, state: list, fused: bool = False) -> tuple[Tensor, list]:
    """`Mamba2LM.step`: input_ids (b, 1) -> logits (b, 1, vocab_size) float32, new state. The
    hidden stays (b, 1, d): ORT fuses a residual Add with the RMSNorm after it only in 3-D."""
    backbone = model.backbone
    x = backbone.embedding(input_ids)  # (b, 1, d)
    new_state = []
    for layer, (conv_state, ssm_state) in zip(backbone.layers, state, strict=True):
        out, conv_state, ssm_state = mixer_step(layer.mixer, rms_norm(x, layer.norm.weight, layer.norm.eps),
                                                conv_state, ssm_state, fused)
        x = x + out
        new_state.append((conv_state, ssm_state))
    hidden = rms_norm(x, backbone.norm_f.weight, backbone.norm_f.eps)
    logits = model.lm_head(hidden).float()
    if logits.shape[-1] != model.config.vocab_size:  # the padding rows of the head (a copy of all the logits)
        logits = logits[..., : model.config.vocab_size]
    return logits, new_state


def translation_table() -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for `softplus`."""
    from onnxscript import FLOAT
    from onnxscript import opset18 as op

    def softplus_onnx(x: FLOAT) -> FLOAT:
        return op.Softplus(x)

    return {torch.ops.seqexport.softplus.default: softplus_onnx}


class LeanStepGraph(nn.Module):
    """(input_ids (b, 1), *state) -> logits (b, 1, v), *new state: `step` above."""

    def __init__(self, model: Mamba2LM, fused: bool = False):
        super().__init__()
        self.model, self.fused = model, fused

    def forward(self, input_ids, *state):
        logits, new_state = step(self.model, input_ids, [(state[2 * i], state[2 * i + 1])
                                                         for i in range(len(state) // 2)], self.fused)
        return (logits, *(t for pair in new_state for t in pair))
