"""The seam between a foreign artifact and the checks: a ModelMap says, in data, which graph does
what and what each of its inputs and outputs holds.

How an adapter plugs in: write `seqexport/foreign/adapters/<name>.py` with a class that has
`name`, `detect(folder) -> bool` (cheap: file names, at most the graphs' IO names) and
`map(folder) -> ModelMap`, and add one line to `adapters.ADAPTERS` (checked in that order;
the first whose detect is true is chosen). The checks never ask which tool made the folder.

    class Genai:
        name = "genai"
        def detect(self, folder): return (folder / "genai_config.json").is_file()
        def map(self, folder): return ModelMap("genai", "decoder", step=GraphMap(...))

Roles
- graph inputs (`GraphMap.inputs`, role -> name): input_ids, attention_mask (decoder-only:
  [b, past + n]; an encoder: [b, src]), position_ids [b, n], encoder_attention_mask [b, src],
  encoder_hidden_states, use_cache_branch (a merged decoder's If: true once there is a past).
- graph outputs (`GraphMap.outputs`): logits [b, n, vocab]; an encoder's encoder_hidden_states.
- state (`StateRole`): one past input and the present output that feeds it next call, per layer,
  with its part (key, value, cross_key, cross_value, conv, ssm), its kind and its layout.

Kinds (DESIGN.md, "State kinds"): appended — KV along a past axis, the present returning past +
new positions (`present="whole"`); replaced — a recurrent tensor returned whole each call;
static — cross-attention K/V computed by the first call and only read afterwards (a graph
without that output keeps the value fed).

Layouts (`LAYOUTS`): how the artifact's tensor differs from the reference's (transformers' cache)
— "" the same; "ssm_transposed" the last two axes swapped; "conv_window" the conv state keeps the
last w positions, w = k - 1 or k (compared on those positions).

Everything here is plain data and numpy: no torch, no onnxruntime.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from seqexport.errors import ArtifactError

ARCHITECTURES = ("decoder", "encoder-decoder")
INPUT_ROLES = ("input_ids", "attention_mask", "position_ids", "encoder_attention_mask",
               "encoder_hidden_states", "use_cache_branch")
OUTPUT_ROLES = ("logits", "encoder_hidden_states")
PARTS = ("key", "value", "cross_key", "cross_value", "conv", "ssm")
KINDS = ("appended", "replaced", "static")


def _same(got: np.ndarray, ref: np.ndarray):
    return got, ref


def _ssm_transposed(got: np.ndarray, ref: np.ndarray):
    return np.swapaxes(got, -1, -2), ref  # e.g. [b, H, d_state, head_dim] -> [b, H, head_dim, d_state]


def _conv_window(got: np.ndarray, ref: np.ndarray):
    w = got.shape[-1]  # the positions the artifact keeps (k - 1 or k); the reference keeps k
    return got, ref[..., ref.shape[-1] - w:] if w <= ref.shape[-1] else ref


# layout -> (artifact tensor, reference tensor) -> the two as compared
LAYOUTS = {"": _same, "ssm_transposed": _ssm_transposed, "conv_window": _conv_window}


@dataclass(frozen=True)
class StateRole:
    layer: int
    part: str  # one of PARTS
    input: str  # the past input of the graph
    output: str  # the present output that feeds it at the next call
    kind: str  # one of KINDS
    layout: str = ""  # a key of LAYOUTS
    past_axis: int = 2  # appended: the axis along which positions accumulate

    def __post_init__(self):
        for what, value, allowed in (("part", self.part, PARTS), ("kind", self.kind, KINDS),
                                     ("layout", self.layout, tuple(LAYOUTS))):
            if value not in allowed:
                raise ArtifactError(f"state {self.input!r}: {what} {value!r}; expected one of {list(allowed)}")

    def as_compared(self, got: np.ndarray, ref: np.ndarray):
        return LAYOUTS[self.layout](got, ref)


@dataclass(frozen=True)
class GraphMap:
    file: str  # relative to the folder
    inputs: dict = field(default_factory=dict)  # role -> input name
    outputs: dict = field(default_factory=dict)  # role -> output name
    state: tuple[StateRole, ...] = ()
    max_tokens: int | None = None  # tokens per call the graph takes (None: any number)
    dims: dict = field(default_factory=dict)  # symbolic axis -> size of a fresh past (e.g. genai's kv_cache_dim)
    chunk_rows: int | None = None  # rows a call of several tokens after a past takes (None: any); more go row by row

    def __post_init__(self):
        for role in self.inputs:
            if role not in INPUT_ROLES:
                raise ArtifactError(f"{self.file}: input role {role!r}; expected one of {list(INPUT_ROLES)}")
        for role in self.outputs:
            if role not in OUTPUT_ROLES:
                raise ArtifactError(f"{self.file}: output role {role!r}; expected one of {list(OUTPUT_ROLES)}")

    def describe(self) -> list[str]:
        lines = [f"{self.file}" + (f" (at most {self.max_tokens} token a call)" if self.max_tokens else "")
                 + (f" (several tokens after a past: {self.chunk_rows} row a call)" if self.chunk_rows else "")]
        lines += [f"  in  {role:24} {name}" for role, name in self.inputs.items()]
        lines += [f"  out {role:24} {name}" for role, name in self.outputs.items()]
        for s in self.state:
            lines.append(f"  state layer {s.layer} {s.part:11} {s.input} <- {s.output} "
                         f"({s.kind}{', ' + s.layout if s.layout else ''})")
        return lines


@dataclass(frozen=True)
class ModelMap:
    adapter: str
    architecture: str  # one of ARCHITECTURES
    step: GraphMap  # the decoder graph that takes a past (or the only one)
    first: GraphMap | None = None  # a decoder graph for the first call (no past inputs), if any
    encoder: GraphMap | None = None
    note: str = ""

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ArtifactError(f"architecture {self.architecture!r}; expected one of {list(ARCHITECTURES)}")
        if (self.architecture == "encoder-decoder") != (self.encoder is not None):
            raise ArtifactError(f"{self.adapter}: an encoder graph goes with architecture 'encoder-decoder' only")

    @property
    def graphs(self) -> tuple[GraphMap, ...]:
        return tuple(g for g in (self.encoder, self.first, self.step) if g is not None)

    def with_step(self, **changes) -> "ModelMap":
        return replace(self, step=replace(self.step, **changes))

    def describe(self) -> str:
        lines = [f"adapter {self.adapter} ({self.architecture})" + (f": {self.note}" if self.note else "")]
        for g in self.graphs:
            lines += g.describe()
        return "\n".join(lines)

    def to_dict(self) -> dict:
        def graph(g):
            return {"file": g.file, "inputs": g.inputs, "outputs": g.outputs, "max_tokens": g.max_tokens,
                    "dims": g.dims, "chunk_rows": g.chunk_rows, "state": [vars(s) for s in g.state]}
        return {"adapter": self.adapter, "architecture": self.architecture, "note": self.note,
                "graphs": {k: graph(g) for k, g in (("encoder", self.encoder), ("first", self.first),
                                                     ("step", self.step)) if g is not None}}


class Adapter:
    """What an adapter provides (a class with these members; subclassing is optional)."""

    name = ""

    def detect(self, folder: Path) -> bool:
        raise NotImplementedError

    def map(self, folder: Path) -> ModelMap:
        raise NotImplementedError


def check_names(folder: Path, model: ModelMap, error=ArtifactError) -> None:
    """Every name the map gives is an input or output of its graph, and every graph input has a
    role or is state (one message per map: the first name wrong, with what the graph has)."""
    from seqexport.foreign import onnx_io

    states = {s.input for g in model.graphs for s in g.state}
    for g in model.graphs:
        io = onnx_io.read(Path(folder) / g.file)
        wanted = [("input", role, n, io.inputs) for role, n in g.inputs.items()]
        wanted += [("output", role, n, io.outputs) for role, n in g.outputs.items()]
        for s in g.state:
            wanted += [("input", f"state {s.part} of layer {s.layer}", s.input, io.inputs)]
        for what, role, name, have in wanted:
            if name not in have:
                raise error(f"{g.file}: {what} {name!r} ({role}) is not in the graph; its {what}s are {list(have)}")
        for s in g.state:
            _check_feedback(g, s, io, g is model.step, error)
        loose = [n for n in io.inputs if n not in states and n not in g.inputs.values()]
        if loose:
            raise error(f"{g.file}: input {loose[0]!r} has no role in the {model.adapter} map (neither "
                        f"{list(INPUT_ROLES)} nor state); name it in an --io-map file")


def _check_feedback(g: GraphMap, s: StateRole, io, is_step: bool, error) -> None:
    """The output that feeds a state input at the next call exists (the step graph must return
    every state but static K/V, which it may only read) and has the input's dtype and rank, and
    its fixed sizes on the axes that do not grow: caught when the map is read, not by ONNX Runtime
    mid-decode, nor cast silently."""
    where = f"{g.file}: state {s.part} of layer {s.layer}"
    if s.output not in io.outputs:
        if is_step and s.kind != "static":
            raise error(f"{where}: output {s.output!r}, which feeds {s.input!r} next call, is not in the graph; "
                        f"its outputs are {list(io.outputs)}")
        return
    out, inp = io.outputs[s.output], io.inputs[s.input]
    grows = s.past_axis % len(inp.dims) if s.kind == "appended" and inp.dims else None
    differ = out.dtype != inp.dtype or len(out.dims) != len(inp.dims) or any(
        a != b for axis, (a, b) in enumerate(zip(out.dims, inp.dims))
        if axis != grows and isinstance(a, int) and isinstance(b, int))
    if differ:
        raise error(f"{where}: output {s.output!r} ({out.dtype} {list(out.dims)}) cannot feed input {s.input!r} "
                    f"({inp.dtype} {list(inp.dims)}): expected the input's dtype and shape")
