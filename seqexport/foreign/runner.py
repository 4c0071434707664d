"""Runs a foreign graph: `open_graph(path, runtime) -> runner` with `inputs`/`outputs` (the
graph's declared tensors, `onnx_io.Tensor`) and `run(feeds) -> {output name: array}`.

A runtime is one entry of RUNNERS: a callable (path, provider, threads) -> runner. ONNX Runtime
is here; another (e.g. OpenVINO, where `seqexport.runtime.session` provides one) is one more
entry. numpy + the runtime only: no torch.
"""

from pathlib import Path

import numpy as np

from seqexport.errors import ArtifactError, InputError, UsageError
from seqexport.foreign import onnx_io


class OrtRunner:
    """One ONNX Runtime session over a foreign graph, the threads and provider as ours use."""

    def __init__(self, path: Path, provider: str = "auto", threads: int | None = None):
        import onnxruntime as ort

        from seqexport.runtime.session import providers_for, session_options

        self.path = Path(path)
        io = onnx_io.read(self.path)
        self.inputs, self.outputs, self.quant_bits = io.inputs, io.outputs, io.quant_bits
        try:
            self.session = ort.InferenceSession(str(self.path), session_options(threads),
                                                providers=providers_for(provider))
        except UsageError:
            raise
        except Exception as e:  # ORT's own types for a graph it cannot load
            raise ArtifactError(f"ONNX Runtime cannot load {self.path}: {_first_line(e)}") from None
        self.provider = self.session.get_providers()[0]

    def run(self, feeds: dict) -> dict:
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise InputError(f"{self.path.name}: no value for inputs {missing}")
        try:
            outs = self.session.run(list(self.outputs), {n: feeds[n] for n in self.inputs})
        except Exception as e:
            raise InputError(f"{self.path.name}: ONNX Runtime rejected the inputs: {_first_line(e)}") from None
        return dict(zip(self.outputs, outs))


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class OpenVinoRunner:
    """A foreign graph compiled by OpenVINO for its CPU (`runtime.runners.openvino.compile_onnx`,
    float32 precision hint), fed and read as OrtRunner."""

    def __init__(self, path: Path, provider: str = "auto", threads: int | None = None):
        from seqexport.runtime.runners.openvino import DEVICE, compile_onnx

        if provider not in ("auto", "cpu"):
            raise UsageError(f"provider {provider!r} with runtime 'openvino': expected auto or cpu")
        self.path = Path(path)
        io = onnx_io.read(self.path)
        self.inputs, self.outputs, self.quant_bits = io.inputs, io.outputs, io.quant_bits
        self.compiled = compile_onnx(self.path, f"graph {self.path.name}", threads)
        ports = {name: port for port in self.compiled.outputs for name in port.get_names()}
        missing = [n for n in self.outputs if n not in ports]
        if missing:
            raise ArtifactError(f"OpenVINO's compiled {self.path.name} has no outputs {missing}")
        self._ports = [(n, ports[n]) for n in self.outputs]
        self._request = self.compiled.create_infer_request()
        self.provider = DEVICE

    def run(self, feeds: dict) -> dict:
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise InputError(f"{self.path.name}: no value for inputs {missing}")
        try:
            result = self._request.infer({n: feeds[n] for n in self.inputs})
        except Exception as e:  # OpenVINO's RuntimeError for shapes or values it refuses
            raise InputError(f"{self.path.name}: OpenVINO rejected the inputs: {str(e).strip().splitlines()[-1]}") \
                from None
        return {n: np.asarray(result[port]) for n, port in self._ports}


RUNNERS = {"onnxruntime": OrtRunner, "openvino": OpenVinoRunner}


def open_graph(path: Path, runtime: str = "onnxruntime", provider: str = "auto", threads: int | None = None):
    if runtime not in RUNNERS:
        raise UsageError(f"unknown runtime {runtime!r}; expected one of {sorted(RUNNERS)}")
    return RUNNERS[runtime](path, provider, threads)


def zeros_for(tensor: onnx_io.Tensor, batch: int, dims: dict | None = None) -> np.ndarray:
    """A fresh value for an input nobody fed yet (an empty past): axis 0 the batch, every other
    symbolic axis its size in `dims` (the map's), else 0 (no past positions), fixed axes as declared."""
    sizes = dims or {}
    shape = [batch if i == 0 else (d if isinstance(d, int) else sizes.get(d, 0)) for i, d in enumerate(tensor.dims)]
    return np.zeros(shape, np.dtype(tensor.dtype))
