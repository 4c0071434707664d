"""`seqexport quantize`: an int8 or int4 copy of an exported folder, made by ONNX Runtime's own
quantisation tools (`onnxruntime.quantization`), not hand-written kernels.

--bits 4: weight-only int4, block-wise (`export.int4`: one MatMulNBits node per weight MatMul),
the output head 8-bit by default (MatMulNBits with bits=8): on the 130m/0.1b presets a float32
head alone is 30-37% of the bytes a step reads, and a 4-bit one cost RWKV-7 0.1b's
teacher-forced top-1 at decisive positions 95-97% against 98-100% at 8 bits. --bits 8 (default), dynamic: weights of MatMuls int8 (per tensor, or per output channel), activations
quantised on the fly (`quantize_dynamic`; ORT fuses each into one DynamicQuantizeMatMul at
load). static: activations too, with ranges calibrated on the float32 model's own decodes
(`quantize_static`, QDQ format). A plain Gemm (a one-token step's linear) is first rewritten
as MatMul + Add: ORT's dynamic quantiser takes MatMul only.

What stays float32: everything that is not a weight MatMul — norms, softmax, embeddings
(Gather), the Mamba/RWKV scans and their state (inside the Scan bodies, which hold no
weights) — plus, by default, the output head and what the family marks as numerically
sensitive (`Family.int8_keep_float`: Mamba's x_proj/dt_proj, which make Δ, B and C; RWKV's
decay LoRA). The runtime needs no change: graph I/O names and dtypes are those of the source
(checked). The graphs' weights go into one shared file again (`export.weights.share_weights`):
a quantised weight both graphs read is stored once. The manifest records the quantisation
(bits, mode, block size and accuracy level for int4, what stayed float, source folder and its
manifest's sha256).
"""

import contextlib
import fnmatch
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from seqexport import families
from seqexport.errors import ExportError, UsageError
from seqexport.export import dense_experts, int4, qmoe
from seqexport.export.atomic import atomic_folder
from seqexport.export.weights import WEIGHTS_FILE, compacted, share_weights
from seqexport.manifest import (
    MANIFEST,
    graph_entry,
    graph_specs,
    read_manifest,
    sha256_file,
    tokenizer_files,
    write_manifest,
)
from seqexport.parity.localize import SCOPES_KEY
from seqexport.specs import LOGITS

MODES = ("dynamic", "static")
BITS = (8, 4)  # the first is the default
WEIGHT_OPS = ("MatMul", "Gemm")
CALIBRATION_PROMPTS = 8  # static mode: random prompts decoded by the float32 model, when none given


def _scopes(node: onnx.NodeProto) -> list[str]:
    raw = next((p.value for p in node.metadata_props if p.key == SCOPES_KEY), "")
    return [s.removeprefix("model.") for s in raw.strip("[]").replace("'", "").split(", ") if s]


def _ones(model: onnx.ModelProto) -> set[str]:
    """Initializers that hold only 1s: the export writes exact broadcasts and sums as MatMuls by
    them (Mamba's step: Δ ⊗ 1), which are arithmetic, not learned weights."""
    return {i.name for i in model.graph.initializer
            if np.prod(i.dims) <= 4096 and np.all(numpy_helper.to_array(i) == 1)}


