"""What every exported model has at run time: its graphs, its state, and the step API's
common part. Each family's runtime model (`seqexport/families/<name>/runtime.py`) builds on
`RuntimeModel`; every graph I/O name comes from the specs stored in manifest.json.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seqexport.errors import ArtifactError, InputError
from seqexport.manifest import MANIFEST, graph_specs, read_manifest
from seqexport.runtime.session import NP_DTYPES, Graph, SharedWeights, shape_and_dtype, to_numpy
from seqexport.runtime.tokenizer import load_tokenizer
from seqexport.specs import GraphSpec


@dataclass
class State:
    """What the next step feeds: graph input name -> array, plus tokens consumed so far.

    On CPU the arrays are numpy arrays. With IO binding (the default on CUDA) the
    cache stays on the device as onnxruntime OrtValues between steps; `numpy()`
    gives a host copy.
    """

    arrays: dict[str, np.ndarray]
    length: int = 0
    # Appended state (seqexport.runtime.kv_buffer): the one-item list shared by every state
    # over the same buffers, naming the newest, the only one that may write into them in place.
    writer: list | None = field(default=None, repr=False, compare=False)
    # The engine's running batch of a recurrent model (seqexport.runtime.row_buffers): the
    # buffers these arrays are the first rows of.
    rows: object = field(default=None, repr=False, compare=False)

    @property
    def batch_size(self) -> int:
        return shape_and_dtype("state", next(iter(self.arrays.values())))[0][0]

    @property
    def nbytes(self) -> int:
        total = 0
        for k, v in self.arrays.items():
            shape, dtype = shape_and_dtype(k, v)
            total += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return total

    def numpy(self) -> "State":
        return State({k: to_numpy(v) for k, v in self.arrays.items()}, self.length)

    def select(self, rows) -> "State":
        """The state of the given batch rows (in that order), e.g. to reorder beams."""
        rows = np.asarray(rows)
        return State({k: to_numpy(v)[rows] for k, v in self.arrays.items()}, self.length).owning()

    def owning(self) -> "State":
        """This state as the sole writer of its arrays (they are its own copies)."""
        self.writer = [self]
        return self

    @staticmethod
    def concat(states: list["State"]) -> "State":
        """One batch from several (e.g. Mamba prompts of different lengths prefilled apart)."""
        keys = states[0].arrays.keys()
        return State({k: np.concatenate([to_numpy(s.arrays[k]) for s in states]) for k in keys},
                     max(s.length for s in states)).owning()


def tokens_2d(tokens) -> tuple[np.ndarray, bool]:
    """(b,) or (b, t) tokens -> (b, t) and whether the caller gave one token per row."""
    try:
        a = np.asarray(tokens)
    except (ValueError, OverflowError, TypeError) as e:  # ragged rows, ids beyond int64
        raise InputError(f"tokens: expected a (batch,) or (batch, length) array of token ids: {e}") from None
    return (a[:, None], True) if a.ndim == 1 else (a, False)


def zero_state(spec: GraphSpec, batch: int, sizes: dict[str, int] | None = None,
               skip: set[str] | frozenset = frozenset()) -> dict[str, np.ndarray]:
    """Zeros for every state input of `spec` (a fresh sequence); `sizes` gives symbolic dims
    other than batch (e.g. past_len 0); inputs named in `skip` are left out."""
    sizes = {"batch": batch, **(sizes or {})}
    shapes = {t.name: (tuple(sizes[d] if isinstance(d, str) else d for d in t.dims), NP_DTYPES[t.dtype])
              for t in spec.state_inputs if t.name not in skip}
    need = sum(int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize for shape, dtype in shapes.values())
    if need > physical_memory():
        raise InputError(f"batch_size {batch}: its state needs {need / 2**30:.3g} GiB; "
                         f"this machine has {physical_memory() / 2**30:.3g} GiB of memory")
    return {name: np.zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}


def physical_memory() -> int:
    """Bytes of RAM (a bound no state may pass; POSIX, else unbounded)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**62


