"""ONNX Runtime sessions for exported graphs, with every input checked against its spec.

numpy + onnxruntime only. `Graph.run` refuses, before ORT sees them, inputs of the
wrong rank, shape or dtype, and symbolic dims that disagree between inputs
(e.g. a batch of 2 tokens with a state of batch 3): `checked_graph.CheckedGraph`, shared
with the other runtimes' runners (`seqexport.runtime.runners`).
"""

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from seqexport.errors import ArtifactError, InputError, UsageError
from seqexport.runtime.checked_graph import CheckedGraph
from seqexport.runtime.threads import thread_count
from seqexport.specs import GraphSpec
from seqexport.state.arrays import NP_DTYPES, ORT_TYPES, shape_and_dtype, to_numpy  # noqa: F401 (re-exported)

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

log = logging.getLogger(__name__)


def cuda_usable() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers()


def providers_for(provider: str) -> list[str]:
    """ORT provider list for auto|cpu|cuda; auto takes CUDA only when ORT offers it."""
    if provider not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown provider {provider!r}; expected auto, cpu or cuda")
    if provider == "cuda" and not cuda_usable():
        raise UsageError(
            "provider 'cuda' asked for, but this onnxruntime offers only "
            f"{ort.get_available_providers()} (install the gpu extra: onnxruntime-gpu)"
        )
    if provider == "cuda" or (provider == "auto" and cuda_usable()):
        return [PROVIDERS["cuda"], PROVIDERS["cpu"]]
    return [PROVIDERS["cpu"]]


# A graph packs the weights it shares with other graphs when they are this small: each session
# then holds its own packed copy (a few MB for the bundled models) and runs faster (bundled
# mamba-dates step at batch 16, one thread: 3.15 -> 2.65 ms). Larger models read the mapped
# pages, which keeps them in memory once (Mamba 130m: 517 MB of weights).
PACK_SHARED_BYTES = 64 << 20
# A one-token graph (a step: its tokens input is (batch, 1)) packs the weights it shares up to
# this many bytes: each MatMul there is a matrix-vector product, which unpacked weights make
# ORT re-pack on every call, and the step is what generation repeats. The packed copy is its
# own (anonymous memory, as much again as the weights); the other graphs (a prefill, whose
# GEMMs over many tokens pack cheaply per call) read the mapped pages. Mamba-2 of the 130m
# shape, 2 threads, 2026-12-02: step 51.6 -> 43.2 ms with it (516 MB packed); a model past
# 2 GiB keeps one copy.
PACK_STEP_BYTES = 2 << 30


