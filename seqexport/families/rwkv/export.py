"""RWKV-7 -> prefill.onnx (the WKV recurrence as one chunked Scan) + step.onnx, with explicit
state.

Both graphs take and return every layer's (att_shift, wkv_state, ffn_shift); zeros start a
fresh sequence. The step graph is the model's one-token `step`: no loop in it.
"""

import numpy as np
import torch
from torch import nn

from seqexport.export import DEFAULT_OPSET, ragged
from seqexport.export.common import (
    dynamic_shapes_for,
    model_in_dtype,
    write_artifact,
)
from seqexport.export.parallel import GraphJob, export_graphs
from seqexport.families.rwkv.specs import graph_specs
from seqexport.families.rwkv.step_graph import FastStepGraph
from seqexport.families.rwkv.wkv import wkv7_chunked, wkv_translation_table
from seqexport.models.rwkv import RwkvLM, wkv7_ref
from seqexport.parity.inputs import random_inputs
from seqexport.specs import GraphSpec


def specs_for(config, dtype: str = "float32") -> dict[str, GraphSpec]:
    return graph_specs(config.to_dict(), dtype)


def _layers(flat):
    """[att0, wkv0, ffn0, att1, ...] -> [(att0, wkv0, ffn0), (att1, ...), ...]"""
    return [tuple(flat[3 * i: 3 * i + 3]) for i in range(len(flat) // 3)]


def _flat(state):
    return tuple(t for layer in state for t in layer)


class PrefillGraph(nn.Module):
    """(input_ids (b, l), attention_mask (b, l), *state[, logits_to_keep (1,)]) -> logits (b, l
    or the last kept, v), *new state; the WKV is the chunked Scan. Rows of unequal length are
    right-padded (export.ragged): each row's state is the one after its own tokens and its
    kept logits its own last ones. Traced without logits_to_keep: export adds it to the graph
    (`keep_last_positions`); here it slices the eager logits alike, for validate."""

    def __init__(self, model: RwkvLM, scan=wkv7_ref):
        super().__init__()
        self.model, self.scan = model, scan

    def forward(self, input_ids, attention_mask, *state):
        keep = None
        if len(state) % 3:  # (att_shift, wkv, ffn_shift) triples, then logits_to_keep
            *state, keep = state
        lengths = ragged.row_lengths(attention_mask)  # (b,)

        def scan(r, w, k, v, a, b, s0):  # (b, l, h, n) each: past a row's end S passes unchanged
            m = ragged.valid(attention_mask, w)
            return self.scan(r, torch.where(m > 0, w, torch.ones_like(w)), k * m, v, a, b * m, s0)

        norms = [ln for block in self.model.blocks for ln in (block.ln1, block.ln2)]
        with ragged.outputs_of(norms) as seen, ragged.rotated_output(self.model.ln_out, lengths):
            logits, new_state = self.model(input_ids, _layers(state), scan=scan)
        # token shifts: each layer's ln1 / ln2 output at the row's last token (seen in call order)
        ends = [ragged.at_ends(x, lengths, 1, axis=1)[:, 0] for x in seen]  # (b, c) each
        new_state = [(ends[2 * i], wkv, ends[2 * i + 1]) for i, (_, wkv, _) in enumerate(new_state)]
        if keep is not None and int(keep[0]) > 0:
            logits = logits[:, -int(keep[0]):]  # (b, kept, v)
        return (logits, *_flat(new_state))


class StepGraph(nn.Module):
    """(input_ids (b, 1), *state) -> logits (b, 1, v), *new state."""

    def __init__(self, model: RwkvLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, *state):
        logits, new_state = self.model.step(input_ids, _layers(state))
        return (logits[:, None], *_flat(new_state))


def wrapper(model: RwkvLM, graph: str, scan=wkv7_ref) -> nn.Module:
    """The module each graph is traced from (validate compares with it, with the reference)."""
    return PrefillGraph(model, scan) if graph == "prefill" else StepGraph(model)


def example_inputs(spec: GraphSpec, dtype: torch.dtype, length: int) -> tuple:
    """Inputs for tracing; sizes >= 2 and different from each other so no dim is specialised."""
    arrays = random_inputs(spec, dict(batch=2, seq_len=length), np.random.default_rng(0), state_scale=0.1)
    # the WKV state stays float32 whatever the model dtype (DESIGN §4)
    return tuple(torch.from_numpy(arrays[t.name]).to(dtype) if t.role == "state" and t.dtype != "float32"
                 else torch.from_numpy(arrays[t.name]) for t in spec.inputs)


def export_rwkv(ckpt, preset: str | None, out, *, opset: int = DEFAULT_OPSET, dtype: str = "float32",
                overwrite: bool = False, tokenizer: dict | None = None):
    """Write prefill.onnx, step.onnx and manifest.json for a loaded RWKV-7 checkpoint."""
    specs = specs_for(ckpt.config, dtype)
    model = model_in_dtype(ckpt.model, dtype)
    tdtype = next(model.parameters()).dtype
    prefill_args = example_inputs(specs["prefill"], tdtype, 19)
    step_args = example_inputs(specs["step"], tdtype, 1)

    def build(tmp):
        with torch.no_grad():
            export_graphs([
                GraphJob("prefill (WKV: chunked Scan)", wrapper(model, "prefill", wkv7_chunked), prefill_args,
                         specs["prefill"], tmp / "prefill.onnx", opset,
                         dynamic_shapes_for(specs["prefill"], varargs_from=2), wkv_translation_table()),
                # traced from the batch-friendly formulation (step_graph), not the eager step
                GraphJob("step", FastStepGraph(model), step_args, specs["step"], tmp / "step.onnx", opset,
                         dynamic_shapes_for(specs["step"], varargs_from=1)),
            ])

    return write_artifact(out, overwrite, ckpt, preset, specs, build, opset=opset, dtype=dtype,
                          options={}, tokenizer=tokenizer)


export = export_rwkv
