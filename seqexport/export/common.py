"""Shared export steps: one graph through torch.onnx, checks, the artifact folder + manifest."""

import contextlib
import copy
import io
import logging
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import onnx
import onnx_ir as ir
import torch

import seqexport
from seqexport.checkpoints.generation import checkpoint_generation
from seqexport.checkpoints.io import Checkpoint, checkpoint_sha256, save_checkpoint
from seqexport.errors import CheckpointError, ExportError
from seqexport.export.atomic import atomic_folder
from seqexport.export.decompose import skipping_needless_decompositions
from seqexport.export.type_promotion import skipping_needless_type_promotion
from seqexport.export.weights import (
    MIN_BYTES,
    WEIGHTS_FILE,
    Weights,
    compacted,
    named_initializers,
    share_weights,
)
from seqexport.generation_config import not_applied_note, rule_ids, unknown_id
from seqexport.manifest import graph_entry, sha256_file, write_manifest
from seqexport.specs import GraphSpec

TWO_GB = 2**31
# torch.onnx logs a warning per missing torchvision op on every export: noise for our users.
logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}
# Graphs exported inside `write_artifact` wait here to be saved together, sharing one weights file.
_pending: list | None = None


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ExportError(f"unsupported dtype {name!r}; expected one of {list(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def progress(msg: str) -> None:
    click.echo(msg, err=True)


@contextlib.contextmanager
def step(msg: str):
    """Announce a step that may take a while, then say how long it took."""
    progress(f"  {msg} …")
    t = time.perf_counter()
    yield
    progress(f"  {msg} done in {time.perf_counter() - t:.1f} s")


def dynamic_shapes_for(spec: GraphSpec, varargs_from: int | None = None):
    """torch.export dynamic_shapes from a spec; inputs from `varargs_from` on nest as one tuple."""
    dims = {}
    shapes = []
    for t in traced_inputs(spec):
        shapes.append({axis: dims.setdefault(name, torch.export.Dim(name)) for axis, name in t.dynamic_axes.items()})
    if varargs_from is None:
        return tuple(shapes)
    return (*shapes[:varargs_from], tuple(shapes[varargs_from:]))


def traced_inputs(spec: GraphSpec) -> list:
    """The inputs torch traces: all but a "keep" input, which `keep_last_positions` adds after."""
    return [t for t in spec.inputs if t.role != "keep"]


def keep_last_positions(model: onnx.ModelProto, keep, logits: str) -> None:
    """Give `logits` only the last `keep` positions (axis 1; 0: all): a Slice on the input of the
    head MatMul that makes them, so the head multiplies only the rows asked for. Generation asks
    for 1; validate for all. Between that MatMul and the output only Slice/Cast may stand, and a
    Mul or Div by one constant (a logits scale, e.g. Granite's logits_scaling): each is the same
    on every position."""
    producers = {o: n for n in model.graph.node for o in n.output}
    scalars = {t.name for t in model.graph.initializer if int(np.prod(t.dims)) == 1}
    node, chain = producers.get(logits), set()
    while node is not None and (node.op_type in ("Slice", "Cast", "Identity")
                                or (node.op_type in ("Mul", "Div") and node.input[1] in scalars)):
        chain.add(node.input[0])
        node = producers.get(node.input[0])
    if node is None or node.op_type != "MatMul":
        raise ExportError(f"{logits}: no head MatMul found to keep the last positions at")
    rows, kept = node.input[0], node.input[0] + "_kept"
    start, end, axis = f"{keep.name}_start", f"{keep.name}_end", f"{keep.name}_axis"
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array([2**63 - 1], np.int64), end),
                                    onnx.numpy_helper.from_array(np.array([1], np.int64), axis)])
    at = list(model.graph.node).index(node)
    model.graph.node.insert(at, onnx.helper.make_node("Slice", [rows, start, end, axis], [kept],
                                                      name=f"{keep.name}_slice"))  # (b, l, d) -> (b, kept, d)
    model.graph.node.insert(at, onnx.helper.make_node("Neg", [keep.name], [start], name=f"{keep.name}_neg"))
    node.input[0] = kept
    stale = [v for v in model.graph.value_info if v.name not in chain]  # those had every position
    del model.graph.value_info[:]
    model.graph.value_info.extend(stale)
    model.graph.input.append(onnx.helper.make_tensor_value_info(keep.name, onnx.TensorProto.INT64, list(keep.dims)))


