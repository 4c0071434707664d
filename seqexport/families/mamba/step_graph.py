"""The Mamba step graph's export-side formulation: `MambaLM.step` (l = 1) written for ONNX
Runtime at any batch. Same function as the eager step (validate compares the two); the eager
model stays the reference and holds no export code.

What differs from tracing `MambaLM.step`, and why (ORT's CPU profile of the bundled
mamba-dates step at batch 16, one thread): ORT's broadcasting Mul walks the output in spans
of the innermost broadcast dim, here n = 16, one kernel call per span, so
- the outer products Δu ⊗ B and Δ ⊗ 1 are MatMuls with an inner size of 1 (exact products,
  as the eager broadcast), and the sum over n of h·C is a MatMul (b, d_in, n) @ (b, n, 1);
- (Δ = softplus goes to ONNX as relu(x) - log(sigmoid(|x|)), vectorised ops, in both graphs:
  `seqexport.families.mamba.scan.custom_translation_table`);
- RMSNorm is x / sqrt(mean(x²) + eps) · w, the pattern ORT fuses into one
  SimplifiedLayerNormalization node (the eager x · rsqrt(..) is seven nodes);
- every activation is 2-D (b, ·), not (b, 1, ·): no Gather of position 0 nor Unsqueeze per
  residual add.
Parameters are used as they are (initializers keep their eager names: int8 matches them).

Dimension letters as in models/mamba.py: b batch, d d_model, d_in d_inner, n d_state, k d_conv.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from seqexport.models.mamba import MambaLM, MambaMixer, RMSNorm


def rms_norm(norm: RMSNorm, x: Tensor) -> Tensor:
    """`RMSNorm.forward` with a division by the root (ORT fuses this form): (..., d) -> (..., d)."""
    xf = x.float()
    xf = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)
    return xf.to(x.dtype) * norm.weight


def mixer_step(m: MambaMixer, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor):
    """`MambaMixer.step` on hidden (b, d), conv_state (b, d_in, k), ssm_state (b, d_in, n)
    float32 -> out (b, d), new conv_state, new ssm_state."""
    dtype = hidden.dtype
    x, z = m.in_proj(hidden).chunk(2, dim=-1)  # (b, d_in) each
    new_conv_state = torch.cat([conv_state[:, :, 1:].to(x.dtype), x[:, :, None]], dim=-1)  # (b, d_in, k)
    x = (new_conv_state * m.conv1d.weight[:, 0, :]).sum(-1)  # (b, d_in)
    if m.conv1d.bias is not None:
        x = x + m.conv1d.bias
    x = F.silu(x)

    dt, B, C = m.dt_b_c(x)  # (b, r), (b, n), (b, n)
    dt = F.linear(dt, m.dt_proj.weight).float() + m.dt_proj.bias.float()  # (b, d_in)
    delta = F.softplus(dt)  # exported in vectorised ops (scan.onnx_functions.softplus)
    A = -torch.exp(m.A_log.float())  # (d_in, n)
    u = x.float()
    ones = torch.ones(1, m.d_state, dtype=torch.float32, device=x.device)  # (1, n)
    dA = torch.exp((delta[:, :, None] @ ones) * A)  # (b, d_in, n)
    dBu = (delta * u)[:, :, None] @ B.float()[:, None, :]  # (b, d_in, n)
    new_ssm_state = dA * ssm_state.float() + dBu  # (b, d_in, n)
    y = (new_ssm_state @ C.float()[:, :, None]).squeeze(-1) + m.D.float() * u  # (b, d_in)
    y = (y * F.silu(z.float())).to(dtype)
    return m.out_proj(y), new_conv_state, new_ssm_state


def lm_step(model: MambaLM, input_ids: Tensor, state: list) -> tuple[Tensor, list]:
    """`MambaLM.step`: input_ids (b, 1), state [(conv, ssm)] per layer -> logits (b, v), new state."""
    bb = model.backbone
    x = bb.embedding(input_ids.reshape(-1))  # (b, d)
    new_state = []
    for layer, (conv_state, ssm_state) in zip(bb.layers, state, strict=True):
        out, conv_state, ssm_state = mixer_step(layer.mixer, rms_norm(layer.norm, x), conv_state, ssm_state)
        x = x + out
        new_state.append((conv_state, ssm_state))
    logits = model.lm_head(rms_norm(bb.norm_f, x)).float()[..., : model.config.vocab_size]  # (b, v)
    return logits, new_state

