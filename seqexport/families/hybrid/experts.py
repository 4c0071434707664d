"""The hybrid's mixture of experts (`models.hybrid.Experts`: Granite-4.0-H Tiny / Small's,
Nemotron-H's) in the two forms an export can write (`export hybrid --experts`; `auto`, the default, is the kernel
where it runs the model's experts, else dense):

- `kernel`: one ONNX Runtime `com.microsoft.MoE` node per layer, which routes each
  token (softmax over the router's logits, the top k, renormalised: the softmax over those k,
  Granite's rule) and runs only its k experts. The CPU kernel takes the gate and up rows
  interleaved (`swiglu_fusion=1`): the export stores them so, once. ONNX Runtime (and
  onnxruntime-web) only, not OpenVINO. Gated SiLU experts only: the CPU kernel has no
  squared-ReLU experts (Nemotron-H's), and clips a SwiGLU only before its activation (Ling 3's
  clipped layers, after it, run dense in a kernel export). Routing the kernel has no rule for
  (sigmoid scores, groups, a choice bias: Kimi-Linear's, Ling 3's, LFM2-MoE's) is computed in
  standard ONNX and handed to it as logits it turns back into the same weights (`_kernel_forward`).
- `dense`: standard ONNX operators. The prefill runs every expert on every token, each output
  weighted by the token's routing weight (zero for the experts it did not take): E / k times
  the experts' arithmetic, as matrix products. The step gathers each row's k experts' weights
  and runs only those (`experts_in_step`): a copy of k experts a row, against reading all E —
  the better trade while rows < E / k. Runs wherever ONNX runs.

Eagerly both compute what the model does (validate's eager side stays the model). Dimension
letters as in models/hybrid.py: n tokens, d width, E experts, fe an expert's width, k experts
a token takes.
"""

import types
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from seqexport.families.hybrid import EXPERT_FORMS as FORMS
from seqexport.models.hybrid import Experts, HybridLM, softmax_top_k, swiglu


def _all_experts(flat: Tensor, gates: Tensor, first: Tensor, down: Tensor, act) -> Tensor:
    """Every expert on every token, each output weighted by the token's gate: flat (n, d),
    gates (n, E) (zero off a token's experts), first (E, f, d) the stack before the activation,
    act: (E, f, n) -> (E, fe, n), down (E, d, fe) -> (n, d). MatMuls over the weights as stored,
    the tokens transposed instead: no Reshape or Transpose of a weight, which the export would
    store a second time (Einsum nodes ran 50x slower in ONNX Runtime at Granite-4.0-H's sizes)."""
    y = down @ act(first @ flat.T)  # (E, d, n)
    return (y * gates.T[:, None, :]).sum(0).T  # (n, d)


def _gates(n: int, e: int, weights: Tensor, experts: Tensor) -> Tensor:
    """(n, k) weights of (n, k) experts -> (n, E), zero for the experts a token did not take."""
    return torch.zeros(n, e, dtype=weights.dtype).scatter(1, experts, weights)


@torch.library.custom_op("seqexport::hybrid_moe", mutates_args=())
def moe(x: Tensor, logits: Tensor, gate_up: Tensor, down: Tensor, k: int, normalize: bool) -> Tensor:
    """x (n, d), the router's logits (n, E), gate_up (E, 2 fe, d) as gate and up rows
    interleaved (g0, u0, g1, u1, ...), down (E, d, fe) -> (n, d): one `com.microsoft.MoE` node.
    normalize: the top k's weights renormalised (Granite: the softmax over the top k), or the
    top k of the softmax over all E as they are (Jamba)."""
    if normalize:
        weights, experts = softmax_top_k(logits, k)
    else:
        weights, experts = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)  # (n, k) each
    gates = _gates(x.shape[0], logits.shape[1], weights.to(x.dtype), experts)
    return _all_experts(x, gates, gate_up, down, lambda h: F.silu(h[:, 0::2]) * h[:, 1::2])


@moe.register_fake
def _(x, logits, gate_up, down, k, normalize):
    return torch.empty_like(x)


