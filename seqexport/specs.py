"""One frozen spec per exported graph: inputs and outputs in order, dtype, dims, role,
and which outputs feed which state inputs at the next step (declared, never inferred).

Each family builds its graphs' specs in `seqexport/families/<name>/specs.py`; export,
the manifest, validation, benchmarks and the runtime all read them. A dim is an int
(fixed) or a str (symbolic, the name written into the ONNX graph). This module imports
neither torch nor numpy.
"""

from dataclasses import dataclass

DTYPES = ("int64", "float32", "float16")
# What an input holds, so that inputs can be built from the spec alone: token ids in
# [0, vocab_size), a 0/1 mask, state (cache) fed back from an output of a step, or per-row
# lengths: how many slots along past_len of each row's appended state are valid.
ROLES = ("tokens", "mask", "state", "lengths", "keep", "")
# keep: how many last positions get logits (0: all; e.g. 1 in generation), added to a graph by
# `seqexport.export.common.keep_last_positions`, which then outputs "kept_len" positions.
# Symbolic dims a graph may declare; anything else in a spec is a typo.
DIM_NAMES = ("kept_len", "batch", "src_len", "tgt_len", "past_len", "past_len + tgt_len", "seq_len")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    dims: tuple[int | str, ...]
    role: str = ""  # one of ROLES; "" for outputs and anything else
    vocab_size: int | None = None  # tokens: ids lie in [0, vocab_size)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: role {self.role!r} not in {ROLES}")
        if (self.role == "tokens") != (self.vocab_size is not None):
            raise ValueError(f"{self.name}: a tokens input needs vocab_size (and only a tokens input has one)")
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r} not in {DTYPES}")
        for d in self.dims:
            if isinstance(d, str) and d not in DIM_NAMES:
                raise ValueError(f"{self.name}: unknown dim name {d!r}; expected one of {DIM_NAMES}")

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.dims) if isinstance(d, str)}

    def to_dict(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "dims": list(self.dims)}
        if self.role:
            d["role"] = self.role
        if self.vocab_size is not None:
            d["vocab_size"] = self.vocab_size
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["dims"]), d.get("role", ""), d.get("vocab_size"))


@dataclass(frozen=True)
class GraphSpec:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # (output, state input): after a run, each output becomes that state input of the next
    # step (of this graph or another graph of the same model).
    feeds: tuple[tuple[str, str], ...] = ()
    # (output, state input): each output holds only the new positions, which the caller
    # writes into that state input (a preallocated buffer along past_len) at each row's
    # `lengths` input; the buffer is never copied whole (see seqexport.state.appended).
    appends: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        for out, _ in self.feeds + self.appends:
            self.output(out)  # KeyError for a typo
        for _, inp in self.appends:
            if self.input(inp).role != "state":
                raise ValueError(f"graph {self.name!r}: appended input {inp!r} has role {self.input(inp).role!r}, "
                                 "not 'state'")
        if self.appends and self.lengths is None:
            raise ValueError(f"graph {self.name!r}: appended state needs an input with role 'lengths'")
        if self.lengths is not None and not self.appends:  # its K/V would be read as another kind of state
            raise ValueError(f"graph {self.name!r}: input {self.lengths.name!r} counts the valid slots of appended "
                             "state, but the graph lists no appends")

    @property
    def lengths(self) -> TensorSpec | None:
        """The input giving each row's valid slots of the appended state, if any."""
        return next((t for t in self.inputs if t.role == "lengths"), None)

    @property
    def state_inputs(self) -> list[TensorSpec]:
        return [t for t in self.inputs if t.role == "state"]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def input(self, name: str) -> TensorSpec:
        return _find(self.inputs, name, self.name)

    def output(self, name: str) -> TensorSpec:
        return _find(self.outputs, name, self.name)

    def to_dict(self) -> dict:
        d = {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "feeds": [list(f) for f in self.feeds],
        }
        if self.appends:
            d["appends"] = [list(f) for f in self.appends]
        return d

    @classmethod
    def from_dict(cls, name: str, d: dict, legacy_vocab: int = 2) -> "GraphSpec":
        """`legacy_vocab`: a token bound valid for every tokens input, for a manifest that
        recorded neither roles nor feeds (seqexport 0.1.0)."""
        inputs = tuple(TensorSpec.from_dict(t) for t in d["inputs"])
        outputs = tuple(TensorSpec.from_dict(t) for t in d["outputs"])
        if "feeds" not in d:  # an artifact written before feeds and roles were recorded
            if "appends" in d or any(t.role for t in inputs):
                raise ValueError(f"graph {name!r} declares roles or appends but no feeds")
            return _legacy_spec(name, inputs, outputs, legacy_vocab)
        return cls(name, inputs, outputs, tuple(tuple(f) for f in d["feeds"]),
                   tuple(tuple(f) for f in d.get("appends", ())))


def _find(tensors, name, graph):
    for t in tensors:
        if t.name == name:
            return t
    raise KeyError(f"graph {graph!r} has no tensor {name!r}")




def _legacy_spec(name: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                 vocab: int) -> GraphSpec:
    """A spec read from a manifest of seqexport 0.1.0, which recorded neither roles nor feeds.

    Those artifacts followed one naming rule (present.X -> past_key_values.X, present_X ->
    past_X), the only place a name prefix is read; new manifests declare their feeds.
    """
    names = {t.name for t in inputs}
    feeds = []
    for t in outputs:
        if t.name.startswith("present."):
            feeds.append((t.name, "past_key_values." + t.name.removeprefix("present.")))
        elif t.name.startswith("present_"):
            feeds.append((t.name, "past_" + t.name.removeprefix("present_")))
    state = {i for _, i in feeds}
    roles = {"input_ids": "tokens", "attention_mask": "mask", "encoder_attention_mask": "mask"}
    fixed = tuple(
        TensorSpec(t.name, t.dtype, t.dims, "state" if t.name in state else roles.get(t.name, ""),
                   vocab if roles.get(t.name) == "tokens" else None)
        for t in inputs
    )
    # the encoder's cross K/V feed the decoder's state inputs, not its own
    return GraphSpec(name, fixed, outputs, tuple(f for f in feeds if f[1] in names or name == "encoder"))


# Names every family's step graphs share: the tokens fed and the logits returned.
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"  # (b, l) 1 = token, 0 = padding
# a prefill's logits for the last N positions only (0: all), as Hugging Face's `logits_to_keep`
LOGITS_TO_KEEP = "logits_to_keep"
LOGITS = "logits"
