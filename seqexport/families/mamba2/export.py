"""Mamba-2 -> prefill.onnx (the whole prompt at once, no per-token loop) + step.onnx, with
explicit state.

Both graphs take and return every layer's (conv_state, ssm_state); zeros start a fresh
sequence. The prefill is the model's own `forward`; right-padded rows (export.ragged) get
Δ = 0 past their end, which keeps the SSM state exactly. The step graph is the model's
one-token `step`: no loop in it. `--ssd` picks how each layer's SSD and conv are written:
ONNX Runtime's fused com.microsoft LinearAttention + CausalConvWithState kernels in both
graphs (`linear_attention`), plain ONNX ops (`matmul`: the chunked SSD as MatMuls,
`ssd.ssd_grouped`, as the model's scan; the step `lean_step`'s plain form), or `mixed` (the
default): the fused prefill with `lean_step`'s step (the fused conv and state update, no
Transposes of the state).
"""

import contextlib
from functools import partial

import numpy as np
import torch
from torch import nn

from seqexport.errors import UsageError
from seqexport.export import DEFAULT_OPSET, ragged
from seqexport.export.common import dynamic_shapes_for, model_in_dtype, write_artifact
from seqexport.export.parallel import GraphJob, export_graphs
from seqexport.families.mamba2 import lean_step, linear_attention
from seqexport.families.mamba2.lean_step import LeanStepGraph
from seqexport.families.mamba2.specs import graph_specs
from seqexport.families.mamba2.ssd import ssd_grouped
from seqexport.models.mamba2 import Mamba2LM, ssd_sequential
from seqexport.parity.inputs import random_inputs
from seqexport.specs import GraphSpec


def specs_for(config, dtype: str = "float32") -> dict[str, GraphSpec]:
    return graph_specs(config.to_dict(), dtype)


# The prefill's SSD chunk unless --chunk-size says otherwise: the mamba2-130m shape's prefill of
# 1024 tokens (2 layers, ORT, 2 threads) took 1.33 s at 64 against 2.12 s at the config's 256
# (the within-chunk products grow with the chunk; fewer chunks save less than that costs).
CHUNK = 64

# --ssd: how the SSD and the conv are written. "matmul": plain ONNX ops (the chunked SSD as
# MatMuls, `ssd.ssd_grouped`; the conv a Conv); "linear-attention": ONNX Runtime's fused
# com.microsoft LinearAttention and CausalConvWithState kernels, in both graphs (`linear_attention`);
# "mixed" (the default): that prefill with `lean_step`'s step. At the mamba2-130m shape the LA
# prefill of 1024 tokens took 6.9 s against 8.2 s as MatMuls (a loaded machine, 2026-12-01); the
# steps, 2026-12-02 (docs/benchmarks.md, "Mamba-2 against mobius"): mixed 18.6 ms, LA 27.0,
# mobius 18.7.
SSD_FORMS = ("matmul", "linear-attention", "mixed")
SSD = "mixed"


def chunk_of(config, manifest: dict | None = None) -> int:
    """The SSD chunk length of an export (its `chunk_size` option; older manifests: the config's)."""
    chosen = ((manifest or {}).get("export_options") or {}).get("chunk_size")
    return int(chosen or config.chunk_size)


def _pairs(flat):
    """[conv0, ssm0, conv1, ssm1, ...] -> [(conv0, ssm0), (conv1, ssm1), ...]"""
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]


def _flat(state):
    return tuple(t for pair in state for t in pair)


class PrefillGraph(nn.Module):
    """(input_ids (b, l), attention_mask (b, l), *state[, logits_to_keep (1,)]) -> logits (b, l
    or the last kept, v), *new state. Rows of unequal length are right-padded: each row's state
    is the one after its own tokens and its kept logits its own last ones. Traced without
    logits_to_keep: export adds it to the graph (`keep_last_positions`); here it slices the
    eager logits alike, for validate."""

    def __init__(self, model: Mamba2LM, scan=ssd_sequential, fused_chunk: int | None = None):
        super().__init__()
        self.model, self.scan, self.fused_chunk = model, scan, fused_chunk

    def forward(self, input_ids, attention_mask, *state):
        keep = None
        if len(state) % 2:  # (conv, ssm) pairs, then logits_to_keep
            *state, keep = state
        lengths = ragged.row_lengths(attention_mask)  # (b,)

        def scan(x, dt, A, B, C, D, h0):  # dt (b, l, h): 0 past a row's end keeps h
            return self.scan(x, dt * ragged.valid(attention_mask, dt), A, B, C, D, h0)

        layers = self.model.backbone.layers
        with ragged.outputs_of([layer.mixer.in_proj for layer in layers]) as seen, \
                ragged.rotated_output(self.model.backbone.norm_f, lengths), _mixers(layers, self.fused_chunk):
            logits, new_state = self.model(input_ids, _pairs(state), scan=scan)
        new_state = [(_conv_state_at_ends(layer.mixer, projected, conv, lengths), ssm)
                     for layer, projected, (conv, _), (_, ssm) in zip(layers, seen, _pairs(state), new_state, strict=True)]
        if keep is not None and int(keep[0]) > 0:
            logits = logits[:, -int(keep[0]):]  # (b, kept, v)
        return (logits, *_flat(new_state))


