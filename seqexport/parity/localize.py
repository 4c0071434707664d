"""Where a graph diverges: the first eager module whose output the ONNX graph does not reproduce.

The exporter records, on every ONNX node, the module scopes it came from
(`pkg.torch.onnx.name_scopes`). For each module we take the value of the last
top-level node in its scope, add those values as extra graph outputs of a copy of
the *shipped* graph (so a damaged weight in the file is seen), run it, and compare
with the eager module's output captured by a forward hook, in graph order. A scan
inside a Scan/Loop node is covered by the values around that node (the mixer
and block outputs are top-level).
"""

import ast
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import torch

from seqexport.parity.compare import Comparison, compare

SCOPES_KEY = "pkg.torch.onnx.name_scopes"


@dataclass(frozen=True)
class Divergence:
    module: str  # eager module path, e.g. "decoder.layers.0.self_attn.W_q"
    module_type: str  # its class, e.g. "Linear"
    layer: str  # the enclosing numbered layer, e.g. "decoder.layers.0" ("" when outside any)
    onnx_value: str
    comparison: Comparison
    checked: int  # module outputs compared before and including this one

    def to_dict(self) -> dict:
        return {"module": self.module, "module_type": self.module_type, "layer": self.layer,
                "onnx_value": self.onnx_value, "checked": self.checked, **self.comparison.to_dict()}

    def describe(self) -> str:
        where = f" in layer {self.layer}" if self.layer else ""
        return (f"first diverging module: {self.module} ({self.module_type}){where}: "
                f"max abs {self.comparison.max_abs:.3g}")


def scope_ends(model: onnx.ModelProto) -> list[tuple[str, str, int]]:
    """(scope, value, node index) of the last top-level node of every scope, in graph order."""
    last: dict[str, tuple[int, str]] = {}
    for idx, node in enumerate(model.graph.node):
        raw = next((p.value for p in node.metadata_props if p.key == SCOPES_KEY), None)
        if not raw or not node.output:
            continue
        try:
            scopes = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        for s in scopes:
            if s:
                last[s] = (idx, node.output[0])
    return sorted(((s, v, i) for s, (i, v) in last.items()), key=lambda x: x[2])


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for o in out for t in _tensors(o)]
    return []


def _layer_of(path: str) -> str:
    """The outermost numbered module of a path (`layers.1` of Mamba, `blocks.0` of RWKV)."""
    parts = path.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in ("layers", "blocks") and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return ""


def _as_graph_value(eager: torch.Tensor, got) -> np.ndarray | None:
    """The eager module output in the graph value's shape, or None if it is not that value.

    An export-side formulation may run a module on flattened rows (b·t, d) where eager ran it
    on (b, t, d): the same values in the same order, so only a reshape tells them apart."""
    if got is None:
        return None
    if tuple(eager.shape) == got.shape:
        return eager.numpy()
    if eager.ndim and got.ndim and eager.numel() == got.size and eager.shape[-1] == got.shape[-1]:
        return eager.reshape(got.shape).numpy()  # (b, t, d) -> (b·t, d)
    return None


def first_divergence(onnx_path, wrapper: torch.nn.Module, torch_inputs: tuple, feeds: dict,
                     atol: float, rtol: float, providers: list[str]) -> Divergence | None:
    """Run the shipped graph with every module's output exposed; return the first that differs."""
    model = onnx.load(str(onnx_path))
    modules = dict(wrapper.named_modules())
    ends = [(s, v, i) for s, v, i in scope_ends(model) if s in modules and s]
    captured: dict[str, list[torch.Tensor]] = {}
    hooks = [modules[s].register_forward_hook(
        lambda m, args, out, s=s: captured.__setitem__(s, [t.detach().float() for t in _tensors(out)]))
        for s, _, _ in ends]
    try:
        with torch.no_grad():
            wrapper(*torch_inputs)
    finally:
        for h in hooks:
            h.remove()
    present = {o.name for o in model.graph.output}
    ends = [(s, v, i) for s, v, i in ends if s in captured]
    for _, v, _ in ends:
        if v not in present:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(v))
            present.add(v)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(None, feeds)))
    checked = 0
    for scope, v, _ in ends:
        got = values.get(v)
        candidates = [c for t in captured[scope] if (c := _as_graph_value(t, got)) is not None]
        if not candidates:
            continue  # the scope's last node is not one of the module's outputs
        checked += 1
        results = [compare(v, got, c, atol, rtol) for c in candidates]
        best = min(results, key=lambda r: (not r.passed, r.max_abs))
        if not best.passed:
            name = scope.removeprefix("model.")
            return Divergence(name, type(modules[scope]).__name__, _layer_of(name), v, best, checked)
    return None