@contextlib.contextmanager
def _fx_stack_traces(on: bool):
    """Whether torch.fx records the Python stack of every traced node: a tenth of tracing's
    seconds, kept only as ONNX node metadata (`pkg.torch.onnx.stack_trace`, which nothing
    here reads) and in the messages of exports that fail."""
    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = not on
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


def _onnx_program(module: torch.nn.Module, args: tuple, kwargs: dict, stack_traces: bool):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            skipping_needless_decompositions(), skipping_needless_type_promotion(), \
            _fx_stack_traces(stack_traces):
        warnings.simplefilter("ignore")
        return torch.onnx.export(module, args, **kwargs)


def fits_one_protobuf(module: torch.nn.Module) -> bool:
    """Whether a graph holding this module's weights stays under protobuf's 2 GB limit
    (above it the weights go to a side file: ByteSize itself fails there)."""
    weights = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    return weights <= TWO_GB - (256 << 20)


def _raise_if_stopped(error: BaseException) -> None:
    """Re-raise a Ctrl-C or SIGTERM that torch.onnx wrapped in its export error."""
    stop = _stop_inside(error)
    if stop is not None:
        raise stop from None


def _stop_inside(error: BaseException) -> BaseException | None:
    """A KeyboardInterrupt or SystemExit that `error` was raised from, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if not isinstance(error, Exception):
            return error
        error = error.__cause__ or error.__context__
    return None


def export_graph(module: torch.nn.Module, args: tuple, spec: GraphSpec, path: Path, opset: int,
                 dynamic_shapes, custom_translation_table: dict | None = None) -> onnx.ModelProto:
    """Export one graph with the spec's names and dims, save it, and check it.

    The ONNX inputs are checked to be as dynamic as the spec says: a second export
    of one module in a process has been seen to come out silently static. A "keep"
    input (`args` has a value for it, ignored) is added after tracing: `keep_last_positions`.
    """
    keep = [t for t in spec.inputs if t.role == "keep"]
    if keep:
        args = tuple(a for a, t in zip(args, spec.inputs, strict=True) if t.role != "keep")
    kwargs = dict(dynamo=True, opset_version=opset, input_names=[t.name for t in traced_inputs(spec)],
                  output_names=spec.output_names, dynamic_shapes=dynamic_shapes,
                  custom_translation_table=custom_translation_table)
    try:
        program = _onnx_program(module, args, kwargs, stack_traces=False)
    except Exception as e:
        _raise_if_stopped(e)
        try:  # again with a Python stack per node: its message names source lines
            program = _onnx_program(module, args, kwargs, stack_traces=True)
        except Exception as again:
            _raise_if_stopped(again)
            # one error naming the graph (`--debug` shows torch's own traceback)
            raise ExportError(f"graph {spec.name!r}: torch.onnx cannot export it: {type(again).__name__}: {again}") \
                from again
    values = _weights_out_of(program.model) if _pending is not None else None
    model = program.model_proto
    for t in keep:
        keep_last_positions(model, t, spec.outputs[0].name)
    _name_dims_as_spec(model, spec)
    if _pending is not None:  # inside write_artifact: saved there with the other graphs' weights
        sources = {}
        arrays = named_initializers(model, numpy_params(module), sources, values)
        model = compacted(model)  # without the weights' bytes (the traced proto let go)
        _pending.append(PendingGraph(spec.name, Path(path), model, module, arrays, sources))
        return model
    large = not fits_one_protobuf(module)
    onnx.save_model(model, str(path), save_as_external_data=large,
                    location=path.name + ".data" if large else None)
    onnx.checker.check_model(str(path), full_check=True)
    return model


def _weights_out_of(traced) -> dict[str, np.ndarray]:
    """The traced graph's large initializers (an onnx_ir model) as arrays over the tensors torch
    holds (a parameter's own memory, or a constant torch computed), each left in the graph as a
    reference to nowhere that `share_weights` replaces: the graph's proto is then made without
    copying a weight (it was: one more copy of the model's weights per graph being exported)."""
    values = {}
    for name, value in traced.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or tensor.nbytes < MIN_BYTES:
            continue
        try:
            values[name] = tensor.numpy()
        except Exception:  # a tensor numpy cannot hold: serialised with the graph as usual
            continue
        value.const_value = ir.ExternalTensor("(held in memory until saved)", 0, tensor.nbytes, tensor.dtype,
                                               shape=tensor.shape, name=name)
    return values


def _name_dims_as_spec(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Check every graph I/O against the spec and write the spec's dim names into the graph."""
    for values, tensors in ((model.graph.input, spec.inputs), (model.graph.output, spec.outputs)):
        got = [v.name for v in values]
        want = [t.name for t in tensors]
        if got != want:
            raise ExportError(f"graph {spec.name!r}: exported I/O {got} differ from the spec {want}")
        for v, t in zip(values, tensors):
            elem = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
            if elem != t.dtype:
                raise ExportError(f"{spec.name}:{t.name} came out {elem}, the spec says {t.dtype}")
            dims = v.type.tensor_type.shape.dim
            if len(dims) != len(t.dims):
                raise ExportError(f"{spec.name}:{t.name} has rank {len(dims)}, the spec says {len(t.dims)}")
            for d, want_dim in zip(dims, t.dims):
                if isinstance(want_dim, str):
                    if d.HasField("dim_value") and values is model.graph.input:
                        raise ExportError(
                            f"{spec.name}:{t.name} came out static ({d.dim_value}) where the spec "
                            f"says {want_dim!r}; export in a fresh process"
                        )
                    d.dim_param = want_dim
                elif d.HasField("dim_value") and d.dim_value != want_dim:
                    raise ExportError(f"{spec.name}:{t.name} has dim {d.dim_value}, the spec says {want_dim}")


def source_record(ckpt: Checkpoint, preset: str | None, folder: Path, weights: Weights | None = None) -> dict:
    """Where validate and bench find the eager model again; a preset's weights go in the folder
    (those the shared weights file holds as they are or transposed, by reference: see
    `checkpoints.io.save_checkpoint`)."""
    if preset is None:
        return {"checkpoint": str(Path(ckpt.path).resolve()), "sha256": ckpt.sha256, "preset": None}
    save_checkpoint(ckpt.model, ckpt.config, ckpt.family, folder / "checkpoint", shared=weights)
    return {"checkpoint": "checkpoint", "sha256": checkpoint_sha256(folder / "checkpoint"), "preset": preset}


@dataclass
class PendingGraph:
    """A graph exported inside `write_artifact`, waiting to be saved with the others: its
    initializers already taken out as arrays (`weights.named_initializers`; their `sources`
    name the parameters they are views of)."""

    name: str
    path: Path
    model: onnx.ModelProto
    module: torch.nn.Module
    arrays: dict[str, np.ndarray]
    sources: dict[str, tuple]


def numpy_params(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """The module's parameters and buffers as numpy arrays over the same memory; a buffer kept
    out of the state dict too (an export's own layout of a weight, e.g. the experts' gate/up
    rows interleaved for ONNX Runtime's MoE: 1.6 GB of Granite-4.0-H Tiny's width, which each
    graph otherwise held a copy of)."""
    tensors = dict(module.named_buffers()) | module.state_dict()
    return {k: v.detach().cpu().numpy() for k, v in tensors.items()}


def save_graphs(tmp: Path, pending: list[PendingGraph]) -> Weights | None:
    """Save graphs exported together: one weights file (see `export.weights`), then check each."""
    if not pending:
        return None
    models = {p.name: p.model for p in pending}
    params = {p.name: numpy_params(p.module) for p in pending}
    with step("naming and sharing the weights"):
        weights = share_weights(models, params, named={p.name: p.arrays for p in pending})
        weights.write(tmp / WEIGHTS_FILE)
    with step("saving and checking the graphs"):
        for p in pending:
            onnx.save_model(p.model, str(p.path))
            onnx.checker.check_model(str(p.path), full_check=True)
    return weights


def copy_tokenizer(record: dict | None, folder: Path) -> dict | None:
    """A tokenizer record whose file ("source") is copied into the artifact, hashed like a graph."""
    if not record or "source" not in record:
        return record
    source = Path(record["source"])
    record = {k: v for k, v in record.items() if k != "source"}
    target = folder / record["file"]
    shutil.copyfile(source, target)
    record = record | {"sha256": sha256_file(target), "bytes": target.stat().st_size}
    if "chat_template" in record:  # its text, written beside the tokenizer and hashed too
        chat = {k: v for k, v in record["chat_template"].items() if k != "text"}
        (folder / chat["file"]).write_text(record["chat_template"]["text"], encoding="utf-8")
        record["chat_template"] = chat | {"sha256": sha256_file(folder / chat["file"]),
                                          "bytes": (folder / chat["file"]).stat().st_size}
    return record


def check_rule_ids(ckpt: Checkpoint, generation: dict | None, specs: dict[str, GraphSpec]) -> None:
    """CheckpointError naming a token rule's id that the model cannot pick (past its logits'
    width): every decode would refuse it, so the export does, before anything is written."""
    widths = [t.dims[-1] for spec in specs.values() for t in spec.outputs if t.name == "logits"]
    if not generation or not widths or not isinstance(widths[0], int):
        return
    if message := unknown_id(rule_ids(generation["defaults"]), widths[0]):
        raise CheckpointError(f"{Path(ckpt.path) / generation['file']}: {message}")


def model_in_dtype(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """The model to trace: itself for float32, a converted copy otherwise (the original stays)."""
    return model.eval() if dtype == "float32" else copy.deepcopy(model).to(torch_dtype(dtype)).eval()


def write_artifact(out: str | Path, overwrite: bool, ckpt: Checkpoint, preset: str | None,
                   specs: dict[str, GraphSpec], build: Callable[[Path], None], *, opset: int,
                   dtype: str, options: dict, tokenizer: dict | None = None) -> Path:
    """Run `build(tmp)` (which writes the .onnx files) and the manifest, atomically."""
    out = Path(out)
    family, config = ckpt.family, ckpt.config
    started = time.perf_counter()
    global _pending
    generation = checkpoint_generation(ckpt)  # (a bad value refused before anything is written)
    check_rule_ids(ckpt, generation, specs)
    if note := not_applied_note(generation):
        progress(f"warning: {note}")
    with atomic_folder(out, overwrite) as tmp:
        tokenizer = copy_tokenizer(tokenizer, tmp)
        _pending = []
        try:
            build(tmp)
            pending = _pending
        finally:
            _pending = None
        weights = save_graphs(tmp, pending)
        source = source_record(ckpt, preset, tmp, weights)
        graphs = {name: graph_entry(tmp, spec, f"{name}.onnx") for name, spec in specs.items()}
        write_manifest(tmp, {
            "family": family,
            "config": config.to_dict(),
            "opset": opset,
            "dtype": dtype,
            "tokenizer": tokenizer,
            **({"generation": generation} if generation else {}),  # the checkpoint's decode defaults
            "graphs": graphs,
            "weights": weights.record() if weights else None,
            "source": source,
            "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                         "seqexport": seqexport.__version__},
            "export_options": options,
            "export_seconds": round(time.perf_counter() - started, 2),
        })
    total = sum(g["bytes"] + g.get("data_bytes", 0) for g in graphs.values()) + (weights.size if weights else 0)
    sizes = ", ".join(f"{g['file']} {(g['bytes'] + g.get('data_bytes', 0)) / 1e6:.1f} MB" for g in graphs.values())
    if weights:
        sizes += f", {weights.file} {weights.size / 1e6:.1f} MB"
    progress(f"exported {family} to {out}: {sizes} (total {total / 1e6:.1f} MB), opset {opset}, "
             f"{dtype}, {time.perf_counter() - started:.1f} s")
    return out