class RuntimeModel:
    """Common part: manifest, graphs, tokenizer, provider, feeding outputs back as state.

    A family's model adds `vocab_size`, `start(...)`, `step(tokens, state)` and
    `begin(prompts)` (what generation calls first; see `seqexport.runtime.generate`).
    """

    family = ""  # the registry name, set by each family's model
    supports_beams = False  # beam search needs rows that can be reordered mid-decode
    max_new_tokens_limit: int | None = None  # the most tokens one decode can make (a positional table)

    def __init__(self, folder: str | Path, provider: str = "auto", verify: bool = True, threads: int | None = None,
                 io_binding: bool | None = None, manifest: dict | None = None):
        self.folder = Path(folder)
        self.manifest = manifest if manifest is not None else read_manifest(self.folder, verify=verify)
        self.config = self.manifest["config"]
        self.specs = graph_specs(self.manifest)
        # One copy of the weights in memory for all graphs (exports with a shared weights file).
        weights = self.manifest.get("weights")
        self.shared_weights = SharedWeights(self.folder, weights) if weights else None
        if self.shared_weights:
            self.shared_weights.index(self.folder / g["file"] for g in self.manifest["graphs"].values())
        self.graphs = {name: Graph(self.folder / self.manifest["graphs"][name]["file"], spec, provider, threads,
                                   self.shared_weights)
                       for name, spec in self.specs.items()}
        self.provider = next(iter(self.graphs.values())).provider
        self._keep = {g: {out for out, _ in spec.feeds} for g, spec in self.specs.items()}
        # Keep the cache on the device between steps where there is one (no host round trip).
        self.io_binding = self.provider == "CUDAExecutionProvider" if io_binding is None else io_binding
        record = self.manifest.get("tokenizer")
        try:
            self.tokenizer = load_tokenizer(record, self.folder)
        except ArtifactError as e:
            raise ArtifactError(f"{self.folder / MANIFEST}: field 'tokenizer': {e}") from None

    # serving: rows join and leave (engine). Defaults for families whose rows are independent
    # along the batch (Mamba, RWKV); a family whose rows need padding or per-row lengths
    # overrides join/take, or sets continuous_batching False (then the engine admits new
    # requests only when the running batch is empty).
    continuous_batching = True
    # Whether `begin_rows` runs a graph (a transformer's encoder): then the engine's starter
    # thread runs it beside the batched step; otherwise (a zero recurrent state) the starter
    # runs `begin` instead, the prompt's whole prefill.
    begin_rows_runs_a_graph = False

    def join(self, states: list[State]) -> State:
        """The rows of several states as one batch, in order."""
        return State.concat(states)

    def take(self, state: State, rows) -> State:
        """The state of these rows, in this order (finished requests leave)."""
        return state.select(rows)

    # The engine's variants consume the running batch's state (it holds no other reference):
    # rows move within its arrays instead of the whole batch being copied.

    def extend(self, state: State, newcomers: list[State]) -> State:
        """`state`'s rows, then the newcomers' (join); `state` must not be used again."""
        return self.join([state, *newcomers])

    def retain(self, state: State, rows: list[int]) -> State:
        """`take(state, rows)`, moving only the rows that change place when `rows` fills the
        holes left by leavers from the tail (`swap_remove_order`); `state` must not be used again."""
        moved = retain_rows(state.arrays, rows)
        if moved is None:
            return self.take(state, rows)
        return State(moved, state.length).owning()

    def _run(self, graph: str, feeds: dict) -> dict:
        g = self.graphs[graph]
        if not self.io_binding:
            return g.run(feeds)
        return g.run_bound(feeds, keep=self._keep[graph])

    def _fed(self, graph: str, outputs: dict) -> dict:
        """The state inputs a run of `graph` produced: output -> its declared state input."""
        return {inp: outputs[out] for out, inp in self.specs[graph].feeds}

    def _feed_back(self, graph: str, outputs: dict, arrays: dict) -> dict:
        """Next step's arrays: the old ones with every fed state input replaced."""
        return arrays | self._fed(graph, outputs)


def swap_remove_order(n: int, leaving) -> list[int]:
    """The rows that stay out of n, in their new order: each leaver's place below the new
    size is taken by a survivor from the tail, so at most one row moves per leaver."""
    gone = set(leaving)
    size = n - len(gone)
    tail = [i for i in range(size, n) if i not in gone]
    return [tail.pop() if i in gone else i for i in range(size)]


def retain_rows(arrays: dict, rows: list[int]) -> dict | None:
    """Row i of each (b, ...) array becomes old row rows[i], moved in place: the first
    len(rows) rows as views (contiguous: the batch axis leads). None when that cannot be done
    in place (a row taken from below the new size elsewhere, or arrays that are not numpy)."""
    size = len(rows)
    moves = [(i, r) for i, r in enumerate(rows) if r != i]
    if any(r < size for _, r in moves) or any(type(a) is not np.ndarray for a in arrays.values()):
        return None  # a source inside the kept prefix could be overwritten before it is read
    for a in arrays.values():
        for i, r in moves:
            move_row(a, i, r)
    return {k: a[:size] for k, a in arrays.items()}


def copy_rows(a: np.ndarray, at: int, src: np.ndarray) -> None:
    """a[at : at + len(src)] = src, one memcpy holding the GIL (see move_row); a and src
    C-contiguous, of one dtype."""
    if not (a.flags.c_contiguous and src.flags.c_contiguous and a.dtype == src.dtype and a.shape[1:] == src.shape[1:]):
        a[at : at + len(src)] = src  # numpy checks (and raises on) what does not fit
    elif src.size:
        start = at * a[0].nbytes
        memoryview(a).cast("B")[start : start + src.nbytes] = memoryview(src).cast("B")


def move_row(a: np.ndarray, i: int, r: int) -> None:
    """a[i] = a[r], holding the GIL. numpy lets the GIL go while it copies more than a few
    hundred elements, and the engine thread then waits for whichever thread took it (a client,
    the starter) to let it go again: a leaver's row moves took 0.6 ms of wall time for 0.1 ms
    of copying (transformer-dates, 16 clients). A memoryview copy is one memcpy under the GIL.
    An array that is not C-contiguous is copied by numpy."""
    if a.flags.c_contiguous and a.size:
        n = a[0].nbytes
        view = memoryview(a).cast("B")
        view[i * n : (i + 1) * n] = view[r * n : (r + 1) * n]
    else:
        a[i] = a[r]
