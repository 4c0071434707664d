"""--io-map FILE: an explicit map for a folder no adapter recognises, as JSON:

    {"architecture": "decoder",                      # or "encoder-decoder" (then "encoder" too)
     "step": {"file": "model.onnx",
              "inputs": {"input_ids": "tokens"},     # role -> graph input (adapter.INPUT_ROLES)
              "outputs": {"logits": "scores"},       # role -> graph output (adapter.OUTPUT_ROLES)
              "max_tokens": null,                    # tokens a call takes (null: any)
              "dims": {},                            # symbolic axis -> size of a fresh past (else 0)
              "chunk_rows": null,                    # rows a multi-token call after a past takes
              "state": [{"layer": 0, "part": "ssm", "input": "state0_in", "output": "state0_out",
                         "kind": "replaced", "layout": ""}]},
     "first": {...}, "encoder": {...}}               # optional graphs, the same shape

Anything malformed (not JSON, a missing or unknown key, a role, kind or layout not known, a name
the graph does not have, a state output that cannot feed its input) is one UsageError naming it.
"""

import json
from pathlib import Path

from seqexport.errors import ArtifactError, UsageError
from seqexport.foreign.adapter import GraphMap, ModelMap, StateRole, check_names

GRAPH_KEYS = {"file", "inputs", "outputs", "state", "max_tokens", "dims", "chunk_rows"}
STATE_KEYS = {"layer", "part", "input", "output", "kind", "layout", "past_axis"}


def _state(s, where: str) -> StateRole:
    if not isinstance(s, dict) or not {"layer", "part", "input", "output", "kind"} <= set(s) or set(s) - STATE_KEYS:
        raise UsageError(f"{where}: expected an object with layer, part, input, output, kind "
                         f"(and optionally layout, past_axis), got {s!r}")
    if not isinstance(s["layer"], int):
        raise UsageError(f"{where}.layer: expected an integer, got {s['layer']!r}")
    return StateRole(**s)


def _graph(d, where: str) -> GraphMap:
    if not isinstance(d, dict) or "file" not in d:
        raise UsageError(f"{where}: expected an object with at least \"file\", got {d!r}")
    unknown = set(d) - GRAPH_KEYS
    if unknown:
        raise UsageError(f"{where}: unknown keys {sorted(unknown)}; expected some of {sorted(GRAPH_KEYS)}")
    for key in ("inputs", "outputs"):
        if not isinstance(d.get(key, {}), dict):
            raise UsageError(f"{where}.{key}: expected an object of role -> name, got {d[key]!r}")
    states = [_state(s, f"{where}.state[{i}]") for i, s in enumerate(d.get("state", []))]
    max_tokens = d.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise UsageError(f"{where}.max_tokens: expected a positive integer or null, got {max_tokens!r}")
    if not isinstance(d.get("dims", {}), dict) or not all(isinstance(v, int) for v in d.get("dims", {}).values()):
        raise UsageError(f"{where}.dims: expected an object of symbolic axis -> size, got {d['dims']!r}")
    chunk_rows = d.get("chunk_rows")
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise UsageError(f"{where}.chunk_rows: expected a positive integer or null, got {chunk_rows!r}")
    return GraphMap(d["file"], d.get("inputs", {}), d.get("outputs", {}), tuple(states), max_tokens,
                    d.get("dims", {}), chunk_rows)


def read_io_map(folder: Path, path) -> ModelMap:
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"--io-map {path}: cannot read it: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"--io-map {path}: not JSON: {e}") from None
    if not isinstance(d, dict) or "step" not in d:
        raise UsageError(f"--io-map {path}: expected an object with \"step\" (and \"architecture\")")
    unknown = set(d) - {"architecture", "step", "first", "encoder", "note"}
    if unknown:
        raise UsageError(f"--io-map {path}: unknown keys {sorted(unknown)}")
    try:
        graphs = {k: _graph(d[k], f"--io-map {path}: {k}") if k in d else None for k in ("step", "first", "encoder")}
        model = ModelMap("io_map", d.get("architecture", "decoder"), graphs["step"], graphs["first"],
                         graphs["encoder"], d.get("note", ""))
        if "logits" not in model.step.outputs or "input_ids" not in model.step.inputs:
            raise UsageError(f"--io-map {path}: step needs inputs.input_ids and outputs.logits")
        for g in model.graphs:
            if not (Path(folder) / g.file).is_file():
                raise UsageError(f"--io-map {path}: graph file {g.file!r} is not in {folder}")
        check_names(folder, model)
    except ArtifactError as e:  # a role, kind or layout the map names wrongly: the map's fault
        raise UsageError(f"--io-map {path}: {e}") from None
    except TypeError as e:
        raise UsageError(f"--io-map {path}: {e}") from None
    return model
