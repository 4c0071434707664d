"""Skip torch.onnx's type-promotion pass where it would insert nothing.

After tracing, torch.onnx runs `InsertTypePromotion`: an fx Interpreter that executes every
node of the program again on fake tensors to find the arguments whose dtype differs from
what the op's promotion rule wants, and inserts a cast for each. On a model that is one
dtype throughout it inserts nothing, yet it costs as much as a trace: 2.9 of a transformer
base export's 21.5 s (the decoder 2.2, the encoder 0.7).

This pass asks each node's rule the same question from the dtypes torch.export already
recorded (`node.meta["val"]`), without running anything. Only when every answer is "no cast"
is the pass skipped, and then the program is exactly what the pass would have left (it
changes a node only where it inserts a cast). Any cast needed, any value it cannot read, any
rule that fails: the full pass runs as before.

Works on torch.onnx's private exporter modules (torch is pinned, constraints.txt): if they
move, `skipping_needless_type_promotion` changes nothing.
"""

import contextlib

import torch

try:
    from torch.onnx._internal.exporter import _fx_passes
    from torch.onnx._internal.fx import type_utils
    from torch.onnx._internal.fx.passes import type_promotion
except ImportError:  # another torch: export as torch does
    _fx_passes = type_promotion = type_utils = None


class _Unknown(Exception):
    """A value the check cannot read: let the full pass decide."""


def _val(arg):
    if isinstance(arg, torch.fx.Node):
        if "val" not in arg.meta:
            raise _Unknown(arg)
        return arg.meta["val"]
    if isinstance(arg, (tuple, list)):
        return type(arg)(_val(a) for a in arg)
    return arg


def _would_cast(arg, dtype) -> bool:
    """Whether the pass's `_maybe_promote_arg` would put a cast in front of this argument."""
    if dtype is None:
        return False
    if isinstance(arg, (tuple, list)):
        return any(_would_cast(a, dtype) for a in arg)
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
    if isinstance(arg, torch.fx.Node) and isinstance(value, torch.Tensor):
        return value.dtype != dtype
    if isinstance(arg, torch.fx.Node) and not type_utils.is_torch_symbolic_type(value):
        raise _Unknown(arg)
    equivalent = type_utils.from_scalar_type_to_torch_dtype(type(value))
    if equivalent is None:
        raise _Unknown(arg)
    return equivalent != dtype


def promotes_nothing(graph_module: torch.fx.GraphModule) -> bool:
    """Whether the type-promotion pass would leave this program (nested graphs too) unchanged."""
    table = type_promotion.TypePromotionTable()
    try:
        for gm in graph_module.modules():
            if not isinstance(gm, torch.fx.GraphModule):
                return False
            for node in gm.graph.nodes:
                if node.op != "call_function":
                    continue
                rule = type_promotion.get_type_promotion_rule(node, table)
                if rule is None:
                    continue
                info = rule.preview_type_promotion(_val(node.args), _val(node.kwargs))
                if any(_would_cast(a, info.args_dtypes.get(i)) for i, a in enumerate(node.args)) or \
                        any(_would_cast(a, info.kwargs_dtypes.get(k)) for k, a in node.kwargs.items()):
                    return False
    except Exception:  # _Unknown, or a rule that cannot preview these values
        return False
    return True


@contextlib.contextmanager
def skipping_needless_type_promotion(stats: dict | None = None):
    """Within: torch.onnx.export's type-promotion pass runs only where it would insert a cast.
    `stats` (optional) counts "skipped" and "promoted" programs."""
    if _fx_passes is None or not hasattr(_fx_passes, "insert_type_promotion_nodes"):
        yield
        return
    full = _fx_passes.insert_type_promotion_nodes

    def insert(graph_module):
        skip = promotes_nothing(graph_module)
        if stats is not None:
            key = "skipped" if skip else "promoted"
            stats[key] = stats.get(key, 0) + 1
        if not skip:
            full(graph_module)

    _fx_passes.insert_type_promotion_nodes = insert
    try:
        yield
    finally:
        _fx_passes.insert_type_promotion_nodes = full
