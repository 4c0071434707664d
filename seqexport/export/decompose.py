"""Skip torch.onnx's second trace where it would change nothing.

torch.onnx.export (dynamo) traces a module twice: torch.export.export, then
`run_decompositions` with a table of every op ONNX lacks, which re-traces the whole
program with fake tensors and symbolic shapes — a third of a transformer base export's
seconds. The ops ONNX implements are kept as they are by that table, so when the first
trace already holds only such ops (and functional ones: torch.export's IR is functional),
the second trace only renames nodes, drops eval-mode dropouts and turns `contiguous`
into `clone` (identities in ONNX either way). Then this pass hands the program on as it
is; any other op (one ONNX lacks, a mutating one, an unknown higher-order op) and the
full decomposition runs as before. `Tensor.to(dtype)` is the one op ONNX lacks that
models use often; it becomes what the decomposition makes of it: the tensor itself where
it has that dtype already, else `_to_copy`.

Works on torch.onnx's private exporter modules (torch is pinned, constraints.txt): if
they move, `skipping_needless_decompositions` changes nothing.
"""

import contextlib
import operator

import torch

try:
    from torch.onnx._internal.exporter import _decomp, _fx_passes
except ImportError:  # another torch: export as torch does
    _decomp = _fx_passes = None

# Left in the graph by the first trace, removed or translated later by torch.onnx itself.
_ASSERTIONS = {
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._assert_async.default,
    torch.ops.aten._assert_async.msg,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten._assert_tensor_metadata.default,
}
_TO_COPY_KWARGS = ("dtype", "layout", "device", "pin_memory", "memory_format")
_SPLITS = (torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default, torch.ops.aten.chunk.default)


def _positive_dim(node: torch.fx.Node) -> None:
    """split(x, sizes, dim=-1) or chunk(x, n, dim=-1) -> dim=rank-1, in place (the third argument)."""
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if isinstance(dim, int) and dim < 0 and val is not None:
        dim += val.dim()
        if len(node.args) > 2:
            node.args = (*node.args[:2], dim, *node.args[3:])
        else:
            node.kwargs = {**node.kwargs, "dim": dim}


def _to_copy_kwargs(node: torch.fx.Node) -> dict | None:
    """The kwargs of the `aten._to_copy(x, **kwargs)` that does what this `aten.to.dtype(x, dtype)`
    or `aten.to.dtype_layout(x, dtype=...)` call does; None for any other call."""
    if node.target is torch.ops.aten.to.dtype:
        if len(node.args) != 2 or set(node.kwargs) - {"non_blocking", "copy", "memory_format"}:
            return None
        return {"dtype": node.args[1], **{k: v for k, v in node.kwargs.items() if k == "memory_format"}}
    if node.target is torch.ops.aten.to.dtype_layout and len(node.args) == 1:
        return {k: v for k, v in node.kwargs.items() if k in _TO_COPY_KWARGS}
    return None


_SYMBOLIC = (torch.sym_not, torch.sym_min, torch.sym_max, torch.sym_float, torch.sym_int)


def _translatable_as_is(ep: "torch.export.ExportedProgram", implemented: set) -> bool:
    """Whether every call in the program (nested graphs too) is one ONNX implements, an
    assertion or symbolic arithmetic; rewrites `to(dtype)` calls when the answer is yes."""
    rewrites = []
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            return False
        for node in gm.graph.nodes:
            verdict = _node_as_is(node, implemented)
            if verdict is False:
                return False
            if isinstance(verdict, dict):
                rewrites.append((gm, node, verdict))
    for gm, node, kwargs in rewrites:
        _rewrite_to(gm, node, kwargs)
    for gm in {gm for gm, _, _ in rewrites}:
        gm.recompile()
    return True


def _node_as_is(node: "torch.fx.Node", implemented: set) -> bool | dict:
    """True: the node translates as it is; a dict: a `to(dtype)` call to rewrite as `_to_copy`
    with these kwargs; False: the program needs the decomposition."""
    if node.op in ("call_module", "call_method"):
        return False
    if node.op != "call_function":
        return True
    target = node.target
    if target in _SPLITS:
        _positive_dim(node)  # as the decomposition writes it (Split's axis, same meaning)
    if target in _ASSERTIONS or target in implemented:
        return not (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable)
    to_copy = _to_copy_kwargs(node)
    if to_copy is not None:
        # the signature names a node feeding the output: leave it to the decomposition
        return False if any(user.op == "output" for user in node.users) else to_copy
    return getattr(target, "__module__", None) in (operator.__name__, "_operator") or target in _SYMBOLIC


def _rewrite_to(gm: "torch.fx.GraphModule", node: "torch.fx.Node", kwargs: dict) -> None:
    """A `to(dtype)` call as `_to_copy`, or gone where it returns the tensor itself."""
    source = node.args[0]
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not node.kwargs.get("copy") and getattr(val, "dtype", None) == kwargs.get("dtype") \
            and set(kwargs) <= {"dtype", "memory_format"} and kwargs.get("memory_format") is None:
        node.replace_all_uses_with(source)  # `to` a tensor's own dtype returns the tensor itself
        gm.graph.erase_node(node)
    else:
        node.target = torch.ops.aten._to_copy.default
        node.args, node.kwargs = node.args[:1], kwargs


def _reshape_as_view(registry) -> None:
    """Translate `reshape` as `view` is (Reshape with allowzero=1: torch's meaning of a 0 in the
    shape), as the graph would read after the decomposition, which turns reshapes into views.
    (Retargeting the FX node instead would break the type-promotion pass, which runs the graph:
    a view of a transposed tensor does not run.)"""
    view = [m for m in registry.get_decomps(torch.ops.aten.view.default) if not m.is_complex]
    if view:
        registry.register_op(torch.ops.aten.reshape.default, view[0].onnx_function)


@contextlib.contextmanager
def skipping_needless_decompositions(stats: dict | None = None):
    """Within: torch.onnx.export's `run_decompositions` runs only where the traced program
    holds an op ONNX lacks. `stats` (optional) counts "skipped" and "decomposed" programs."""
    if _fx_passes is None or not hasattr(_fx_passes, "decompose_with_registry"):
        yield
        return
    full = _fx_passes.decompose_with_registry

    def decompose(ep, registry):
        implemented = set(_decomp.get_onnx_implemented_overloads(registry))
        skip = _translatable_as_is(ep, implemented)
        if stats is not None:
            key = "skipped" if skip else "decomposed"
            stats[key] = stats.get(key, 0) + 1
        if skip:
            _reshape_as_view(registry)
        return ep if skip else full(ep, registry)

    _fx_passes.decompose_with_registry = decompose
    try:
        yield
    finally:
        _fx_passes.decompose_with_registry = full
