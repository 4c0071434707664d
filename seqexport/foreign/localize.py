"""Which layer of a foreign graph diverges first, where the graph keeps recognisable names.

Exporters that trace through torch.onnx name each node after its module scope
(`/model/decoder/layers.0/fc1/MatMul`). The last top-level node of each numbered layer scope
holds that layer's output; a copy of the graph with those values as extra outputs is run on
the inputs of the first diverging call and compared, layer by layer, with the reference
module of the same path (`model.decoder.layers.0`) captured by a forward hook on a full
forward over the same positions. A graph whose layers sit inside an If (Optimum's merged
decoder) or whose node names carry no scopes is not localised (and says so).
"""

import re

import numpy as np
import onnx
import onnxruntime as ort
import torch

from seqexport.parity.compare import compare

SCOPE = re.compile(r"^/((?:[^/]+/)*?(?:layers|layer|h|blocks|block)\.\d+)/")
SKIP_NORMS = ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization")  # com.microsoft: out 3 = input + skip


def layer_values(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(module path, value name) of every numbered layer scope's last top-level node, in graph order.

    Where that value is the skip input of a fused Skip*Normalization (onnxruntime-genai's graphs:
    the residual add moved into the next layer's norm), the layer's output is that node's
    input + skip output (index 3), and a layer whose fused sum is not exposed (the final norm's)
    is left out: its last value is not the residual stream the reference module returns."""
    last: dict[str, str] = {}
    for node in model.graph.node:
        m = SCOPE.match(node.name)
        if m and node.output:
            last.pop(m[1], None)  # keep graph order of each scope's end
            last[m[1]] = node.output[0]
    fused = {n.input[1]: (n.output[3] if len(n.output) > 3 else "") for n in model.graph.node
             if n.op_type in SKIP_NORMS and len(n.input) > 1}
    return [(scope.replace("/", "."), fused.get(value, value)) for scope, value in last.items()
            if fused.get(value, value)]


def locate(model, ref, tokens: np.ndarray, src, chunks: list[int], call: int, atol, rtol) -> str:
    """Re-run the decode up to `call` (the first diverging one) and name its first diverging layer."""
    try:
        ctx, pos = model.begin(tokens.shape[0], src), 0
        for n in chunks[:call + 1]:
            graph = model.graph(ctx.past)
            model.step(tokens[:, pos: pos + n], ctx)
            pos += n
        return first_layer(model.folder / graph.file, model.last_feeds, ref, tokens, src, pos - chunks[call],
                           atol, rtol)
    except Exception as e:  # noqa: BLE001 - naming the layer is a help: it never fails the check itself
        return f"no layer named ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def first_layer(path, feeds: dict, ref, tokens: np.ndarray, src, start: int, atol, rtol) -> str:
    """A note naming the first layer whose output differs on the call that fed positions
    [start, start + n) with `feeds`, or saying why no layer could be named."""
    model = onnx.load(str(path))
    found = [(p, v) for p, v in layer_values(model) if _module(ref.model, p) is not None]
    if not found:
        return ("no layer named: no node at the graph's top level is named after a numbered layer's module "
                "(/…/layers.N/…); none are, or they sit inside an If")
    known = {o.name for o in model.graph.output}
    for _, value in found:
        if value not in known:
            model.graph.output.append(onnx.ValueInfoProto(name=value))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [v for _, v in found]
    got = dict(zip(names, session.run(names, {i.name: feeds[i.name] for i in session.get_inputs()})))
    captured = reference_layers(ref, [p for p, _ in found], tokens[:, : start + feeds_len(got, found)], src)
    for module_path, value in found:
        a, b = got[value], captured.get(module_path)
        if b is None or a.ndim != 3 or b.ndim != 3:
            continue
        b = b[:, start: start + a.shape[1]]  # the call's positions of the full forward
        if a.shape != b.shape:  # e.g. a call run in slices of rows: not this layer's output
            continue
        c = compare(value, a, b, atol, rtol)
        if not c.passed:
            return f"first diverging layer: {module_path} (graph value {value}): max abs {c.max_abs:.3g}"
    return f"no single layer's output diverges beyond tolerance ({len(found)} layers compared)"


def reference_layers(ref, paths: list[str], tokens: np.ndarray, src) -> dict:
    """{module path: its output (b, T, d)} on the reference's full forward over `tokens`."""
    captured, hooks = {}, []
    for module_path in paths:
        def keep(_module_, _inputs, out, key=module_path):
            captured[key] = (out[0] if isinstance(out, tuple) else out).detach().float().numpy()
        hooks.append(_module(ref.model, module_path).register_forward_hook(keep))
    try:
        ref.logits(tokens, src)
    finally:
        for h in hooks:
            h.remove()
    return captured


def feeds_len(got: dict, found) -> int:
    """Positions the call fed: the sequence axis of its first layer value (b, n, d)."""
    return got[found[0][1]].shape[1]


def _module(model: torch.nn.Module, path: str):
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None
