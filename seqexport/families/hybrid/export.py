"""Hybrid attention + Mamba-2, Mamba-1, short conv or Gated DeltaNet -> prefill.onnx (the Mamba-2
layers' chunked SSD, no per-token loop; the Mamba-1 layers' selective scan as one ONNX Scan; the
Gated DeltaNets' delta rule chunked, one Scan over chunks) + step.onnx, over one state of two kinds.

Both graphs take `past_lengths` (each row's valid attention cache slots) and every layer's state
in layer order; they return the attention layers' new K/V only (the runtime appends them in
place) and the other layers' state whole. The prefill takes right-padded rows: past a row's
end a Mamba-2 or Mamba-1 layer gets Δ = 0 and a Gated DeltaNet g = 0 and β = 0 (the state
passes unchanged), and every conv state (a short conv's too) is read at the row's own end; an
attention layer's padded positions come after every real token of the row, so no real token
attends to them, and the runtime advances each row's length by its own tokens (the padded
positions' K/V land in slots that stay invalid).
"""

import types
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch
from torch import nn

from seqexport.errors import UsageError
from seqexport.export import DEFAULT_OPSET, ragged
from seqexport.export.common import dynamic_shapes_for, model_in_dtype, write_artifact
from seqexport.export.parallel import GraphJob, export_graphs
from seqexport.families.attention import check_attention
from seqexport.families.hybrid.attention import fused_attention
from seqexport.families.hybrid.delta_rule import CHUNK as DELTA_CHUNK
from seqexport.families.hybrid.delta_rule import gated_delta_chunked
from seqexport.families.hybrid.delta_rule import translation_table as delta_translation_table
from seqexport.families.hybrid.experts import (
    clipped_layers,
    experts_as,
    experts_in_step,
    resolved,
    translation_table,
)
from seqexport.families.hybrid.specs import graph_specs, layer_inputs
from seqexport.families.mamba.export import _conv_state_at_ends as mamba1_conv_state_at_ends
from seqexport.families.mamba.scan import custom_translation_table, scan_for
from seqexport.families.mamba.step_graph import mixer_step
from seqexport.families.mamba2.export import CHUNK
from seqexport.families.mamba2.export import _conv_state_at_ends as mamba2_conv_state_at_ends
from seqexport.families.mamba2.ssd import ssd_grouped
from seqexport.models.hybrid import (
    ATTENTION_KINDS,
    DELTA_KINDS,
    HybridLM,
    ShortConv,
    gated_delta_ref,
)
from seqexport.models.mamba import selective_scan_ref
from seqexport.models.mamba2 import ssd_sequential
from seqexport.parity.inputs import random_inputs
from seqexport.specs import GraphSpec


def specs_for(config, dtype: str = "float32") -> dict[str, GraphSpec]:
    return graph_specs(config.to_dict(), dtype)


def chunk_of(config, manifest: dict | None = None) -> int:
    """The SSD chunk length of an export (its `chunk_size` option)."""
    chosen = ((manifest or {}).get("export_options") or {}).get("chunk_size")
    return int(chosen or config.chunk_size)


def layers_of(model: HybridLM, flat) -> list[tuple]:
    """The graph's flat state inputs, in layer order -> one tuple per layer (() for an MLP)."""
    out, at = [], 0
    for i, kind in enumerate(model.config.layer_types):
        n = len(layer_inputs(kind, i))  # (a window is a key and a value too)
        out.append(tuple(flat[at: at + n]))
        at += n
    return out


def _flat(state) -> tuple:
    return tuple(t for layer in state for t in layer)


def _conv_state_at_ends(layer, projected, conv_state, lengths):
    """A layer's new conv state per row, at the row's own end: a Mamba-2 mixer's (its x, B, C), a
    Mamba-1 mixer's (its x), a short conv's (B * x) or a Gated DeltaNet's (its q, k, v).
    projected: the mixer's in_proj output (b, l, .); conv_state (b, c, k)."""
    if layer.kind == "conv":
        return ragged.conv_window_at_ends(conv_state, ShortConv.conv_input(projected), lengths)
    if layer.kind == "mamba":
        return mamba1_conv_state_at_ends(layer.mixer, projected, conv_state, lengths)
    if layer.kind in DELTA_KINDS:
        return ragged.conv_window_at_ends(conv_state, projected.transpose(1, 2), lengths)
    return mamba2_conv_state_at_ends(layer.mixer, projected, conv_state, lengths)


