"""`seqexport quantize`: an int8 copy of an exported folder, with ONNX Runtime's own dynamic
quantisation (`onnxruntime.quantization.quantize_dynamic`), not hand-written kernels.

Weights of MatMul/Gemm become int8 (per tensor, or per output channel with `per_channel`);
activations are quantised on the fly. What stays float32: everything that is not a weight
MatMul — norms, softmax, embeddings (Gather), the Mamba scan and its state (inside the Scan
body, which is left alone) — plus, by default, the output head and what the family marks as
numerically sensitive (Mamba: x_proj and dt_proj, which make Δ, B and C). The runtime needs
no change: graph I/O names and dtypes are those of the source. The manifest records the
quantisation (mode, what stayed float, source folder and its manifest's sha256).
"""

import fnmatch
import logging
import time
from pathlib import Path

import onnx

from seqexport import families
from seqexport.errors import UsageError
from seqexport.export.atomic import atomic_folder
from seqexport.manifest import (
    MANIFEST,
    graph_entry,
    graph_specs,
    read_manifest,
    sha256_file,
    write_manifest,
)
from seqexport.parity.localize import SCOPES_KEY
from seqexport.specs import LOGITS

MODES = ("dynamic",)
WEIGHT_OPS = ("MatMul", "Gemm")


def _scopes(node: onnx.NodeProto) -> list[str]:
    raw = next((p.value for p in node.metadata_props if p.key == SCOPES_KEY), "")
    return [s.removeprefix("model.") for s in raw.strip("[]").replace("'", "").split(", ") if s]


def weight_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Top-level MatMul/Gemm nodes with a weight (an initializer) operand: what int8 changes."""
    weights = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type in WEIGHT_OPS and any(x in weights for x in n.input)]


def head_nodes(model: onnx.ModelProto) -> set[str]:
    """The weight MatMul that makes the logits: walk back from the `logits` output."""
    producer = {o: n for n in model.graph.node for o in n.output}
    weights = {n.name for n in weight_nodes(model)}
    frontier, seen = [LOGITS], set()
    while frontier:
        node = producer.get(frontier.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.name in weights:
            return {node.name}
        frontier += list(node.input)
    return set()


def _labels(node: onnx.NodeProto, weights: set[str], bias_of: dict[str, str]) -> list[str]:
    """What a pattern may match: the node name, the eager module scopes it came from, and the
    module path of its weight or of the bias added to its output (F.linear calls, e.g. Mamba's
    dt_proj, have no scope of their own, and a folded transpose renames the weight)."""
    params = [w for w in node.input if w in weights] + [bias_of[o] for o in node.output if o in bias_of]
    paths = [p.removeprefix("model.").removesuffix(".weight").removesuffix(".bias") for p in params]
    return [node.name, *_scopes(node), *paths]


def _bias_of(model: onnx.ModelProto) -> dict[str, str]:
    """value -> the initializer an Add node adds to it (a Linear's bias after its MatMul)."""
    weights = {i.name for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "Add" and len(n.input) == 2:
            a, b = n.input
            if b in weights:
                out[a] = b
            elif a in weights:
                out[b] = a
    return out


def _matches(node: onnx.NodeProto, pattern: str, weights: set[str], bias_of: dict[str, str]) -> bool:
    return any(fnmatch.fnmatchcase(label, pattern) for label in _labels(node, weights, bias_of))


def quantize(folder, out, *, mode: str = "dynamic", per_channel: bool = False, exclude=(),
             include_head: bool = False, overwrite: bool = False, log=None) -> Path:
    """Write an int8 copy of the exported `folder` to `out` (atomically)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    log = log or (lambda msg: None)
    folder, out = Path(folder), Path(out)
    if mode not in MODES:
        raise UsageError(f"unknown quantisation mode {mode!r}; expected one of {list(MODES)}")
    manifest = read_manifest(folder)
    if manifest.get("quantization"):
        q = manifest["quantization"]
        raise UsageError(f"{folder} is already quantised ({q.get('mode')} int8 of {q.get('source', {}).get('folder')}); "
                         "quantise its float32 source instead")
    if manifest["dtype"] != "float32":
        raise UsageError(f"{folder} is a {manifest['dtype']} export; int8 is made from a float32 export")
    family = families.get(manifest["family"])
    models = {name: onnx.load(str(folder / g["file"])) for name, g in manifest["graphs"].items()}
    keep: dict[str, set[str]] = {}
    matched = dict.fromkeys(exclude, 0)
    for name, model in models.items():
        keep[name] = set() if include_head else head_nodes(model)
        weights, bias_of = {i.name for i in model.graph.initializer}, _bias_of(model)
        for node in weight_nodes(model):
            for pattern in (*exclude, *family.int8_keep_float):
                if _matches(node, pattern, weights, bias_of):
                    keep[name].add(node.name)
                    if pattern in matched:
                        matched[pattern] += 1
    unmatched = [p for p, n in matched.items() if n == 0]
    if unmatched:
        raise UsageError(f"--exclude {unmatched[0]!r} matches no weight MatMul/Gemm (patterns are globs over "
                         "eager module paths such as 'decoder.layers.0.*' or ONNX node names)")
    started = time.perf_counter()
    with atomic_folder(out, overwrite) as tmp:
        graphs = {}
        for name, g in manifest["graphs"].items():
            root = logging.getLogger()
            level, root.level = root.level, logging.ERROR  # ORT's advice to pre-process, on every call
            try:
                quantize_dynamic(folder / g["file"], tmp / g["file"], per_channel=per_channel,
                                 weight_type=QuantType.QInt8, op_types_to_quantize=list(WEIGHT_OPS),
                                 nodes_to_exclude=sorted(keep[name]), extra_options={"MatMulConstBOnly": True})
            finally:
                root.level = level
            graphs[name] = graph_entry(tmp, graph_specs(manifest)[name], g["file"])
            total = len(weight_nodes(models[name]))
            log(f"  {name}: {total - len(keep[name])}/{total} weight MatMul/Gemm int8, {g['bytes'] / 1e6:.1f} MB -> "
                f"{graphs[name]['bytes'] / 1e6:.1f} MB")
        if manifest.get("tokenizer", {}) and "file" in manifest["tokenizer"]:
            (tmp / manifest["tokenizer"]["file"]).write_bytes((folder / manifest["tokenizer"]["file"]).read_bytes())
        source = dict(manifest.get("source") or {})
        if source.get("checkpoint") and not Path(source["checkpoint"]).is_absolute():
            source["checkpoint"] = str((folder / source["checkpoint"]).resolve())  # validate's eager model
        # the int8 graphs hold their weights inline: no shared weights file
        new = {k: v for k, v in manifest.items() if k not in ("format", "format_version", "parity", "weights")}
        new |= {"graphs": graphs, "source": source, "quantization": {
            "mode": mode, "weights": "int8", "per_channel": per_channel, "include_head": include_head,
            "excluded_patterns": list(exclude), "kept_float": {k: sorted(v) for k, v in keep.items()},
            "source": {"folder": str(folder.resolve()), "manifest_sha256": sha256_file(folder / MANIFEST)},
            "seconds": round(time.perf_counter() - started, 2)}}
        write_manifest(tmp, new)
    log(f"quantised {folder} -> {out} ({mode}, int8 weights{', per channel' if per_channel else ''})")
    return out
