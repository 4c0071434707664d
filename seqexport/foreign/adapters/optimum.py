"""Hugging Face Optimum's ONNX exports (optimum-cli export onnx ... --task *-with-past).

Encoder-decoder: encoder_model.onnx (input_ids, attention_mask -> last_hidden_state), then either
decoder_model_merged.onnx (one graph; `use_cache_branch` false on the first call, true after) or
decoder_model.onnx (first call: no past; returns the cross-attention K/V once) +
decoder_with_past_model.onnx. Decoder-only: model.onnx (or the same decoder files) with
input_ids, attention_mask [b, past + n], position_ids. State: past_key_values.{i}[.decoder].key|
value -> present.{i}[.decoder].key|value, [b, kv_heads, past + n, head_dim] (appended, returned
whole); past_key_values.{i}.encoder.key|value (static). The merged graph is chosen when present:
it is what Optimum's ORTModel classes load by default.
"""

import re
from dataclasses import replace
from pathlib import Path

from seqexport.foreign import onnx_io
from seqexport.foreign.adapter import GraphMap, ModelMap, StateRole

PAST = re.compile(r"past_key_values\.(\d+)\.(?:(decoder|encoder)\.)?(key|value)$")
DECODERS = ("decoder_model_merged.onnx", "decoder_model.onnx", "model.onnx")


def state_roles(io: onnx_io.GraphIO) -> tuple[StateRole, ...]:
    roles = []
    for name in io.inputs:
        m = PAST.match(name)
        if not m:
            continue
        layer, which, kv = int(m[1]), m[2], m[3]
        present = name.replace("past_key_values.", "present.", 1)
        if which == "encoder":
            roles.append(StateRole(layer, f"cross_{kv}", name, present, "static"))
        else:
            roles.append(StateRole(layer, kv, name, present, "appended"))
    return tuple(roles)


def graph_map(folder: Path, file: str, encoder: bool = False) -> GraphMap:
    io = onnx_io.read(folder / file)
    if encoder:
        return GraphMap(file, {r: r for r in ("input_ids", "attention_mask") if r in io.inputs},
                        {"encoder_hidden_states": "last_hidden_state"})
    inputs = {r: r for r in ("input_ids", "attention_mask", "position_ids", "encoder_attention_mask",
                             "encoder_hidden_states", "use_cache_branch") if r in io.inputs}
    logits = io.outputs.get("logits")
    # decoder_with_past declares logits [batch_size, "1", vocab]: one token a call
    one = logits is not None and len(logits.dims) > 1 and str(logits.dims[1]) == "1"
    return GraphMap(file, inputs, {"logits": "logits"}, state_roles(io), 1 if one else None)


class Optimum:
    name = "optimum"

    def detect(self, folder: Path) -> bool:
        folder = Path(folder)
        if (folder / "genai_config.json").exists() or not (folder / "config.json").is_file():
            return False  # onnxruntime-genai's model.onnx has the same past_key_values names
        if (folder / "decoder_model_merged.onnx").is_file() or (folder / "decoder_with_past_model.onnx").is_file():
            return True
        model = folder / "model.onnx"
        return model.is_file() and any(PAST.match(n) for n in onnx_io.read(model).inputs)

    def map(self, folder: Path) -> ModelMap:
        folder = Path(folder)
        encoder = graph_map(folder, "encoder_model.onnx", encoder=True) \
            if (folder / "encoder_model.onnx").is_file() else None
        architecture = "encoder-decoder" if encoder else "decoder"
        if (folder / "decoder_model_merged.onnx").is_file():
            first = graph_map(folder, "decoder_model_merged.onnx")
            # Its with-past branch is the seq2seq decoder_with_past graph, traced for one token
            # (that graph declares logits [batch, "1", vocab]; the merged one does not say, and
            # two tokens fail in its cross-attention MatMul).
            step = replace(first, max_tokens=1) if encoder else first
            return ModelMap(self.name, architecture, step, first=first, encoder=encoder,
                            note="merged decoder: use_cache_branch false on the first call, true after")
        if (folder / "decoder_with_past_model.onnx").is_file():
            first = graph_map(folder, "decoder_model.onnx")
            step = graph_map(folder, "decoder_with_past_model.onnx")
            return ModelMap(self.name, architecture, step, first=first, encoder=encoder,
                            note="decoder_model.onnx for the first call, decoder_with_past_model.onnx after")
        return ModelMap(self.name, architecture, graph_map(folder, "model.onnx"), encoder=encoder)
