"""Transformer -> encoder.onnx + decoder.onnx with an explicit KV cache.

The encoder graph also emits every decoder layer's cross-attention K/V, computed once per
source. The decoder graph is the model's `decode_step_cached` (traced from its export-side
formulation in decoder_graph; validate compares it with DecoderGraph): it serves the first step and
every later one, over a preallocated cache of which each row's first past_lengths[r] slots are
valid; row r's positions start at past_lengths[r]. The wrappers only flatten the model's
cache lists into graph inputs and outputs, in spec order.
"""

import numpy as np
import torch
from torch import nn

from seqexport.export import DEFAULT_OPSET
from seqexport.export.common import (
    dynamic_shapes_for,
    model_in_dtype,
    write_artifact,
)
from seqexport.export.parallel import GraphJob, export_graphs
from seqexport.families.attention import check_attention
from seqexport.families.transformer.decoder_graph import FastDecoderGraph, FusedDecoderGraph
from seqexport.families.transformer.specs import graph_specs
from seqexport.models.transformer import Transformer
from seqexport.parity.inputs import random_inputs
from seqexport.specs import GraphSpec


def specs_for(config, dtype: str = "float32") -> dict[str, GraphSpec]:
    return graph_specs(config.to_dict(), dtype)


class EncoderGraph(nn.Module):
    """(input_ids, attention_mask) -> encoder_hidden_states, cross K/V of every decoder layer."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        memory = self.model.encoder(input_ids, attention_mask[:, None, None, :])  # (b, s, d)
        return (memory, *(t for kv in self.model.cross_kv(memory) for t in kv))


class DecoderGraph(nn.Module):
    """(input_ids, encoder_attention_mask, past_lengths, *past K/V) -> logits, the new
    positions' self-attention K/V (the runtime writes them into the cache buffer).

    `past` is flat, in spec order: cross K/V of layers 0..n-1, then the self K/V buffers of 0..n-1.
    """

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, past_lengths, *past):
        n = len(self.model.decoder.layers)
        cross = [(past[2 * i], past[2 * i + 1]) for i in range(n)]
        cache = [(past[2 * n + 2 * i], past[2 * n + 2 * i + 1]) for i in range(n)]
        logits, new = self.model.decode_step_cached(input_ids, encoder_attention_mask, cross, cache, past_lengths)
        return (logits, *(t for kv in new for t in kv))


class ConcatDecoderGraph(nn.Module):
    """The decoder of artifacts exported before `past_lengths`: (input_ids,
    encoder_attention_mask, *past K/V) -> logits, the whole present K/V (past + new,
    concatenated). Kept so that `validate` can still check such an artifact."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, *past):
        n = len(self.model.decoder.layers)
        cross = [(past[2 * i], past[2 * i + 1]) for i in range(n)]
        cache = [(past[2 * n + 2 * i], past[2 * n + 2 * i + 1]) for i in range(n)]
        logits, cache = self.model.decode_step(input_ids, encoder_attention_mask, cross, cache)
        return (logits, *(t for kv in cache for t in kv))


def wrapper(model: Transformer, graph: str, appended: bool = True) -> nn.Module:
    """The module each graph is traced from: validate compares with it and localises in it.
    appended=False: the decoder of an artifact that concatenates its cache."""
    decoder = DecoderGraph if appended else ConcatDecoderGraph
    return {"encoder": EncoderGraph, "decoder": decoder}[graph](model)


def exported_module(model: Transformer, graph: str, attention: str = "matmul") -> nn.Module:
    """The module each graph's ONNX is traced from: the encoder's eager wrapper, and the
    decoder's batch-friendly formulation (decoder_graph) of what `wrapper` computes, its
    attention as MatMuls or, `fused`, as ONNX's `Attention` operator."""
    if graph != "decoder":
        return wrapper(model, graph)
    return FusedDecoderGraph(model) if attention == "fused" else FastDecoderGraph(model)


def example_inputs(specs: dict[str, GraphSpec], dtype: torch.dtype) -> dict[str, tuple]:
    """Inputs for tracing; sizes >= 2 and all different so no dim is specialised."""
    sizes = dict(batch=2, src_len=5, tgt_len=3, past_len=4)
    rng = np.random.default_rng(0)
    out = {}
    for name, spec in specs.items():
        arrays = random_inputs(spec, sizes, rng, pad_rows=False)
        out[name] = tuple(torch.from_numpy(arrays[t.name]).to(dtype if t.role == "state" else torch.int64)
                          for t in spec.inputs)
    return out


def export_transformer(ckpt, preset: str | None, out, *, opset: int = DEFAULT_OPSET, dtype: str = "float32",
                       overwrite: bool = False, tokenizer: dict | None = None, attention: str = "matmul"):
    """Write encoder.onnx, decoder.onnx and manifest.json for a loaded checkpoint.
    attention: the decoder's, "matmul" (MatMul + Softmax nodes) or "fused" (ONNX's `Attention`,
    opset 23 or later: a lower opset is raised to 23)."""
    opset = check_attention(attention, opset)
    specs = specs_for(ckpt.config, dtype)
    model = model_in_dtype(ckpt.model, dtype)
    args = example_inputs(specs, next(model.parameters()).dtype)

    def build(tmp):
        with torch.no_grad():
            export_graphs([GraphJob(graph, exported_module(model, graph, attention), args[graph], specs[graph],
                                    tmp / f"{graph}.onnx",
                                    opset, dynamic_shapes_for(specs[graph], varargs_from=varargs_from))
                           for graph, varargs_from in (("encoder", None), ("decoder", 3))])

    return write_artifact(out, overwrite, ckpt, preset, specs, build, opset=opset, dtype=dtype,
                          options={"attention": attention}, tokenizer=tokenizer)


export = export_transformer
