"""Mamba -> prefill.onnx (one of three scan lowerings) + step.onnx, with explicit state.

Both graphs take and return every layer's (conv_state, ssm_state); zeros start a
fresh sequence. The step graph is the model's one-token `step` (traced from its export-side
formulation, `step_graph`): no loop in it.
"""

import numpy as np
import torch
from torch import nn

from seqexport.errors import UsageError
from seqexport.export import DEFAULT_OPSET, ragged
from seqexport.export.common import (
    dynamic_shapes_for,
    model_in_dtype,
    write_artifact,
)
from seqexport.export.parallel import GraphJob, export_graphs
from seqexport.families.mamba.scan import LOWERINGS, custom_translation_table, scan_for
from seqexport.families.mamba.specs import graph_specs
from seqexport.families.mamba.step_graph import lm_step
from seqexport.models.mamba import MambaLM, selective_scan_ref
from seqexport.parity.inputs import random_inputs
from seqexport.specs import GraphSpec


def specs_for(config, dtype: str = "float32", prefill_len: int | None = None) -> dict[str, GraphSpec]:
    return graph_specs(config.to_dict(), dtype, prefill_len)


def _pairs(flat):
    """[conv0, ssm0, conv1, ssm1, ...] -> [(conv0, ssm0), (conv1, ssm1), ...]"""
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]


def _flat(state):
    return tuple(t for pair in state for t in pair)


class PrefillGraph(nn.Module):
    """(input_ids (b, l), attention_mask (b, l), *state[, logits_to_keep (1,)]) -> logits (b, l
    or the last kept, v), *new state; the scan is a lowering. Rows of unequal length are
    right-padded (export.ragged): each row's state is the one after its own tokens and its
    kept logits its own last ones. Traced without logits_to_keep: export adds it to the graph
    (`keep_last_positions`); here it slices the eager logits alike, for validate."""

    def __init__(self, model: MambaLM, scan=selective_scan_ref):
        super().__init__()
        self.model = model
        self.scan = scan

    def forward(self, input_ids, attention_mask, *state):
        keep = None
        if len(state) % 2:  # (conv, ssm) pairs, then logits_to_keep
            *state, keep = state
        lengths = ragged.row_lengths(attention_mask)  # (b,)

        def scan(u, delta, A, B, C, D, h0):  # delta (b, l, d_in): 0 past a row's end keeps h
            return self.scan(u, delta * ragged.valid(attention_mask, delta), A, B, C, D, h0)

        layers = self.model.backbone.layers
        with ragged.outputs_of([layer.mixer.in_proj for layer in layers]) as seen, \
                ragged.rotated_output(self.model.backbone.norm_f, lengths):
            logits, new_state = self.model(input_ids, _pairs(state), scan=scan)
        new_state = [(_conv_state_at_ends(layer.mixer, projected, conv, lengths), ssm)
                     for layer, projected, (conv, _), (_, ssm) in zip(layers, seen, _pairs(state), new_state, strict=True)]
        if keep is not None and int(keep[0]) > 0:
            logits = logits[:, -int(keep[0]):]  # (b, kept, v)
        return (logits, *_flat(new_state))


def _conv_state_at_ends(mixer, projected, conv_state, lengths):
    """A mixer's new conv state per row: the last k conv inputs up to the row's own end (as
    `MambaMixer.forward` takes them at the padded end). projected: in_proj's output (b, l, 2 d_in);
    conv_state (b, d_in, k) before the tokens; lengths (b,) -> (b, d_in, k)."""
    return ragged.conv_window_at_ends(conv_state, projected[..., : mixer.d_inner].transpose(1, 2), lengths)


class StepGraph(nn.Module):
    """(input_ids (b, 1), *state) -> logits (b, 1, v), *new state. `step_fn(model, ids, state)`:
    the model's own step (validate's reference) or `step_graph.lm_step`, what step.onnx is
    traced from (the same function in ops ONNX Runtime runs well at batch > 1)."""

    def __init__(self, model: MambaLM, step_fn=MambaLM.step):
        super().__init__()
        self.model, self.step_fn = model, step_fn

    def forward(self, input_ids, *state):
        logits, new_state = self.step_fn(self.model, input_ids, _pairs(state))
        return (logits[:, None], *_flat(new_state))


def wrapper(model: MambaLM, graph: str, scan=selective_scan_ref) -> nn.Module:
    """The module each graph is traced from (validate compares with it, with the reference scan)."""
    return PrefillGraph(model, scan) if graph == "prefill" else StepGraph(model)


def example_inputs(spec: GraphSpec, dtype: torch.dtype, length: int) -> tuple:
    """Inputs for tracing; sizes >= 2 and different from each other so no dim is specialised."""
    arrays = random_inputs(spec, dict(batch=2, seq_len=length), np.random.default_rng(0))
    # the SSM state stays float32 whatever the model dtype (DESIGN §4)
    return tuple(torch.from_numpy(arrays[t.name]).to(dtype) if t.role == "state" and t.dtype != "float32"
                 else torch.from_numpy(arrays[t.name]) for t in spec.inputs)


def export_mamba(ckpt, preset: str | None, out, *, scan: str = "loop", seq_len: int | None = None,
                 opset: int = DEFAULT_OPSET, dtype: str = "float32", overwrite: bool = False,
                 tokenizer: dict | None = None):
    """Write prefill.onnx, step.onnx and manifest.json for a loaded Mamba checkpoint."""
    if scan not in LOWERINGS:
        raise UsageError(f"unknown scan lowering {scan!r}; expected one of {list(LOWERINGS)}")
    if scan == "unrolled" and not seq_len:
        raise UsageError("--scan unrolled traces a fixed length: give --seq-len N")
    if scan != "unrolled" and seq_len:
        raise UsageError(f"--seq-len applies to --scan unrolled only (the {scan} prefill has a dynamic length)")
    specs = specs_for(ckpt.config, dtype, seq_len)
    model = model_in_dtype(ckpt.model, dtype)
    tdtype = next(model.parameters()).dtype
    prefill_args = example_inputs(specs["prefill"], tdtype, seq_len or 19)
    step_args = example_inputs(specs["step"], tdtype, 1)

    def build(tmp):
        with torch.no_grad():
            export_graphs([
                GraphJob(f"prefill (scan: {scan})", wrapper(model, "prefill", scan_for(scan)), prefill_args,
                         specs["prefill"], tmp / "prefill.onnx", opset,
                         dynamic_shapes_for(specs["prefill"], varargs_from=2), custom_translation_table(scan)),
                GraphJob("step", StepGraph(model, lm_step), step_args, specs["step"], tmp / "step.onnx", opset,
                         dynamic_shapes_for(specs["step"], varargs_from=1), custom_translation_table(None)),
            ])

    return write_artifact(out, overwrite, ckpt, preset, specs, build, opset=opset, dtype=dtype,
                          options={"scan": scan, "seq_len": seq_len}, tokenizer=tokenizer)


export = export_mamba