def structural_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Top-level MatMul/Gemm nodes whose constant operand is all ones: they stay float32 always
    (quantised, Mamba's step took Δ through uint8 before exp(ΔA))."""
    ones = _ones(model)
    return [n for n in model.graph.node if n.op_type in WEIGHT_OPS and any(x in ones for x in n.input)]


def weight_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Top-level MatMul/Gemm nodes with a 2-D weight (an initializer) operand: what int8 changes
    (3-D ones are expert stacks, the experts' own, or weights per head: `dense_experts.batched_weights`)."""
    weights = {i.name for i in model.graph.initializer} - _ones(model) - set(dense_experts.batched_weights(model))
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


def _param_path(name: str) -> str:
    """An initializer named after an eager parameter (see `export.weights`) -> its module path."""
    for suffix in (".T", ".view", ".weight", ".bias"):
        name = name.removesuffix(suffix)
    return name.removeprefix("model.")


def _labels(node: onnx.NodeProto, weights: set[str], bias_of: dict[str, str]) -> list[str]:
    """What a pattern may match: the node name, the eager module scopes it came from, and the
    module path of its weight (initializers carry the eager parameter's name). A weight torch
    named `val_N` (an export from before weights were named) is found by the bias added to
    the MatMul's output instead."""
    params = [w for w in node.input if w in weights]
    if all(w.startswith("val_") for w in params):
        params += [bias_of[o] for o in node.output if o in bias_of]
    return [node.name, *_scopes(node), *(_param_path(p) for p in params)]


def _label(node: onnx.NodeProto, weights: set[str], bias_of: dict[str, str]) -> str:
    """A weight MatMul's name in the manifest: its weight's module path, or where the weight
    kept torch's name (one under `export.weights.MIN_BYTES` stays unnamed in its graph, e.g. a
    (1, d) gate) the innermost eager module it came from (torch's scopes end with the op's own
    name: ['', 'model.layers.0', 'model.layers.0.shared_gate', 'linear_6'])."""
    label = _labels(node, weights, bias_of)[-1]
    modules = _scopes(node)[:-1]
    return modules[-1] if label.startswith("val_") and modules and modules[-1] else label


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


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def gemms_as_matmul(model: onnx.ModelProto) -> int:
    """Rewrite each Gemm on a weight (alpha = beta = 1, A not transposed) as MatMul (+ Add of
    its bias), in place: ORT's dynamic quantiser quantises MatMul, not Gemm, and a one-token
    step's linears are Gemms. The MatMul keeps the Gemm's name. Returns how many."""
    init = {t.name: t for t in model.graph.initializer}
    nodes, count = [], 0
    for node in model.graph.node:
        a = _attrs(node)
        if node.op_type != "Gemm" or node.input[1] not in init or a.get("transA", 0) \
                or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            nodes.append(node)
            continue
        w = node.input[1]
        if a.get("transB", 0):  # (n, k) -> (k, n): MatMul reads the weight as (in, out)
            w = w + ".T" if not w.endswith(".T") else w[:-2]
            if w not in init:
                source = init[node.input[1]]
                if source.data_location == onnx.TensorProto.EXTERNAL:  # a `_structure`: its name and shape
                    init[w] = onnx.TensorProto(name=w, data_type=source.data_type, dims=list(reversed(source.dims)))
                else:
                    init[w] = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(source).T), w)
                model.graph.initializer.append(init[w])
        has_bias = len(node.input) > 2 and node.input[2]
        product = node.output[0] + "_matmul" if has_bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], w], [product], name=node.name))
        nodes[-1].metadata_props.extend(node.metadata_props)
        if has_bias:
            nodes.append(onnx.helper.make_node("Add", [product, node.input[2]], [node.output[0]],
                                               name=node.name + "_bias"))
        count += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def _io(model: onnx.ModelProto) -> list:
    g = model.graph
    return [(v.name, v.type.tensor_type.elem_type) for v in (*g.input, *g.output)]


class _Feeds:
    """A calibration data reader (ORT's `CalibrationDataReader` protocol) over recorded feeds."""

    def __init__(self, feeds: list[dict]):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)

    def rewind(self):  # pragma: no cover - ORT calls it only for some calibrators
        pass


def calibration_feeds(folder: Path, texts: list[str] | None, seed: int = 0) -> dict[str, list[dict]]:
    """Every graph's feeds while the float32 export decodes `texts` (with its tokenizer; default:
    seeded random token ids): the activations static int8 is calibrated on are the model's own."""
    from seqexport.runtime.generate import SearchOptions, generate
    from seqexport.runtime.models import load

    model = load(folder, provider="cpu")
    prompts = None
    if texts:
        if model.tokenizer is None:
            raise UsageError(f"{folder} has no tokenizer to read calibration text with; omit --calibration "
                             "(random token ids are used)")
        prompts = [model.encode(x) for x in texts]
    recorded: dict[str, list[dict]] = {name: [] for name in model.graphs}
    for name, graph in model.graphs.items():
        def run(feeds, _run=graph.run, _name=name):
            recorded[_name].append({k: np.array(v) for k, v in feeds.items()})
            return _run(feeds)
        graph.run = run
    if prompts is None:
        rng = np.random.default_rng(seed)
        prompts = [list(map(int, rng.integers(1, model.vocab_size, 12))) for _ in range(CALIBRATION_PROMPTS)]
    for i in range(0, len(prompts), 4):
        generate(model, prompts[i : i + 4], SearchOptions(max_new_tokens=8))
    return recorded


