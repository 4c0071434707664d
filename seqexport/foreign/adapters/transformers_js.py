"""Hand-built stateful graphs with transformers.js' recurrent state names: past_conv.{i} ->
present_conv.{i} (the causal conv's window, [b, channels, w], w = k or k - 1) and past_ssm.{i} ->
present_ssm.{i} (the SSM state, [b, d_inner, d_state] for Mamba; for Mamba-2 [b, heads,
head_dim, d_state]), both replaced whole each call; attention layers of a hybrid as
past_key_values.{i}.key|value -> present.{i}.key|value. One graph, model.onnx (or the only .onnx
of the folder, or onnx/model.onnx), taking input_ids and optionally attention_mask /
position_ids; logits out.
"""

import re
from pathlib import Path

from seqexport.foreign import onnx_io
from seqexport.foreign.adapter import GraphMap, ModelMap, StateRole
from seqexport.foreign.adapters.optimum import PAST

RECURRENT = re.compile(r"past_(conv|ssm)\.(\d+)$")


def graph_file(folder: Path) -> str | None:
    for name in ("model.onnx", "onnx/model.onnx"):
        if (folder / name).is_file():
            return name
    found = sorted(p.name for p in folder.glob("*.onnx"))
    return found[0] if len(found) == 1 else None


class TransformersJs:
    name = "transformers_js"

    def detect(self, folder: Path) -> bool:
        file = graph_file(Path(folder))
        return file is not None and any(RECURRENT.match(n) for n in onnx_io.read(Path(folder) / file).inputs)

    def map(self, folder: Path) -> ModelMap:
        file = graph_file(Path(folder))
        io = onnx_io.read(Path(folder) / file)
        roles = []
        for name in io.inputs:
            m, kv = RECURRENT.match(name), PAST.match(name)
            if m:
                part, layer = m[1], int(m[2])
                # the conv window may keep k - 1 positions: compared on the positions it keeps
                roles.append(StateRole(layer, part, name, f"present_{part}.{layer}", "replaced",
                                       "conv_window" if part == "conv" else ""))
            elif kv:
                roles.append(StateRole(int(kv[1]), kv[3], name, name.replace("past_key_values.", "present.", 1),
                                       "appended"))
        inputs = {r: r for r in ("input_ids", "attention_mask", "position_ids") if r in io.inputs}
        return ModelMap(self.name, "decoder", GraphMap(file, inputs, {"logits": "logits"}, tuple(roles)))
