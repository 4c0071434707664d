"""onnxruntime-genai model folders (its model builder: `python -m onnxruntime_genai.models.builder`).

`genai_config.json` names everything: `model.decoder.filename` (model.onnx), its inputs
(`input_ids`, `attention_mask` [b, past + n], optionally `position_ids`) and outputs (`logits`),
and the KV cache as templates, `past_key_names` / `past_value_names` ("past_key_values.%d.key")
-> `present_key_names` / `present_value_names` ("present.%d.key"), one per layer of
`num_hidden_layers`, each [b, kv_heads, past, head_size] (transformers' layout). The graph
declares the head size as a symbolic axis (`kv_cache_dim`): a fresh past gets `head_size` there.

genai runs the graph with `search.past_present_share_buffer` true: one buffer of max_length
slots that past and present share, the valid length read from the attention mask. We feed a
growing past instead (present = past + new positions), which the same GroupQueryAttention
kernel takes. That kernel on CPU takes several tokens after a past for one row only ("batch_size
must be 1 when sequence_length > 1 and past context is given"): such calls run row by row.
"""

import json
from pathlib import Path

from seqexport.errors import ArtifactError
from seqexport.foreign import onnx_io
from seqexport.foreign.adapter import GraphMap, ModelMap, StateRole

CONFIG = "genai_config.json"
TEMPLATES = (("key", "past_key_names", "present_key_names"), ("value", "past_value_names", "present_value_names"))


def read_config(folder: Path) -> dict:
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: not readable JSON ({e})") from None
    decoder = config.get("model", {}).get("decoder") if isinstance(config.get("model"), dict) else None
    if not isinstance(decoder, dict):
        raise ArtifactError(f"{path}: no model.decoder section; expected onnxruntime-genai's genai_config.json")
    for key, kind in (("filename", str), ("inputs", dict), ("outputs", dict), ("num_hidden_layers", int)):
        if not isinstance(decoder.get(key), kind):
            raise ArtifactError(f"{path}: model.decoder.{key} is {decoder.get(key)!r}; expected a {kind.__name__}")
    return config


def layer_name(template: str, layer: int, path: Path, key: str) -> str:
    if template.count("%d") != 1:
        raise ArtifactError(f"{path}: {key} {template!r}; expected a name with one %d for the layer")
    return template.replace("%d", str(layer))


class Genai:
    name = "genai"

    def detect(self, folder: Path) -> bool:
        return (Path(folder) / CONFIG).is_file()

    def map(self, folder: Path) -> ModelMap:
        folder = Path(folder)
        config = read_config(folder)
        decoder, path = config["model"]["decoder"], folder / CONFIG
        ins, outs = decoder["inputs"], decoder["outputs"]
        io = onnx_io.read(folder / decoder["filename"])
        roles, dims = [], {}
        for layer in range(decoder["num_hidden_layers"]):
            for part, past_key, present_key in TEMPLATES:
                if past_key not in ins or present_key not in outs:
                    raise ArtifactError(f"{path}: model.decoder names no {past_key!r} input or {present_key!r} "
                                        "output; expected the KV cache's name templates")
                past = layer_name(ins[past_key], layer, path, past_key)
                roles.append(StateRole(layer, part, past, layer_name(outs[present_key], layer, path, present_key),
                                       "appended"))
                tensor = io.inputs.get(past)
                if tensor is not None and len(tensor.dims) == 4:  # [b, kv_heads, past, head_size]
                    for axis, key in ((1, "num_key_value_heads"), (3, "head_size")):
                        if isinstance(tensor.dims[axis], str) and key in decoder:
                            dims[tensor.dims[axis]] = int(decoder[key])
        inputs = {role: ins[role] for role in ("input_ids", "attention_mask", "position_ids") if role in ins}
        if "logits" not in outs:
            raise ArtifactError(f"{path}: model.decoder.outputs names no 'logits'")
        share = config.get("search", {}).get("past_present_share_buffer")
        step = GraphMap(decoder["filename"], inputs, {"logits": outs["logits"]}, tuple(roles), dims=dims,
                        chunk_rows=1 if "GroupQueryAttention" in io.ops else None)
        note = (f"model type {config['model'].get('type', '?')}; past_present_share_buffer {share} in genai, "
                "a growing past here (present = past + new positions)")
        return ModelMap(self.name, "decoder", step, note=note)