def _quantize_graph(src: Path, path: Path, mode: str, per_channel: bool, exclude: list[str],
                    feeds: list[dict] | None) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # ORT's advice to pre-process, on every call
    try:
        common = dict(per_channel=per_channel, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                      nodes_to_exclude=exclude, use_external_data_format=True)
        if mode == "dynamic":
            quantize_dynamic(str(src), path, extra_options={"MatMulConstBOnly": True}, **common)
        else:
            quantize_static(str(src), path, _Feeds(feeds), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                            extra_options={"MatMulConstBOnly": True, "ActivationSymmetric": True}, **common)
    finally:
        root.level = level


def check_options(bits: int, mode: str, per_channel: bool, calibration, block_size, accuracy_level) -> tuple:
    """Refuse a request that mixes the int8 and int4 options, naming the bad value; returns int4's
    (block_size, accuracy_level) with their defaults filled in. (`calibration`: anything true
    when calibration prompts are given: the CLI checks before it reads its file.)"""
    if bits == 4:
        block_size = int4.BLOCK_SIZE if block_size is None else block_size
        accuracy_level = int4.ACCURACY_LEVEL if accuracy_level is None else accuracy_level
    if bits not in BITS:
        raise UsageError(f"--bits {bits}: expected one of {list(BITS)} (int8 with activations quantised, "
                         "or weight-only int4)")
    if mode not in MODES:
        raise UsageError(f"unknown quantisation mode {mode!r}; expected one of {list(MODES)}")
    if bits == 4:
        given = [o for o, v in (("--mode static", mode == "static"), ("--per-channel", per_channel),
                                ("--calibration", calibration)) if v]
        if given:
            raise UsageError(f"{given[0]} is an int8 option; --bits 4 is weight-only, one scale per block "
                             "of --block-size weights")
        if block_size not in int4.BLOCK_SIZES:
            raise UsageError(f"--block-size {block_size}: expected one of {list(int4.BLOCK_SIZES)}")
        if accuracy_level not in int4.ACCURACY_LEVELS:
            raise UsageError(f"--accuracy-level {accuracy_level}: expected one of {list(int4.ACCURACY_LEVELS)}")
        return block_size, accuracy_level
    if block_size is not None or accuracy_level is not None:
        raise UsageError(f"--{'block-size' if block_size is not None else 'accuracy-level'} is an int4 option "
                         "(--bits 4)")
    if calibration and mode != "static":
        raise UsageError("calibration prompts are for --mode static (dynamic int8 needs none)")
    return block_size, accuracy_level


