"""One weights file for all of a model's graphs, its initializers named after the eager parameters.

torch.onnx folds the transpose of every linear weight into a new constant named `val_N`,
and a prefill graph (MatMul on W^T) and a step graph (Gemm with transB=1 on W) come out
holding one weight in two layouts. After export, over all of a model's graphs at once:

1. every large initializer is matched by value to a parameter of the traced module and
   renamed: the same bytes and shape -> `<param>`, its 2-D transpose -> `<param>.T`, the
   same bytes in another shape -> `<param>.view`; derived constants keep torch's name;
2. one layout per weight: a Gemm(transB=1) on a parameter whose transpose some graph holds
   takes that transpose (transB=0); a Gather from an embedding whose transpose is the (tied)
   head reads the transpose along axis 1, then one Transpose puts the rows back;
3. every large initializer of every graph goes into one external-data file, once per name
   (same name, same bytes: checked), each graph pointing at the same offsets.

`Weights.index` (name -> offset, length, dtype, dims) goes into the manifest: the runtime
maps the file once and hands the same memory to every session.
"""

import hashlib

import numpy as np
import onnx
from onnx import numpy_helper

from seqexport.errors import ExportError

WEIGHTS_FILE = "weights.onnx.data"
MIN_BYTES = 1024  # smaller initializers stay inside their graph (shapes, scalars, masks)
ALIGN = 64  # offsets a multiple of this: aligned loads for the kernels reading the memory


def _bits(a: np.ndarray) -> np.ndarray:
    """The array as unsigned integers of its item size: equality of these is equality of bytes."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(_bits(a), _bits(b))


def _probe(a: np.ndarray) -> tuple:
    """A cheap fingerprint of an array's values in row-major order (no copy of a strided view):
    a dict key that narrows the candidates before `same_bits` compares every byte."""
    idx = np.linspace(0, a.size - 1, 8).astype(np.int64)
    return a.dtype.str, a.size, _bits(a).flat[idx].tobytes()


def _squeezed_2d(a: np.ndarray) -> np.ndarray | None:
    """The array without its size-1 dims if that leaves a matrix (e.g. a depthwise conv kernel)."""
    sq = a.reshape([d for d in a.shape if d != 1])  # (rows, cols) or None
    return sq if sq.ndim == 2 else None


class ValueIndex:
    """Arrays by value: which named array (as is, transposed, or reshaped) holds given values."""

    def __init__(self, arrays: dict[str, np.ndarray], transposes: bool = True):
        self.arrays = arrays
        self.by_probe: dict[tuple, list[tuple[str, bool]]] = {}
        for name, a in arrays.items():  # the first name of tied or equal arrays wins
            if a.nbytes < MIN_BYTES:
                continue
            self.by_probe.setdefault(_probe(a), []).append((name, False))
            sq = _squeezed_2d(a)
            if transposes and sq is not None:
                self.by_probe.setdefault(_probe(sq.T), []).append((name, True))

    def find(self, a: np.ndarray) -> tuple[str, str] | None:
        """(name, how) with how "" (same values and shape), "T" (2-D transpose) or "view"."""
        reshaped = None
        for name, transposed in self.by_probe.get(_probe(a), ()):
            b = self.arrays[name]
            if transposed:
                if same_bits(a, _squeezed_2d(b).T):
                    return name, "T"
            elif same_bits(a.reshape(-1), b.reshape(-1)):
                if a.shape == b.shape:
                    return name, ""
                reshaped = reshaped or (name, "view")
        return reshaped


def _subgraphs(graph: onnx.GraphProto):
    """The graph and every graph nested in its nodes' attributes (Loop/If/Scan bodies)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _subgraphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _subgraphs(g)


def _nodes(model: onnx.ModelProto):
    for g in _subgraphs(model.graph):
        yield from g.node


def _rename(model: onnx.ModelProto, renames: dict[str, str]) -> None:
    """Rename initializers and every node input (nested graphs included) that reads them."""
    if not renames:
        return
    for t in model.graph.initializer:
        t.name = renames.get(t.name, t.name)
    for node in _nodes(model):
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]


def _attr(node, name: str, default: int = 0) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _set_attr(node, name: str, value: int) -> None:
    for a in node.attribute:
        if a.name == name:
            a.i = value
            return
    node.attribute.append(onnx.helper.make_attribute(name, value))


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """Ranks of the values whose shapes the graph records (inputs, outputs, value_info)."""
    g = model.graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in (*g.input, *g.output, *g.value_info)
            if v.type.tensor_type.HasField("shape")}


def _transposed_name(name: str) -> str:
    return name[:-2] if name.endswith(".T") else name + ".T"


def _add_transpose(init: dict[str, np.ndarray], name: str, transposed: str, pool: dict | None = None) -> None:
    """init[transposed] = init[name].T, taken from another graph's `pool` when it holds it (a
    copy of a large matrix: only once; the names are values-derived, so equal names, equal values)."""
    if transposed in init:
        return
    have = (pool or {}).get(transposed)
    if have is not None and same_bits(have.T, init[name]):
        init[transposed] = have
    else:
        init[transposed] = init[name].T  # a view: copied one at a time as the file is written


