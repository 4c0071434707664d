"""Hand-built stateful graphs with transformers.js' recurrent state names: past_conv.{i} ->
present_conv.{i} (the causal conv's window, [b, channels, w], w = k or k - 1) and past_ssm.{i} ->
present_ssm.{i} (the SSM state, [b, d_inner, d_state] for Mamba; for Mamba-2 [b, heads,
head_dim, d_state]), both replaced whole each call; attention layers of a hybrid as
past_key_values.{i}.key|value -> present.{i}.key|value. One graph, model.onnx (or the only .onnx
of the folder, or onnx/model.onnx), taking input_ids and optionally attention_mask /
position_ids; logits out. Whether the SSM state is transposed is read from the folder's
config.json (its state size on the second-last axis); without one it is taken as transformers'.
"""

import json
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


def d_state(folder: Path) -> int | None:
    """The SSM state size the folder's config.json declares (transformers.js folders carry one)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in ("state_size", "ssm_state_size", "mamba_d_state", "d_state"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def ssm_layout(tensor: onnx_io.Tensor, n: int | None) -> str:
    """transformers keeps the SSM state [..., d_inner or head_dim, d_state]; a graph whose last
    two axes are [d_state, other] keeps it transposed."""
    dims = tensor.dims
    return "ssm_transposed" if n is not None and len(dims) >= 3 and dims[-2] == n and dims[-1] != n else ""


class TransformersJs:
    name = "transformers_js"

    def detect(self, folder: Path) -> bool:
        file = graph_file(Path(folder))
        return file is not None and any(RECURRENT.match(n) for n in onnx_io.read(Path(folder) / file).inputs)

    def map(self, folder: Path) -> ModelMap:
        file = graph_file(Path(folder))
        io = onnx_io.read(Path(folder) / file)
        roles, n = [], d_state(Path(folder))
        for name in io.inputs:
            m, kv = RECURRENT.match(name), PAST.match(name)
            if m:
                part, layer = m[1], int(m[2])
                # the conv window may keep k - 1 positions: compared on the positions it keeps
                layout = "conv_window" if part == "conv" else ssm_layout(io.inputs[name], n)
                roles.append(StateRole(layer, part, name, f"present_{part}.{layer}", "replaced", layout))
            elif kv:
                roles.append(StateRole(int(kv[1]), kv[3], name, name.replace("past_key_values.", "present.", 1),
                                       "appended"))
        inputs = {r: r for r in ("input_ids", "attention_mask", "position_ids") if r in io.inputs}
        return ModelMap(self.name, "decoder", GraphMap(file, inputs, {"logits": "logits"}, tuple(roles)))