class PrefillGraph(nn.Module):
    """(input_ids (b, l), attention_mask (b, l), past_lengths (b,), *state[, logits_to_keep (1,)])
    -> logits (b, l or the last kept, v), *new state (attention: the l new positions)."""

    def __init__(self, model: HybridLM, scan=ssd_sequential, selective_scan=selective_scan_ref,
                 delta_rule=gated_delta_ref):
        super().__init__()
        self.model, self.scan, self.selective_scan, self.delta_rule = model, scan, selective_scan, delta_rule

    def forward(self, input_ids, attention_mask, past_lengths, *state):
        keep = None
        n_state = sum(len(layer_inputs(k, i)) for i, k in enumerate(self.model.config.layer_types))
        if len(state) > n_state:  # the state, then logits_to_keep
            *state, keep = state
        lengths = ragged.row_lengths(attention_mask)  # (b,)

        def scan(x, dt, A, B, C, D, h0):  # dt (b, l, h): 0 past a row's end keeps h
            return self.scan(x, dt * ragged.valid(attention_mask, dt), A, B, C, D, h0)

        def selective_scan(u, delta, A, B, C, D, h0):  # delta (b, l, d_in): 0 past a row's end keeps h
            return self.selective_scan(u, delta * ragged.valid(attention_mask, delta), A, B, C, D, h0)

        def delta_rule(q, k, v, g, beta, s0, lower_bound=None):  # g (b, l, h[, dk]), beta (b, l, h): 0 past
            # a row's end keeps s (and g >= lower_bound still)
            return self.delta_rule(q, k, v, g * ragged.valid(attention_mask, g),
                                   beta * ragged.valid(attention_mask, beta), s0, lower_bound=lower_bound)

        layers = layers_of(self.model, state)
        convs = [(i, layer) for i, layer in enumerate(self.model.layers) if layer.conv_index is not None]
        with ragged.outputs_of([layer.mixer.in_proj for _, layer in convs]) as seen, \
                ragged.rotated_output(self.model.norm_f, lengths), _windows_end_at(self.model, lengths):
            logits, new_state = self.model(input_ids, layers, past_lengths, scan=scan, selective_scan=selective_scan,
                                           delta_rule=delta_rule)
        for (i, layer), projected in zip(convs, seen, strict=True):
            at = layer.conv_index  # the conv state's place in the layer's tuple
            conv = _conv_state_at_ends(layer, projected, layers[i][at], lengths)  # (b, c, k)
            new_state[i] = (*new_state[i][:at], conv, *new_state[i][at + 1:])
        if keep is not None and int(keep[0]) > 0:
            logits = logits[:, -int(keep[0]):]  # (b, kept, v)
        return (logits, *_flat(new_state))


@contextmanager
def _windows_end_at(model: HybridLM, lengths):
    """Within: every sliding-window attention layer takes its new window at each row's own end
    (`lengths` (b,): the rows' new tokens), not at the padded end, as a conv window is taken."""
    def at_row_ends(self, past_key, past_value, k, v):  # past (b, nkv, P, hd), new (b, nkv, l, hd)
        return tuple(ragged.at_ends(torch.cat([past.to(new.dtype), new], dim=2), lengths + past.shape[2],
                                    self.window, axis=2) for past, new in ((past_key, k), (past_value, v)))

    windows = [layer.mixer for layer in model.layers if layer.kind == "attention" and layer.mixer.window]
    for m in windows:
        m.new_state = types.MethodType(at_row_ends, m)
    try:
        yield
    finally:
        for m in windows:
            del m.new_state  # the class's own again


def _mamba1_step(self, hidden, conv_state, ssm_state):
    """`MambaMixer.step` as Mamba's own step graph writes it (`step_graph.mixer_step`: its outer
    products and the sum over n as MatMuls, which ORT runs in one call where a broadcasting Mul
    walks spans of n): hidden (b, 1, d) -> out (b, 1, d), new conv_state, new ssm_state."""
    out, conv_state, ssm_state = mixer_step(self, hidden[:, 0], conv_state, ssm_state)  # out (b, d)
    return out[:, None], conv_state, ssm_state


@contextmanager
def _mamba1_steps(model: HybridLM):
    """Within (a step graph's trace): every "mamba" layer's mixer steps as `_mamba1_step`."""
    mixers = [layer.mixer for layer in model.layers if layer.kind == "mamba"]
    for m in mixers:
        m.step = types.MethodType(_mamba1_step, m)
    try:
        yield
    finally:
        for m in mixers:
            del m.step  # the class's own step again


class StepGraph(nn.Module):
    """(input_ids (b, 1), past_lengths (b,), *state) -> logits (b, 1, v), *new state.
    experts: the export's form of the experts (the dense form's step runs them gathered)."""

    def __init__(self, model: HybridLM, experts: str | None = None):
        super().__init__()
        self.model, self.experts = model, experts

    def forward(self, input_ids, past_lengths, *state):
        with experts_in_step(self.model, self.experts), _mamba1_steps(self.model):
            logits, new_state = self.model.step(input_ids, layers_of(self.model, state), past_lengths)
        return (logits[:, None], *_flat(new_state))


def wrapper(model: HybridLM, graph: str, scan=ssd_sequential) -> nn.Module:
    """The module each graph is traced from (validate compares with it, with the reference)."""
    return PrefillGraph(model, scan) if graph == "prefill" else StepGraph(model)


MAMBA1_LOWERING = "loop"  # a "mamba" layer's selective scan in the prefill: one ONNX Scan (Mamba's default)


