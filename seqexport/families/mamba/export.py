"""Mamba -> prefill.onnx (one of three scan lowerings) + step.onnx, with explicit state.

Both graphs take and return every layer's (conv_state, ssm_state); zeros start a
fresh sequence. The step graph is the model's one-token `step`: no loop in it.
"""

import torch
from torch import nn

from seqexport.errors import UsageError
from seqexport.export import DEFAULT_OPSET
from seqexport.export.common import (
    dynamic_shapes_for,
    export_graph,
    model_in_dtype,
    step,
    torch_dtype,
    write_artifact,
)
from seqexport.export.scan import LOWERINGS, custom_translation_table, scan_for
from seqexport.models.mamba import MambaLM, selective_scan_ref
from seqexport.specs import GraphSpec, mamba_specs


def specs_for(config, dtype: str = "float32", prefill_len: int | None = None) -> dict[str, GraphSpec]:
    return mamba_specs(config.n_layer, config.d_inner, config.d_conv, config.d_state, config.vocab_size,
                       dtype, prefill_len)


def _pairs(flat):
    """[conv0, ssm0, conv1, ssm1, ...] -> [(conv0, ssm0), (conv1, ssm1), ...]"""
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]


def _flat(state):
    return tuple(t for pair in state for t in pair)


class PrefillGraph(nn.Module):
    """(input_ids (b, l), *state) -> logits (b, l, v), *new state; the scan is a lowering."""

    def __init__(self, model: MambaLM, scan=selective_scan_ref):
        super().__init__()
        self.model = model
        self.scan = scan

    def forward(self, input_ids, *state):
        logits, new_state = self.model(input_ids, _pairs(state), scan=self.scan)
        return (logits, *_flat(new_state))


class StepGraph(nn.Module):
    """(input_ids (b, 1), *state) -> logits (b, 1, v), *new state."""

    def __init__(self, model: MambaLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, *state):
        logits, new_state = self.model.step(input_ids, _pairs(state))
        return (logits[:, None], *_flat(new_state))


def example_inputs(config, dtype: torch.dtype, batch: int, length: int):
    ids = torch.randint(0, config.vocab_size, (batch, length))
    state = []
    for _ in range(config.n_layer):
        state += [torch.randn(batch, config.d_inner, config.d_conv, dtype=dtype),
                  torch.randn(batch, config.d_inner, config.d_state, dtype=torch.float32)]
    return (ids, *state)


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
    tdtype = torch_dtype(dtype)
    # Sizes >= 2 and different from each other so that no dim is specialised.
    prefill_args = example_inputs(ckpt.config, tdtype, batch=2, length=seq_len or 19)
    step_args = example_inputs(ckpt.config, tdtype, batch=2, length=1)

    def build(tmp):
        with torch.no_grad():
            with step(f"exporting prefill (scan: {scan})"):
                export_graph(PrefillGraph(model, scan_for(scan)), prefill_args, specs["prefill"], tmp / "prefill.onnx",
                             opset, dynamic_shapes_for(specs["prefill"], varargs_from=1),
                             custom_translation_table(scan))
            with step("exporting step"):
                export_graph(StepGraph(model), step_args, specs["step"], tmp / "step.onnx", opset,
                             dynamic_shapes_for(specs["step"], varargs_from=1))

    return write_artifact(out, overwrite, ckpt, preset, specs, build, opset=opset, dtype=dtype,
                          options={"scan": scan, "seq_len": seq_len}, tokenizer=tokenizer)
