"""OpenVINO's runner: an export's ONNX file compiled by OpenVINO for the CPU, fed and read
like `session.Graph` (numpy in, numpy out, the same input checks).

OpenVINO (`pip install 'seqexport[openvino]'`) reads the ONNX file itself
(`Core.read_model`), external data included: the shared weights file's tensors are found
by the offset and length each initializer records (the same ones `SharedWeights` checks
against the manifest's index). An operation OpenVINO cannot convert (an ONNX Runtime contrib
op of the `com.microsoft` domain, say) is refused when the graph is opened, by name.
"""

import re
from pathlib import Path

import numpy as np

from seqexport.errors import ArtifactError, InputError, UsageError
from seqexport.runtime.checked_graph import CheckedGraph
from seqexport.runtime.threads import thread_count
from seqexport.specs import GraphSpec
from seqexport.state.arrays import NP_DTYPES, to_numpy

INSTALL = "pip install 'seqexport[openvino]'"
DEVICE = "CPU"
# OpenVINO's CPU plugin computes float32 graphs in bfloat16 by default on a CPU with
# AVX512_BF16 or AMX (this machine's default hint is bf16): validate judges the graph's own
# float32 arithmetic, so the hint says f32.
CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}

_core = None


def openvino_module():
    try:
        import openvino
    except ImportError:
        raise UsageError(f"runtime 'openvino' asked for, but OpenVINO is not installed ({INSTALL})") from None
    return openvino


def version() -> str:
    """OpenVINO's release, e.g. 2026.4.1 (its build suffix dropped)."""
    return openvino_module().__version__.split("-")[0]


def core():
    """One OpenVINO Core for the process (it holds the plugins)."""
    global _core
    if _core is None:
        _core = openvino_module().Core()
    return _core


def unconverted_ops(message: str) -> list[str]:
    """The operations OpenVINO's frontend lists in its conversion summary, e.g.
    '-- No conversion rule found for operations: com.microsoft.CausalConvWithState'."""
    ops = []
    for line in message.splitlines():
        m = re.match(r"\s*--\s*[^:]*operations?[^:]*:\s*(.+)", line)
        if m:
            ops += [op.strip() for op in m.group(1).split(",") if op.strip()]
    return ops


def compile_onnx(path: Path, label: str, threads: int | None = None):
    """An ONNX file compiled for OpenVINO's CPU; `label` (e.g. "graph 'step'") starts its errors.
    Any ONNX file, ours or another tool's: the runner of a foreign graph can use it too."""
    config = dict(CONFIG)
    threads = thread_count(threads)
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    try:
        return core().compile_model(core().read_model(str(path)), DEVICE, config)
    except Exception as e:  # OpenVINO raises RuntimeError for unreadable files and unconverted ops
        ops = unconverted_ops(str(e))
        if ops:
            raise ArtifactError(
                f"{label}: OpenVINO {version()} cannot run {Path(path).name}: no conversion for "
                f"{', '.join(ops)} ({'an ONNX Runtime-only op' if len(ops) == 1 else 'ONNX Runtime-only ops'}); "
                "validate it with --runtime onnxruntime") from None
        raise ArtifactError(f"{label}: OpenVINO cannot load {path}: {_first_line(e)}") from None


class OpenVINOGraph(CheckedGraph):
    """One exported graph compiled by OpenVINO. `run(feeds) -> dict of outputs`."""

    def __init__(self, path: Path, spec: GraphSpec, provider: str = "auto", threads: int | None = None,
                 shared=None):
        super().__init__(path, spec)
        if provider not in ("auto", "cpu"):
            raise UsageError(f"provider {provider!r} with runtime 'openvino': OpenVINO runs on its CPU "
                             "device here; expected auto or cpu")
        core()  # not installed: say so before anything else
        if shared is not None:
            shared.for_graph(self.path)  # the index checked as for ONNX Runtime (OpenVINO reads the file itself)
        self.compiled = compile_onnx(self.path, f"graph {spec.name!r}", threads)
        ports = {name: port for port in self.compiled.outputs for name in port.get_names()}
        missing = [n for n in spec.output_names if n not in ports]
        if missing:
            raise ArtifactError(f"graph {spec.name!r}: OpenVINO's compiled {self.path.name} has no outputs {missing}")
        self._outputs = [(n, ports[n], np.dtype(NP_DTYPES[t.dtype])) for n, t in zip(spec.output_names, spec.outputs)]
        self._request = self.compiled.create_infer_request()  # reused: a decode runs it step after step
        self.provider = DEVICE
        self.version = version()

    @property
    def device(self) -> str:
        return "cpu"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.check(feeds):  # e.g. OrtValues kept from an ONNX Runtime model
            feeds = {k: to_numpy(v) for k, v in feeds.items()}
        try:
            # share_outputs False (the default): each result is a copy, not the request's buffer
            # that the next run overwrites
            result = self._request.infer(feeds)
        except Exception as e:  # what the spec cannot express (e.g. a length past a fixed table)
            raise InputError(f"{self.spec.name}: OpenVINO rejected the inputs: {_first_line(e)}") from None
        return {name: result[port].astype(dtype, copy=False) for name, port, dtype in self._outputs}

    def run_bound(self, feeds: dict, keep: set[str]) -> dict:
        raise UsageError("io_binding is ONNX Runtime's; with runtime 'openvino' the state stays numpy arrays")


def _first_line(e: Exception) -> str:
    """OpenVINO's messages start with the C++ source location; the last line says what went wrong."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__