def interleaved(gate_up: Tensor) -> Tensor:
    """(E, 2 fe, d) gate rows then up rows -> (E, 2 fe, d) gate and up rows alternating."""
    e, two_fe, d = gate_up.shape
    return gate_up.reshape(e, 2, two_fe // 2, d).transpose(1, 2).reshape(e, two_fe, d).contiguous()


def _kernel_forward(self: Experts, x: Tensor) -> Tensor:
    flat = x.reshape(-1, x.shape[-1])  # (n, d)
    if not self.sigmoid:  # the kernel's own routing rule
        return moe(flat, self.router(flat), self._gate_up_interleaved, self.down_proj, self.k,
                   self.normalize).reshape(x.shape)
    # Routed here; the kernel is handed log w for the k experts taken, the lowest float for the
    # others: its softmax, top k and renormalisation give back w / Σw exactly those k (every other
    # probability 0), and Σw, a number a token, restores the weights' own scale.
    weights, experts = self.route(flat)  # (n, k) each
    low = torch.finfo(flat.dtype)
    logits = torch.full((flat.shape[0], self.down_proj.shape[0]), low.min, dtype=flat.dtype)  # (n, E)
    logits = logits.scatter(1, experts, weights.clamp_min(low.tiny).log())
    out = moe(flat, logits, self._gate_up_interleaved, self.down_proj, self.k, True)  # (n, d)
    return (out * weights.sum(-1, keepdim=True)).reshape(x.shape)


def _dense_forward(self: Experts, x: Tensor) -> Tensor:
    flat = x.reshape(-1, x.shape[-1])  # (n, d)
    gates = _gates(flat.shape[0], self.down_proj.shape[0], *self.route(flat))  # (n, E)
    if self.gated:  # (E, 2 fe, n): gate rows, then up rows
        out = _all_experts(flat, gates, self.gate_up_proj, self.down_proj,
                           lambda h: swiglu(*h.chunk(2, dim=1), self.limit))  # (E, fe, n) each half
    else:
        out = _all_experts(flat, gates, self.up_proj, self.down_proj, lambda h: torch.square(F.relu(h)))
    return out.reshape(x.shape)  # (..., d)


def _gathered_forward(self: Experts, x: Tensor) -> Tensor:
    flat = x.reshape(-1, x.shape[-1])  # (n, d)
    n = flat.shape[0]
    weights, experts = self.route(flat)  # (n, k) each
    picked = experts.reshape(-1)  # (n k,): one Gather per stack copies each row's k experts

    def gathered(stack: Tensor) -> Tensor:  # (E, a, b) -> (n, k, a, b)
        return stack.index_select(0, picked).reshape(n, self.k, *stack.shape[1:])

    column = flat[:, None, :, None]  # (n, 1, d, 1)
    if self.gated:
        h = (gathered(self.gate_up_proj) @ column).squeeze(-1)  # (n, k, 2 fe): its experts' gate and up rows
        act = swiglu(*h.chunk(2, dim=-1), self.limit)  # (n, k, fe)
    else:
        act = torch.square(F.relu((gathered(self.up_proj) @ column).squeeze(-1)))  # (n, k, fe)
    y = (gathered(self.down_proj) @ act[..., None]).squeeze(-1)  # (n, k, d)
    return (y * weights[..., None]).sum(1).reshape(x.shape)  # (..., d)


def _runs_dense(block: Experts, form: str | None) -> bool:
    """Whether `block` runs the dense form in an export of `form`: a dense export, or experts whose
    SwiGLU is clipped after the activation, which the CPU kernel cannot."""
    return form == "dense" or (form == "kernel" and bool(block.limit))


def clipped_layers(model: HybridLM) -> list[int]:
    """The layers whose experts clip their SwiGLU (`expert_swiglu_limits`)."""
    return [i for i, layer in enumerate(model.layers)
            for m in (layer.experts, getattr(layer, "mixer", None)) if isinstance(m, Experts) and m.limit]


@contextmanager
def experts_in_step(model: HybridLM, form: str | None):
    """Within (a step graph's trace): the experts that run dense run gathered (`_runs_dense`)."""
    blocks = [m for m in model.modules() if isinstance(m, Experts) and _runs_dense(m, form)]
    before = [block.forward for block in blocks]
    for block in blocks:
        block.forward = types.MethodType(_gathered_forward, block)
    try:
        yield
    finally:
        for block, forward in zip(blocks, before, strict=True):
            block.forward = forward


def kernel_refusal(model: HybridLM) -> str | None:
    """Why ONNX Runtime's MoE kernel cannot run this model's experts (None: it can)."""
    c = model.config
    if c.n_experts and c.mlp_act != "silu_gated":
        return f"ONNX Runtime's CPU MoE kernel has no {c.mlp_act!r} experts (gated SiLU only)"
    return None


def resolved(model: HybridLM, form: str) -> str:
    """`auto` -> "kernel" where the kernel runs the model's experts, else "dense"; a form named
    outright is checked (ValueError saying why the kernel cannot)."""
    if form not in (*FORMS, "auto"):
        raise ValueError(f"experts form {form!r}; expected one of {['auto', *FORMS]}")
    why = kernel_refusal(model)
    if form == "auto":  # (every layer's experts clipped: no kernel to run)
        blocks = [m for m in model.modules() if isinstance(m, Experts)]
        return "dense" if why or (blocks and len(clipped_layers(model)) == len(blocks)) else "kernel"
    if form == "kernel" and why:
        raise ValueError(f"--experts kernel: {why}; export it with --experts dense (or auto)")
    if form == "kernel" and (clipped := clipped_layers(model)):
        raise ValueError(f"--experts kernel: layers {clipped} clip their experts' SwiGLU after the activation, "
                         "which ONNX Runtime's CPU MoE kernel cannot (onnxruntime 1.32: "
                         "`swiglu_limit_after_activation` needs CUDA); export with --experts auto (the kernel for "
                         "the other layers, these dense) or --experts dense")
    return form


@contextmanager
def experts_as(model: HybridLM, form: str):
    """Within: every `Experts` of `model` runs in `form` ("kernel" or "dense": `resolved`)."""
    if form not in FORMS:
        raise ValueError(f"experts form {form!r}; expected one of {list(FORMS)}")
    blocks = [m for m in model.modules() if isinstance(m, Experts)]
    for block in blocks:
        dense = _runs_dense(block, form)
        if not dense:
            # a buffer, so the export stores the interleaved copy and not the original too
            block.register_buffer("_gate_up_interleaved", interleaved(block.gate_up_proj.detach()), persistent=False)
        block.forward = types.MethodType(_dense_forward if dense else _kernel_forward, block)
    try:
        yield model
    finally:
        for block in blocks:
            del block.forward
            block._buffers.pop("_gate_up_interleaved", None)


def translation_table() -> dict:
    """What `torch.onnx.export(custom_translation_table=...)` needs for the kernel form."""
    from seqexport.families.hybrid import experts_onnx  # onnxscript only when exporting

    return {torch.ops.seqexport.hybrid_moe.default: experts_onnx.moe}