class SharedWeights:
    """An export's one weights file (manifest "weights"), mapped once, one OrtValue per tensor.

    Every session of the model gets the same OrtValues (`SessionOptions.add_initializer`), so
    the weights sit in memory once, as pages of the file (read when first touched), instead of
    one copy per graph. The memory map stays open as long as this object lives.
    """

    def __init__(self, folder: Path, record: dict):
        self.record = record
        path = Path(folder) / record["file"]
        try:
            self.data = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise ArtifactError(f"shared weights {path}: cannot map the file: {e}") from None
        self.values = {}
        self._graphs: dict[str, dict] = {}  # graph file -> the tensors it reads (for_graph)
        self._packed: dict[str, set[str]] = {}  # graph file -> its MatMul/Gemm weights
        self._nbits: dict[str, bool] = {}  # graph file -> whether it has MatMulNBits (int4) nodes
        for name, t in record["tensors"].items():
            a = self.data[t["offset"]: t["offset"] + t["length"]].view(np.dtype(t["dtype"])).reshape(t["dims"])
            self.values[name] = ort.OrtValue.ortvalue_from_numpy(a)  # no copy: ORT reads the mapped pages

    @property
    def nbytes(self) -> int:
        return int(self.data.size)

    def index(self, paths) -> None:
        """Read which tensors each graph of the model takes, before any session is made
        (`prepack` weighs a graph's tensors against the other graphs')."""
        for path in paths:
            try:
                self.for_graph(path)
            except Exception:  # noqa: BLE001 - an unreadable graph: its Graph says so, in its words
                pass

    def prepack(self, path: Path, one_token: bool = False) -> bool:
        """Whether this graph's session may prepack its weights. Prepacking copies each MatMul
        weight into the kernel's layout: faster (base transformer decoder step 9.0 -> 6.2 ms
        here) and, for a weight no other graph reads, the only copy the session works from
        (the mapped pages are clean, the OS may drop them). A weight two graphs read (Mamba's
        prefill and step) would be packed twice: then the sessions read the shared pages
        (Mamba 130m: 0.26 GB RSS after load instead of 1.6 GB). int8 weights are packed always:
        ORT's int8 MatMul reads unpacked ones at a fraction of its speed, and a packed int8 copy
        is a quarter of a float32 one. So are the int4 weights of a MatMulNBits graph: unpacked,
        its kernel dequantises every call (Mamba 130m int4 step 1050 ms, packed 104 ms). A
        one-token graph (`one_token`: a step) packs up to PACK_STEP_BYTES: see there."""
        mine = self.for_graph(path)
        if self._nbits[str(path)] or any(v.data_type() == "tensor(int8)" for v in mine.values()):
            return True
        packed = self._packed[str(path)] & mine.keys()
        size = sum(self.record["tensors"][n]["length"] for n in packed)
        if size <= PACK_SHARED_BYTES or (one_token and size <= PACK_STEP_BYTES):
            return True  # a small model (a packed copy per graph costs little memory), or a step
        others = {n for p, names in self._graphs.items() if p != str(path) for n in names}
        return not (packed & others)  # e.g. a positional table both read: no matter

    def for_graph(self, path: Path) -> dict:
        """The tensors this graph file reads from the shared file, checked against the index.

        Read from the graph itself: ORT lets an added initializer replace one the graph holds
        inline, so a session gets exactly the ones its graph stores in this file."""
        if str(path) in self._graphs:
            return self._graphs[str(path)]
        import onnx  # the graph's own record (its large initializers are stubs: a quick read)

        model = onnx.load_model(str(path), load_external_data=False)
        # the weights ORT would pack: the B operand of a MatMul or Gemm (a table one gathers from is not)
        self._packed[str(path)] = {n.input[1] for n in model.graph.node if n.op_type in ("MatMul", "Gemm")}
        self._nbits[str(path)] = any(n.op_type == "MatMulNBits" for n in model.graph.node)
        out = {}
        for t in model.graph.initializer:
            info = {e.key: e.value for e in t.external_data}
            if t.data_location != onnx.TensorProto.EXTERNAL or info.get("location") != self.record["file"]:
                continue
            entry = self.record["tensors"].get(t.name)
            if entry is None or (int(info.get("offset", 0)), int(info.get("length", -1))) != \
                    (entry["offset"], entry["length"]):
                raise ArtifactError(f"graph {path.name}: initializer {t.name!r} is not where the manifest's weights "
                                    f"index puts it in {self.record['file']}")
            # the index gives the OrtValue its shape: one that differs would reach the graph's kernels
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).name
            if (list(t.dims), dtype) != (list(entry["dims"]), entry["dtype"]):
                raise ArtifactError(f"graph {path.name}: initializer {t.name!r} is {dtype} {list(t.dims)}, the "
                                    f"manifest's weights index says {entry['dtype']} {entry['dims']}")
            out[t.name] = self.values[t.name]
        self._graphs[str(path)] = out
        return out


def session_options(threads: int | None = None, shared: dict | None = None,
                    prepack: bool = True) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Memory patterns are planned per input shape; a decode changes past_len every step, so
    # ORT would re-plan each time (measured: a 33-step tiny decode took 2x as long with them).
    opts.enable_mem_pattern = False
    threads = thread_count(threads)
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # ORT's own warnings go to stderr otherwise
    if shared:  # name -> OrtValue over the shared weights file (see SharedWeights.for_graph)
        for name, value in shared.items():
            opts.add_initializer(name, value)
        if not prepack:  # weights another graph's session also reads (SharedWeights.prepack)
            opts.add_session_config_entry("session.disable_prepacking", "1")
    return opts


def _check_io_matches(spec: GraphSpec, path: Path, session) -> None:
    """The manifest's inputs and outputs are the graph file's, by name, dtype and rank: a manifest
    edited by hand (it is not hashed) would otherwise fail deep inside a step (an output not
    fetched) or feed a graph what it does not take. ArtifactError naming the first difference."""
    for kind, listed, real in (("inputs", spec.inputs, session.get_inputs()),
                               ("outputs", spec.outputs, session.get_outputs())):
        want = {t.name: f"{t.dtype}, rank {len(t.dims)}" for t in listed}
        have = {t.name: f"{ORT_TYPES.get(t.type, t.type)}, rank {len(t.shape)}" for t in real}
        if want != have:
            diff = sorted(set(want) ^ set(have)) or sorted(n for n in want if want[n] != have[n])
            n = diff[0]
            raise ArtifactError(f"graph {spec.name!r}: the manifest's {kind} differ from {path.name}'s at {n!r} "
                                f"(manifest: {want.get(n, 'absent')}; graph: {have.get(n, 'absent')})")


def one_token(spec: GraphSpec) -> bool:
    """Whether a graph takes one token per row (its tokens input is (batch, 1)): a step."""
    return any(t.role == "tokens" and t.dims[-1:] == (1,) for t in spec.inputs)