def quantize(folder, out, *, bits: int = 8, mode: str = "dynamic", per_channel: bool = False, exclude=(),
             include_head: bool | None = None, block_size: int | None = None, accuracy_level: int | None = None,
             overwrite: bool = False, calibration: list[str] | None = None, dense_experts: str = "float32",
             keep_sensitive: bool = True, log=None) -> Path:
    """Write an int8 (`bits` 8) or weight-only int4 (`bits` 4) copy of the exported `folder` to
    `out` (atomically). `include_head`: True, the output head at `bits` too; False, float32;
    None (default): int8 float32, int4 8-bit (`export.int4.HEAD_BITS`).
    `block_size`, `accuracy_level`: int4's MatMulNBits options [32, 4]. `calibration`: static
    int8's prompts (text; default: seeded random token ids). `dense_experts`: "int8" stores a
    dense-form export's expert stacks in int8 (`export.dense_experts`), "float32" keeps them.
    `keep_sensitive` False: the family's sensitive projections (`Family.int8_keep_float`) are
    quantised like every other weight (faster, less precise: validate's state drift judges it)."""
    log = log or (lambda msg: None)
    folder, out = Path(folder), Path(out)
    if dense_experts not in ("float32", "int8"):
        raise UsageError(f"dense_experts {dense_experts!r}; expected 'float32' or 'int8'")
    # (int8 dense experts: 2.9x smaller and slower, at Nemotron 3 Nano's expert shape step 1.46x
    # and prefill 3.4x float32's: every read casts and scales the stack: docs/quantization.md)
    dense_int8 = dense_experts == "int8"
    block_size, accuracy_level = check_options(bits, mode, per_channel, calibration, block_size, accuracy_level)
    if include_head is None:  # the default: int8 keeps the head float32, int4 makes it 8-bit
        head_bits = int4.HEAD_BITS if bits == 4 else None
    else:
        head_bits = bits if include_head else None
    manifest = _float32_source(folder, bits)
    family = families.get(manifest["family"])
    # the graphs' structure (what stays float, their I/O); each graph's weights are read in the
    # loop below, one graph at a time
    models = {name: _structure(folder, g["file"]) for name, g in manifest["graphs"].items()}
    family_rule = family.keep_float(manifest["config"])
    family_keep = family_rule if keep_sensitive else ()
    keep, kept = _kept_float(models, [*exclude, *family_keep], exclude, head_bits, bits)
    started = time.perf_counter()
    feeds = calibration_feeds(folder, calibration) if mode == "static" else {}
    kind = (f"int4 (MatMulNBits, block {block_size}, accuracy level {accuracy_level}, head "
            f"{f'int{head_bits}' if head_bits else 'float32'})" if bits == 4 else f"int8 ({mode})")
    # the scratch inside the hidden folder: a quantise killed outright (SIGKILL, out of memory)
    # leaves it where the next one to `out` removes it (`atomic.remove_stale`), and ORT's own
    # temporary files with it
    with atomic_folder(out, overwrite) as tmp, tempfile.TemporaryDirectory(dir=tmp, prefix=".scratch-") as scratch, \
            _temporary_files_in(scratch):
        quantized, experts, quantized_stacks, dense_stacks = {}, None, {}, {}
        for name, g in manifest["graphs"].items():
            # with its weights (but the expert stacks an earlier graph quantised), edited in place
            graph = _with_weights(folder, g["file"], skip=quantized_stacks.keys() | dense_stacks.keys())
            gemms_as_matmul(graph)  # as `_kept_float` did to the structure
            # the experts first: the float expert stacks are most of an MoE model's bytes
            experts = _experts(name, graph, bits, block_size, accuracy_level, dense_int8, quantized_stacks,
                               dense_stacks, log) or experts
            if bits == 4:
                quantized[name] = _int4_graph(name, graph, keep[name], head_bits, block_size, accuracy_level)
                del graph  # (the float weights: before the next graph's are read)
            else:
                path = Path(scratch) / name / g["file"]
                path.parent.mkdir()
                # handed to ORT's quantiser as a file, this process's copy let go: given a proto,
                # it saves and reloads it, and both copies were held at once
                source = path.with_name("source.onnx")
                onnx.save_model(graph, str(source), save_as_external_data=True, location="source.onnx.data")
                del graph
                arithmetic = {n.name for n in structural_nodes(models[name])}
                _quantize_graph(source, path, mode, per_channel, sorted(keep[name] | arithmetic), feeds.get(name))
                quantized[name] = onnx.load(str(path))
            if _io(quantized[name]) != _io(models[name]):
                raise ExportError(f"graph {name!r}: the quantiser changed the graph's inputs or outputs")
        # one weights file again: a quantised weight both graphs read (same name, same bytes) once
        shared = share_weights(quantized, {name: {} for name in quantized})
        shared.write(tmp / WEIGHTS_FILE)
        graphs = {}
        for name, g in manifest["graphs"].items():
            onnx.save_model(quantized[name], str(tmp / g["file"]))
            onnx.checker.check_model(str(tmp / g["file"]))
            graphs[name] = graph_entry(tmp, graph_specs(manifest)[name], g["file"])
            total = len(weight_nodes(models[name]))
            log(f"  {name}: {total - len(keep[name])}/{total} weight MatMuls {kind}, {len(keep[name])} float32")
        log(f"  {WEIGHTS_FILE}: {_weights_bytes(manifest) / 1e6:.1f} MB -> {shared.size / 1e6:.1f} MB")
        still = sum(a.nbytes for a in shared.arrays.values() if a.dtype == np.float32)
        # what stays float32: the MatMuls kept so, and weights no MatMul takes (embeddings, norms)
        log(f"  {still / 1e6:.1f} MB of it ({still / max(shared.size, 1):.0%}) float32: the MatMuls kept float32, "
            "and weights no MatMul takes as its weight (embeddings, norms)")
        for file in tokenizer_files(manifest):
            (tmp / file).write_bytes((folder / file).read_bytes())
        source = dict(manifest.get("source") or {})
        if source.get("checkpoint") and not Path(source["checkpoint"]).is_absolute():
            source["checkpoint"] = str((folder / source["checkpoint"]).resolve())  # validate's eager model
        new = {k: v for k, v in manifest.items() if k not in ("format", "format_version", "parity", "weights")}
        record = _record(bits, mode, per_channel, block_size, accuracy_level, feeds)
        new |= {"graphs": graphs, "weights": shared.record(), "source": source, "quantization": record | {
            "include_head": bool(head_bits), "head": f"int{head_bits}" if head_bits else "float32",
            "excluded_patterns": list(exclude),
            "family_kept_float": list(family_keep), "kept_float": kept,
            **({} if keep_sensitive else {"sensitive_quantized": list(family_rule)}),
            "source": {"folder": str(folder.resolve()), "manifest_sha256": sha256_file(folder / MANIFEST)},
            **({"experts": experts} if experts else {}),
            "seconds": round(time.perf_counter() - started, 2)}}
        write_manifest(tmp, new)
    log(f"quantised {folder} -> {out} ({kind} weights{', per channel' if per_channel else ''})")
    return out