def _tables(model: HybridLM, experts: dict | None) -> tuple[dict | None, dict | None]:
    """The custom translation tables of the prefill and the step: the experts' kernel, for Mamba-1
    ("mamba") layers the selective scan's lowering and softplus, as Mamba's export has them, and
    for Gated DeltaNets the delta rule's lowering."""
    kinds = model.config.layer_types
    prefill, step = dict(experts or {}), dict(experts or {})
    if "mamba" in kinds:
        prefill.update(custom_translation_table(MAMBA1_LOWERING))
        step.update(custom_translation_table(None))
    if set(DELTA_KINDS) & set(kinds):
        prefill.update(delta_translation_table())
    return prefill or None, step or None


def _scans(kinds: list[str], chunk: int) -> str:
    """What the prefill's recurrences are lowered to, as the export's progress line names them."""
    parts = [f"chunked SSD, chunk {chunk}" if {"mamba2", "parallel", "zamba"} & set(kinds) else "",
             "selective scan as one Scan" if "mamba" in kinds else "",
             f"delta rule in chunks of {DELTA_CHUNK}" if set(DELTA_KINDS) & set(kinds) else ""]
    return "; ".join(p for p in parts if p) or "no scan"


def example_inputs(spec: GraphSpec, dtype: torch.dtype, length: int) -> tuple:
    """Inputs for tracing; sizes >= 2 and different from each other so no dim is specialised."""
    arrays = random_inputs(spec, dict(batch=2, seq_len=length, past_len=length + 4), np.random.default_rng(0),
                           state_scale=0.1)
    # the SSM state stays float32 whatever the model dtype (DESIGN §4)
    return tuple(torch.from_numpy(arrays[t.name]).to(dtype) if t.role == "state" and t.dtype != "float32"
                 else torch.from_numpy(arrays[t.name]) for t in spec.inputs)


def export_hybrid(ckpt, preset: str | None, out, *, opset: int = DEFAULT_OPSET, dtype: str = "float32",
                  overwrite: bool = False, tokenizer: dict | None = None, attention: str = "matmul",
                  experts: str = "auto"):
    """Write prefill.onnx, step.onnx and manifest.json for a loaded hybrid checkpoint.
    attention: the attention layers', "matmul" (separate nodes) or "fused" (ONNX's `Attention`,
    opset 23 or later: a lower opset is raised to 23). experts: a mixture of experts' form,
    "kernel" (ONNX Runtime's MoE), "dense" (standard ONNX) or "auto" (see experts.py); the form
    used is recorded, only for a model that has experts, and in a kernel export the layers whose
    clipped experts run dense."""
    opset = check_attention(attention, opset)
    kinds = ckpt.config.layer_types
    if not any(k in ATTENTION_KINDS and i not in ckpt.config.sliding_window_layers for i, k in enumerate(kinds)):
        raise UsageError(f"layer_types={kinds} has no full attention layer; expected at least one of "
                         f"{list(ATTENTION_KINDS)} outside sliding_window_layers (the graphs count each row's "
                         "positions by its cache; Mamba-2 layers alone export as `seqexport export mamba2`)")
    specs = specs_for(ckpt.config, dtype)
    model = model_in_dtype(ckpt.model, dtype)
    tdtype = next(model.parameters()).dtype
    chunk = min(ckpt.config.chunk_size, CHUNK)  # as Mamba-2's (measured there)
    prefill_args = example_inputs(specs["prefill"], tdtype, chunk + 3)
    step_args = example_inputs(specs["step"], tdtype, 1)

    try:
        experts = resolved(model, experts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    options = {"chunk_size": chunk, "attention": attention}
    table = None
    if ckpt.config.n_experts:
        options["experts"] = experts
        table = translation_table() if experts == "kernel" else None
        if experts == "kernel" and (clipped := clipped_layers(model)):
            options["dense_expert_layers"] = clipped  # (their SwiGLU clipped: `experts.resolved`)

    prefill_table, step_table = _tables(model, table)
    prefill = PrefillGraph(model, partial(ssd_grouped, chunk=chunk), scan_for(MAMBA1_LOWERING), gated_delta_chunked)

    def build(tmp):
        with torch.no_grad(), fused_attention(model, attention == "fused"), experts_as(model, experts):
            export_graphs([
                GraphJob(f"prefill ({_scans(model.config.layer_types, chunk)})", prefill,
                         prefill_args, specs["prefill"], tmp / "prefill.onnx", opset,
                         dynamic_shapes_for(specs["prefill"], varargs_from=3), prefill_table),
                GraphJob("step", StepGraph(model, experts), step_args, specs["step"], tmp / "step.onnx", opset,
                         dynamic_shapes_for(specs["step"], varargs_from=2), step_table),
            ])

    return write_artifact(out, overwrite, ckpt, preset, specs, build, opset=opset, dtype=dtype,
                          options=options, tokenizer=tokenizer)


export = export_hybrid