def _fold_transposes(model: onnx.ModelProto, init: dict[str, np.ndarray]) -> None:
    """A Transpose of a 2-D initializer (left when torch.onnx does not fold a large one, e.g.
    a tied head) becomes the transposed initializer itself: ORT would fold it at load, a
    second copy of the weight in memory in every session."""
    renames, kept = {}, []
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        perm = [a.ints for a in node.attribute if a.name == "perm"]
        if node.op_type == "Transpose" and node.input[0] in init and init[node.input[0]].ndim == 2 \
                and (not perm or list(perm[0]) == [1, 0]) and node.output[0] not in outputs:
            name = _transposed_name(node.input[0])
            _add_transpose(init, node.input[0], name)
            renames[node.output[0]] = name
        else:
            kept.append(node)
    if renames:
        del model.graph.node[:]
        model.graph.node.extend(kept)
        for node in _nodes(model):
            for i, name in enumerate(node.input):
                if name in renames:
                    node.input[i] = renames[name]


def _one_layout(models: dict[str, onnx.ModelProto], arrays: dict[str, dict[str, np.ndarray]]) -> None:
    """Gemm(transB=1) on W and Gather from E read W.T / E.T where some graph holds those."""
    for gname, model in models.items():
        _fold_transposes(model, arrays[gname])
    transposes = {n[:-2] for graph in arrays.values() for n in graph if n.endswith(".T")}
    pool = {n: a for graph in arrays.values() for n, a in graph.items() if n.endswith(".T")}
    for gname, model in models.items():
        init = arrays[gname]
        ranks = None
        new_nodes = []
        for node in model.graph.node:
            if node.op_type == "Gemm" and len(node.input) > 1 and node.input[1] in transposes \
                    and node.input[1] in init and _attr(node, "transB") == 1:
                w = node.input[1]
                _add_transpose(init, w, w + ".T", pool)
                node.input[1] = w + ".T"
                _set_attr(node, "transB", 0)
            elif node.op_type == "Gather" and node.input[0] in transposes and node.input[0] in init \
                    and _attr(node, "axis") == 0 and init[node.input[0]].ndim == 2:
                ranks = ranks if ranks is not None else _ranks(model)
                rank = ranks.get(node.input[1])
                if rank is None:
                    new_nodes.append(node)
                    continue
                e, out = node.input[0], node.output[0]
                _add_transpose(init, e, e + ".T", pool)
                node.input[0] = e + ".T"
                _set_attr(node, "axis", 1)
                node.output[0] = out + "_cols"  # (d, *ids) -> (*ids, d)
                new_nodes.append(node)
                new_nodes.append(onnx.helper.make_node("Transpose", [node.output[0]], [out],
                                                       name=node.name + "_rows", perm=[*range(1, rank + 1), 0]))
                continue
            new_nodes.append(node)
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)


def _used(model: onnx.ModelProto) -> set[str]:
    used = {name for node in _nodes(model) for name in node.input}
    return used | {o.name for o in model.graph.output}


class Weights:
    """The shared weights file being written, and its index."""

    def __init__(self, file: str = WEIGHTS_FILE):
        self.file = file
        self.sha256: str | None = None  # once written
        self.index: dict[str, dict] = {}
        self.arrays: dict[str, np.ndarray] = {}  # name -> value, in file order
        self.size = 0
        self._values: ValueIndex | None = None

    def holds(self, name: str, a: np.ndarray) -> bool | None:
        """None: no tensor of that name yet; else whether it holds these very bytes."""
        return same_bits(self.arrays[name], a) if name in self.arrays else None

    def add(self, name: str, a: np.ndarray) -> dict:
        if name in self.index:
            if not same_bits(self.arrays[name], a):
                raise ExportError(f"two graphs hold different values under the initializer name {name!r}")
            return self.index[name]
        self.size += -self.size % ALIGN  # (a view, e.g. a parameter's transpose, is made contiguous as written)
        self.index[name] = {"offset": self.size, "length": a.nbytes, "dtype": a.dtype.name, "dims": list(a.shape)}
        self.arrays[name] = a
        self.size += a.nbytes
        return self.index[name]

    def find(self, a: np.ndarray) -> tuple[str, bool] | None:
        """(name, transposed) of the tensor in the file holding `a` or its 2-D transpose."""
        if self._values is None:
            self._values = ValueIndex(self.arrays, transposes=False)
        sq = _squeezed_2d(a)
        for b, transposed in ((a, False), (sq.T if sq is not None else None, True)):
            found = self._values.find(b) if b is not None else None
            if found is not None and found[1] == "":
                return found[0], transposed
        return None

    def write(self, path) -> None:
        """Write the file, hashing it on the way (no second read for the manifest's sha256)."""
        h = hashlib.sha256()
        with open(path, "wb") as f:
            for name, a in self.arrays.items():
                pad = self.index[name]["offset"] - f.tell()
                f.write(b"\0" * pad)
                h.update(b"\0" * pad)
                data = memoryview(np.ascontiguousarray(a)).cast("B")
                f.write(data)
                h.update(data)
        self.sha256 = h.hexdigest()

    def record(self) -> dict:
        """The manifest's "weights" entry: the file, its size and sha256, and every tensor in it."""
        return {"file": self.file, "sha256": self.sha256, "bytes": self.size, "tensors": self.index}