def _experts(name: str, graph: onnx.ModelProto, bits: int, block_size: int | None, accuracy_level: int | None,
             dense_int8: bool, quantized_stacks: dict, dense_stacks: dict, log) -> dict | None:
    """The graph's experts quantised in place, in the form they were exported in (MoE nodes as
    QMoE; a dense form's stacks in int8 if asked; a kernel export's dense layers, clipped experts,
    as the dense form's): the manifest's record of it, or None."""
    record = None
    block = qmoe.block_for(graph, bits, block_size)
    if moes := qmoe.quantize_experts(graph, bits, block, accuracy_level if bits == 4 else None, quantized_stacks):
        log(f"  {name}: {moes} mixture-of-experts nodes as QMoE int{bits} "
            f"({f'block {block}' if block else 'a scale per row'})")
        record = {"op": "QMoE", "bits": bits, "block_size": block}
    if dense_int8 and (dense := dense_experts.quantize_stacks(graph, dense_stacks)):
        log(f"  {name}: {dense} expert stacks int{dense_experts.BITS} (standard ONNX, a scale per row, "
            "dequantised as read)")
        if record:  # (beside the kernel's)
            return {**record, "dense_bits": dense_experts.BITS}
        return {"op": "dense", "bits": dense_experts.BITS, "block_size": None}
    return record


@contextlib.contextmanager
def _temporary_files_in(folder: str):
    """ONNX Runtime's quantisers write their temporary copies (a graph with shapes inferred, a
    weights file) under `tempfile`'s folder: `folder` meanwhile, not the system's /tmp, where a
    killed run left gigabytes."""
    before, tempfile.tempdir = tempfile.tempdir, folder
    try:
        yield
    finally:
        tempfile.tempdir = before


def _structure(folder: Path, file: str) -> onnx.ModelProto:
    """A graph without the values of its large weights (their names, types and shapes stay): the
    small ones (up to `_ones`' 4096 elements) are read, the rest left in the weights file."""
    return _read(folder, file, lambda t: np.prod(t.dims) <= 4096)


def _with_weights(folder: Path, file: str, skip) -> onnx.ModelProto:
    """A graph with the values of its weights but those named in `skip` (expert stacks another
    graph has quantised already: 1.6 GB of Granite-4.0-H Tiny's width read again for nothing)."""
    return _read(folder, file, lambda t: t.name not in skip)


def _read(folder: Path, file: str, wanted) -> onnx.ModelProto:
    model = onnx.load(str(folder / file), load_external_data=False)
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL and wanted(t):
            external_data_helper.load_external_data_for_tensor(t, str(folder))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
    return model


