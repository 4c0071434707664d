"""Graphs built by onnxruntime's mobius (`mobius build --model DIR OUT`, PyPI mobius-onnx):
model.onnx + model.onnx.data, one graph for prefill and step (no logits_to_keep), opset 24 +
com.microsoft (CausalConvWithState, LinearAttention, SkipSimplifiedLayerNormalization).

State, per layer i, fed back from present.{i}.<part>:
- Mamba-2: past_states.{i}.conv_state [b, conv_dim, k - 1] (the last k - 1 conv inputs;
  transformers keeps k) and past_states.{i}.ssm_state [b, heads, d_state, head_dim] (transposed
  against transformers' [b, heads, head_dim, d_state]), replaced whole each call;
- hybrids (Bamba, NemotronH, ...): past_key_values.{i}.conv_state|ssm_state for Mamba-2 layers as
  above, past_key_values.{i}.key|value [b, kv_heads, past, head_dim] for attention layers
  (the present returning past + new positions); inputs attention_mask [b, past + n] and, for
  models with positions, position_ids [b, n].
"""

import re
from pathlib import Path

from seqexport.errors import ArtifactError
from seqexport.foreign import onnx_io
from seqexport.foreign.adapter import GraphMap, ModelMap, StateRole

FILE = "model.onnx"
STATE = re.compile(r"(past_states|past_key_values)\.(\d+)\.(conv_state|ssm_state|key|value)$")
# mobius' part -> (our part, kind, layout against transformers' cache)
PARTS = {"conv_state": ("conv", "replaced", "conv_window"), "ssm_state": ("ssm", "replaced", "ssm_transposed"),
         "key": ("key", "appended", ""), "value": ("value", "appended", "")}


class Mobius:
    name = "mobius"

    def detect(self, folder: Path) -> bool:
        path = Path(folder) / FILE
        if not path.is_file():
            return False
        names = [STATE.match(n) for n in onnx_io.read(path).inputs]
        return any(m and m[3] in ("conv_state", "ssm_state") for m in names)

    def map(self, folder: Path) -> ModelMap:
        io = onnx_io.read(Path(folder) / FILE)
        roles = []
        for name in io.inputs:
            m = STATE.match(name)
            if not m:
                continue
            layer, (part, kind, layout) = int(m[2]), PARTS[m[3]]
            present = f"present.{layer}.{m[3]}"
            if present not in io.outputs:
                raise ArtifactError(f"{folder}/{FILE}: state input {name!r} has no output {present!r} to feed it; "
                                    f"the outputs are {list(io.outputs)}")
            roles.append(StateRole(layer, part, name, present, kind, layout))
        inputs = {role: role for role in ("input_ids", "attention_mask", "position_ids") if role in io.inputs}
        kinds = sorted({r.part for r in roles})
        note = f"one graph for prefill and step; state parts {', '.join(kinds)}"
        return ModelMap(self.name, "decoder", GraphMap(FILE, inputs, {"logits": "logits"}, tuple(roles)), note=note)
