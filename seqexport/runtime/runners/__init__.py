"""The runtimes that run an export's graphs: name -> a runner class over one graph.

A runner takes (path, spec, provider, threads, shared weights), checks feeds against the spec
(`seqexport.runtime.checked_graph.CheckedGraph`) and has `run(feeds) -> {output name: numpy array}`, `provider` (what
really runs, for reports) and `device`. ONNX Runtime's is `session.Graph`; OpenVINO's
(`openvino`, an optional extra) compiles the same ONNX files. Another runtime (e.g.
onnxruntime-node) is one more module and one more entry here.
"""

from pathlib import Path

from seqexport.errors import UsageError
from seqexport.specs import GraphSpec

RUNTIMES = ("onnxruntime", "openvino")  # the first is the default


def runner_class(runtime: str):
    """The runner of `runtime`, imported on demand (an optional runtime need not be installed)."""
    if runtime == "onnxruntime":
        from seqexport.runtime.session import Graph

        return Graph
    if runtime == "openvino":
        from seqexport.runtime.runners.openvino import OpenVINOGraph

        return OpenVINOGraph
    raise UsageError(f"unknown runtime {runtime!r}; expected one of {', '.join(RUNTIMES)}")


def open_graph(runtime: str, path: Path, spec: GraphSpec, provider: str = "auto", threads: int | None = None,
               shared=None):
    """One graph of an export, ready to run on `runtime`."""
    return runner_class(runtime)(path, spec, provider, threads, shared)


def runtime_version(runtime: str) -> str:
    """The installed release of `runtime`, for reports."""
    if runtime == "openvino":
        from seqexport.runtime.runners.openvino import version

        return version()
    runner_class(runtime)  # an unknown name: its UsageError
    import onnxruntime

    return onnxruntime.__version__
