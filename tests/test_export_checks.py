"""What `export_graph` checks of a graph torch.onnx made, before anything is saved: its inputs
and outputs against the spec (names, dtypes, ranks) and every input axis the spec calls
symbolic still symbolic (a second export of one module in a process has come out static); and
a Ctrl-C or SIGTERM that torch.onnx wrapped in its own error is found, to be raised again."""

import onnx
import pytest
from onnx import TensorProto, helper

from seqexport.errors import ExportError
from seqexport.export.common import _name_dims_as_spec, _stop_inside
from seqexport.specs import GraphSpec, TensorSpec


def identity_graph(in_dims, out_dims, elem=TensorProto.FLOAT) -> onnx.ModelProto:
    """y = Identity(x), the shapes as torch.onnx would have written them (ints or dim names)."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem, in_dims)],
                              [helper.make_tensor_value_info("y", elem, out_dims)])
    return helper.make_model(graph)


SPEC = GraphSpec("g", inputs=(TensorSpec("x", "float32", ("batch", 3)),),
                 outputs=(TensorSpec("y", "float32", ("batch", 3)),))


def dims(values) -> list:
    return [d.dim_param or d.dim_value for d in values[0].type.tensor_type.shape.dim]


def test_symbolic_axes_take_the_specs_names():
    model = identity_graph(["s0", 3], ["s0", 3])
    _name_dims_as_spec(model, SPEC)
    assert dims(model.graph.input) == ["batch", 3] and dims(model.graph.output) == ["batch", 3]


def test_an_output_traced_static_is_named_too():
    """An output axis torch.onnx fixed from the example (its size follows the input's) is named
    as the spec says: it is not what the graph is fed."""
    model = identity_graph(["s0", 3], [2, 3])
    _name_dims_as_spec(model, SPEC)
    assert dims(model.graph.output) == ["batch", 3]


@pytest.mark.parametrize("in_dims, elem, message", [
    ([2, 3], TensorProto.FLOAT, "g:x came out static (2) where the spec says 'batch'"),
    (["s0", 4], TensorProto.FLOAT, "g:x has dim 4, the spec says 3"),
    (["s0", 3, 1], TensorProto.FLOAT, "g:x has rank 3, the spec says 2"),
    (["s0", 3], TensorProto.FLOAT16, "g:x came out float16, the spec says float32"),
])
def test_an_input_unlike_the_spec_is_refused_naming_it(in_dims, elem, message):
    model = identity_graph(in_dims, ["s0", 3], elem)
    with pytest.raises(ExportError) as err:
        _name_dims_as_spec(model, SPEC)
    assert message in str(err.value)


def test_io_named_unlike_the_spec_is_refused():
    model = identity_graph(["s0", 3], ["s0", 3])
    spec = GraphSpec("g", inputs=(TensorSpec("input_ids", "float32", ("batch", 3)),),
                     outputs=(TensorSpec("y", "float32", ("batch", 3)),))
    with pytest.raises(ExportError, match=r"exported I/O \['x'\] differ from the spec \['input_ids'\]"):
        _name_dims_as_spec(model, spec)


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(143)], ids=["ctrl-c", "sigterm"])
def test_a_stop_that_torch_onnx_wrapped_in_its_own_error_is_found(stop):
    """Ctrl-C raises KeyboardInterrupt and SIGTERM (cli.main) SystemExit: torch.onnx may wrap
    either in its export error; the export raises the stop again, not an ExportError."""
    try:
        try:
            raise stop
        except BaseException as inner:
            raise RuntimeError("torch.onnx: failed to export the model") from inner
    except RuntimeError as wrapped:
        assert _stop_inside(wrapped) is stop
    looped = ValueError("a")
    looped.__context__ = ValueError("b")
    looped.__context__.__context__ = looped  # a cycle of contexts ends the walk
    assert _stop_inside(looped) is None