def share_weights(models: dict[str, onnx.ModelProto], params: dict[str, dict[str, np.ndarray]],
                  file: str = WEIGHTS_FILE, named: dict[str, dict[str, np.ndarray]] | None = None) -> Weights:
    """Name, lay out and externalise the initializers of `models` (edited in place); `params`
    gives each graph's traced parameters (state_dict as numpy); `named`, each graph's
    `named_initializers` where they were taken already (as each graph was exported). Returns
    the file to write."""
    named = named or {}
    arrays = {gname: named[gname] if gname in named else named_initializers(model, params[gname])
              for gname, model in models.items()}
    _one_layout(models, arrays)
    weights = Weights(file)
    for gname, model in models.items():
        _externalise(gname, model, arrays[gname], params[gname], weights, file)
    return weights


def named_initializers(model: onnx.ModelProto, params: dict[str, np.ndarray], sources: dict[str, tuple] | None = None,
                       values: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The graph's initializers renamed after the traced parameter they equal (where one does and
    the name is free), as name -> array. The proto's copy of each large value is let go as it
    is read (`share_weights` writes the initializers anew), and one that equals a parameter (as
    is, transposed or reshaped) becomes a view of it, recorded in `sources` as (parameter, how,
    shape): before, every graph's weights were held twice more (an export peaked at 5-6x its
    weights). `values`: initializers the proto holds by reference only, by name."""
    lookup = ValueIndex(params)
    values = values or {}
    renames, init = {}, {}
    taken = {t.name for t in model.graph.initializer}
    for t in model.graph.initializer:
        a = values[t.name] if t.name in values else numpy_helper.to_array(t)
        name = t.name
        found = lookup.find(a) if a.nbytes >= MIN_BYTES else None
        if found is not None:
            param, how = found
            a = _as_view(params[param], how, a.shape)
            found = param + (f".{how}" if how else "")
            if found == name or found not in taken:
                name = found
            if sources is not None:
                sources[name] = (param, how, a.shape)
        if a.nbytes >= MIN_BYTES:
            t.ClearField("raw_data")
        renames[t.name] = name
        taken.add(name)
        init[name] = a
    _rename(model, {k: v for k, v in renames.items() if k != v})
    return init


def compacted(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in fresh memory, to hold instead of it: a field cleared or a tensor
    removed keeps its bytes in the message's arena for as long as the message lives."""
    fresh = onnx.ModelProto()
    fresh.CopyFrom(model)  # (no serialisation: no 2 GB limit)
    return fresh


def _as_view(param: np.ndarray, how: str, shape: tuple) -> np.ndarray:
    """The parameter's own memory in the layout a graph holds it (`ValueIndex.find`'s how)."""
    if how == "T":
        return _squeezed_2d(param).T
    return param.reshape(shape)  # as is, or "view": the same bytes in another shape


def as_references(arrays: dict[str, np.ndarray], sources: dict[str, tuple]) -> dict:
    """`named_initializers`' arrays for another process that holds the same parameters: each
    view of a parameter as its (parameter, how, shape), the other arrays as they are."""
    return {name: sources.get(name, a) for name, a in arrays.items()}


def resolved(references: dict, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`as_references` made arrays again, over this process's parameters."""
    return {name: _as_view(params[r[0]], r[1], r[2]) if isinstance(r, tuple) else r
            for name, r in references.items()}


def _externalise(gname: str, model: onnx.ModelProto, init: dict[str, np.ndarray], params: dict,
                 weights: Weights, file: str) -> None:
    """The graph's used initializers: small ones inline, the rest in the shared file (once for
    every graph reading the same name and bytes); a derived constant that differs from another
    graph's of the same name gets the graph's name in front."""
    used = _used(model)
    kept, renames = [], {}
    for name, a in init.items():
        if name not in used:
            continue
        if a.nbytes < MIN_BYTES:
            kept.append(numpy_helper.from_array(a, name))
            continue
        if weights.holds(name, a) is False:
            if name in params or name.endswith((".T", ".view")):
                raise ExportError(f"graph {gname!r}: parameter {name!r} differs from another graph's")
            renames[name] = name = f"{gname}.{name}"  # a derived constant torch named alike
        kept.append(_external(name, a, weights.add(name, a), file))
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    for node in _nodes(model):
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]


def _external(name: str, a: np.ndarray, entry: dict, file: str) -> onnx.TensorProto:
    t = onnx.TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(a.dtype), dims=a.shape)
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", file), ("offset", str(entry["offset"])), ("length", str(entry["length"]))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t