def _float32_source(folder: Path, bits: int) -> dict:
    """The manifest of the float32 export a quantised copy is made from (UsageError otherwise)."""
    manifest = read_manifest(folder)
    if manifest.get("quantization"):
        q = manifest["quantization"]
        raise UsageError(f"{folder} is already quantised ({q.get('weights', 'int8')} of "
                         f"{q.get('source', {}).get('folder')}); quantise its float32 source instead")
    if manifest["dtype"] != "float32":
        raise UsageError(f"{folder} is a {manifest['dtype']} export; int{bits} is made from a float32 export")
    return manifest


def _kept_float(models: dict, patterns: list[str], exclude, head_bits: int | None,
                bits: int) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Per graph, the node names of the weight MatMuls that stay float32 (the head unless it is
    quantised, those `patterns` match, and for int4 those MatMulNBits cannot take), and the same
    by eager module path (the manifest's record). UsageError for an --exclude matching nothing."""
    keep: dict[str, set[str]] = {}
    kept: dict[str, list[str]] = {}
    matched = dict.fromkeys(exclude, 0)
    for name, model in models.items():
        gemms_as_matmul(model)
        keep[name] = set() if head_bits else head_nodes(model)
        weights, bias_of = {i.name for i in model.graph.initializer}, _bias_of(model)
        for node in weight_nodes(model):
            for pattern in patterns:
                if _matches(node, pattern, weights, bias_of):
                    keep[name].add(node.name)
                    if pattern in matched:
                        matched[pattern] += 1
        if bits == 4:  # a weight MatMulNBits cannot take (not the B operand, not 2-D) stays float32 too
            keep[name] |= {n.name for n in weight_nodes(model)} - {n.name for n in int4.quantizable(model, weight_nodes(model))}
        kept[name] = sorted(_label(n, weights, bias_of) for n in weight_nodes(model) if n.name in keep[name])
    unmatched = [p for p, n in matched.items() if n == 0]
    if unmatched:
        raise UsageError(f"--exclude {unmatched[0]!r} matches no weight MatMul/Gemm (patterns are globs over "
                         "eager module paths such as 'decoder.layers.0.*' or ONNX node names)")
    return keep, kept


def _int4_graph(name: str, model: onnx.ModelProto, keep: set[str], head_bits: int | None, block_size: int,
                accuracy_level: int) -> onnx.ModelProto:
    """`model` (edited) with its weight MatMuls but `keep` as MatMulNBits (the head at its own bits)."""
    chosen = {n.name for n in weight_nodes(model)} - keep
    head = chosen & head_nodes(model) if head_bits != 4 else set()
    quantized = int4.quantize_graph(model, chosen - head, 4, block_size, accuracy_level)
    if head:  # the head in a second pass at its own bits
        quantized = int4.quantize_graph(quantized, head, head_bits, block_size, accuracy_level)
    missed = chosen - set(int4.nbits_nodes(quantized))
    if missed:
        raise ExportError(f"graph {name!r}: the int4 quantiser left {sorted(missed)[:3]} float")
    return compacted(quantized)  # the float weights it replaced let go


def _record(bits: int, mode: str, per_channel: bool, block_size: int | None, accuracy_level: int | None,
            feeds: dict) -> dict:
    """The manifest's "quantization" record of how the weights and activations were quantised."""
    if bits == 4:
        return {"mode": "weight-only", "weights": "int4", "bits": 4, "block_size": block_size,
                "accuracy_level": accuracy_level, "symmetric": int4.SYMMETRIC,
                "activations": "float32" + (" (int8 inside MatMulNBits)" if accuracy_level == 4 else "")}
    return {"mode": mode, "weights": "int8", "bits": 8, "activations": "int8 (calibrated)"
            if mode == "static" else "int8 (per call)", "per_channel": per_channel,
            "calibration_feeds": {k: len(v) for k, v in feeds.items()} or None}


def _weights_bytes(manifest: dict) -> int:
    """The float32 export's weight bytes: its shared file, or (older layouts) its graph files."""
    if manifest.get("weights"):
        return manifest["weights"]["bytes"]
    return sum(g["bytes"] + g.get("data_bytes", 0) for g in manifest["graphs"].values())