class Graph(CheckedGraph):
    """One exported graph: its spec and an InferenceSession. `run(feeds) -> dict of outputs`.

    ONNX Runtime's runner (`runners.RUNTIMES`); the input checks are `CheckedGraph`'s."""

    def __init__(self, path: Path, spec: GraphSpec, provider: str = "auto", threads: int | None = None,
                 shared: SharedWeights | None = None):
        super().__init__(path, spec)
        providers = providers_for(provider)
        threads = thread_count(threads)  # a bad value is the caller's, not the graph's
        try:
            weights = shared.for_graph(self.path) if shared is not None else None
            prepack = shared.prepack(self.path, one_token(spec)) if shared is not None else True
            self.session = ort.InferenceSession(str(path), session_options(threads, weights, prepack),
                                                providers=providers)
        except ArtifactError:  # the shared weights' index disagrees with the graph: said in its words
            raise
        except Exception as e:  # ORT raises its own types for unreadable or invalid models
            raise ArtifactError(f"graph {spec.name!r}: ONNX Runtime cannot load {path}: {_first_line(e)}") from None
        _check_io_matches(spec, path, self.session)
        # ORT may fall back silently (e.g. missing CUDA libraries): say what really runs.
        self.provider = self.session.get_providers()[0]
        if provider == "cuda" and self.provider != PROVIDERS["cuda"]:
            raise UsageError(f"provider 'cuda' asked for, but ORT fell back to {self.provider} for {self.path.name}")
        self._outputs = list(spec.output_names)  # named to ORT: it would build this list every run
        # ORT's own run() re-checks the input names (a list search per input: ~10 us a tiny
        # decoder step) and OrtValue devices; feeds of plain numpy arrays that passed check()
        # on the CPU provider (no provider fallback to retry) go to the session directly.
        direct = getattr(self.session, "_sess", None) if self.provider == PROVIDERS["cpu"] else None
        self._direct = direct.run if direct is not None and hasattr(direct, "run") else None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        plain = self.check(feeds)
        try:
            if plain and self._direct is not None:
                outs = self._direct(self._outputs, feeds, None)
            else:
                outs = self.session.run(self._outputs, feeds)
        except Exception as e:  # what the spec cannot express (e.g. a length past a fixed table)
            raise self._rejected(e) from None
        return dict(zip(self._outputs, outs))

    def run_bound(self, feeds: dict, keep: set[str]) -> dict:
        """Run through IO binding: outputs named in `keep` stay where ORT made them (on the GPU
        with CUDA) as OrtValues, to be bound as the next step's inputs without a host round
        trip; the others come back as numpy arrays. Inputs may be numpy arrays or OrtValues."""
        self.check(feeds)
        binding = self.session.io_binding()
        for name, v in feeds.items():
            if isinstance(v, ort.OrtValue):
                binding.bind_ortvalue_input(name, v)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(v))
        for name in self.spec.output_names:
            binding.bind_output(name, self.device if name in keep else "cpu")
        try:
            self.session.run_with_iobinding(binding)
        except Exception as e:
            raise self._rejected(e) from None
        outs = binding.get_outputs()
        return {name: (v if name in keep else v.numpy()) for name, v in zip(self.spec.output_names, outs)}

    @property
    def device(self) -> str:
        return "cuda" if self.provider == PROVIDERS["cuda"] else "cpu"

    def _rejected(self, e: Exception) -> InputError:
        return InputError(f"{self.spec.name}: ONNX Runtime rejected the inputs: {_first_line(e)}")


def _first_line(e: Exception) -> str:
    """ORT's messages run to many lines; the first one says what went wrong."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_token_ids(name: str, ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """2-D int64 token ids, non-empty, each in [0, vocab_size)."""
    if type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 2 and ids.size:
        # the decode loop's case: a few ids read as Python ints (quicker than two numpy
        # reductions), many in two reductions; anything else is explained below
        if ids.size <= 64:
            values = ids.ravel().tolist()
            if min(values) >= 0 and max(values) < vocab_size:
                return ids
        elif ids.min() >= 0 and ids.max() < vocab_size:
            return ids
    try:
        ids = np.asarray(ids)
    except (ValueError, OverflowError, TypeError) as e:  # ragged rows, ids beyond int64
        raise InputError(f"{name}: expected a (batch, length) array of token ids: {e}") from None
    if ids.dtype.kind not in "iu":
        raise InputError(f"{name}: token ids must be integers, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise InputError(f"{name}: expected shape (batch, length), got {ids.shape}")
    if ids.size == 0:
        raise InputError(f"{name}: empty input of shape {ids.shape}; expected at least one token per row")
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise InputError(f"{name}: token id {int(ids[r, c])} at [{r}, {c}] is outside [0, {vocab_size})")
    return ids.astype(np.int64, copy=False)