def _conv_state_at_ends(mixer, projected, conv_state, lengths):
    """A mixer's new conv state per row: the last k conv inputs (x, B, C) up to the row's own
    end. projected: in_proj's output (b, l, d_in + c + h), split z | xBC | dt; conv_state
    (b, c, k) before the tokens; lengths (b,) -> (b, c, k)."""
    d_in, c = mixer.d_inner, conv_state.shape[1]
    return ragged.conv_window_at_ends(conv_state, projected[..., d_in: d_in + c].transpose(1, 2), lengths)


def _mixers(layers, fused_chunk: int | None):
    """The fused kernels' mixers while a graph runs (fused_chunk: their chunk), else the model's own."""
    if fused_chunk is None:
        return contextlib.nullcontext()
    return linear_attention.linear_attention_mixers(layers, fused_chunk)


class StepGraph(nn.Module):
    """(input_ids (b, 1), *state) -> logits (b, 1, v), *new state."""

    def __init__(self, model: Mamba2LM, fused_chunk: int | None = None):
        super().__init__()
        self.model, self.fused_chunk = model, fused_chunk

    def forward(self, input_ids, *state):
        with _mixers(self.model.backbone.layers, self.fused_chunk):
            logits, new_state = self.model.step(input_ids, _pairs(state))
        return (logits[:, None], *_flat(new_state))


def wrapper(model: Mamba2LM, graph: str, scan=ssd_sequential) -> nn.Module:
    """The module each graph is traced from (validate compares with it, with the reference)."""
    return PrefillGraph(model, scan) if graph == "prefill" else StepGraph(model)


def traced_graphs(model: Mamba2LM, ssd: str, chunk: int) -> tuple[nn.Module, nn.Module, dict | None]:
    """The prefill and step modules of an `ssd` form, and the translation table they need."""
    if ssd not in SSD_FORMS:
        raise UsageError(f"--ssd {ssd!r}: expected one of {', '.join(SSD_FORMS)}")
    if ssd == "matmul":
        return PrefillGraph(model, partial(ssd_grouped, chunk=chunk)), LeanStepGraph(model), lean_step.translation_table()
    fused = partial(linear_attention.ssd_gated, chunk=chunk)
    if ssd == "linear-attention":
        return PrefillGraph(model, fused, fused_chunk=chunk), StepGraph(model, fused_chunk=chunk), \
            linear_attention.translation_table()
    return (PrefillGraph(model, fused, fused_chunk=chunk), LeanStepGraph(model, fused=True),
            {**linear_attention.translation_table(), **lean_step.translation_table()})


def example_inputs(spec: GraphSpec, dtype: torch.dtype, length: int) -> tuple:
    """Inputs for tracing; sizes >= 2 and different from each other so no dim is specialised."""
    arrays = random_inputs(spec, dict(batch=2, seq_len=length), np.random.default_rng(0), state_scale=0.1)
    # the SSM state stays float32 whatever the model dtype (DESIGN §4)
    return tuple(torch.from_numpy(arrays[t.name]).to(dtype) if t.role == "state" and t.dtype != "float32"
                 else torch.from_numpy(arrays[t.name]) for t in spec.inputs)


def export_mamba2(ckpt, preset: str | None, out, *, chunk_size: int | None = None, ssd: str | None = None,
                  opset: int = DEFAULT_OPSET, dtype: str = "float32", overwrite: bool = False,
                  tokenizer: dict | None = None):
    """Write prefill.onnx, step.onnx and manifest.json for a loaded Mamba-2 checkpoint."""
    specs = specs_for(ckpt.config, dtype)
    model = model_in_dtype(ckpt.model, dtype)
    tdtype = next(model.parameters()).dtype
    chunk = chunk_size or CHUNK
    ssd = ssd or SSD
    prefill, step, table = traced_graphs(model, ssd, chunk)
    # a length that is not a multiple of the chunk, over more than one chunk: nothing specialised
    prefill_args = example_inputs(specs["prefill"], tdtype, chunk + 3)
    step_args = example_inputs(specs["step"], tdtype, 1)

    def build(tmp):
        with torch.no_grad():
            export_graphs([
                GraphJob(f"prefill ({ssd} SSD, chunk {chunk})", prefill, prefill_args, specs["prefill"],
                         tmp / "prefill.onnx", opset, dynamic_shapes_for(specs["prefill"], varargs_from=2), table),
                GraphJob(f"step ({ssd})", step, step_args, specs["step"], tmp / "step.onnx", opset,
                         dynamic_shapes_for(specs["step"], varargs_from=1), table),
            ])

    return write_artifact(out, overwrite, ckpt, preset, specs, build, opset=opset, dtype=dtype,
                          options={"chunk_size": chunk, "ssd": ssd}, tokenizer=tokenizer)


export = export_mamba2
