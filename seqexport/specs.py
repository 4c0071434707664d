"""One frozen spec per exported graph: inputs and outputs in order, dtype, dims.

Export, the manifest, validation and the runtime all read these; no graph I/O
name is spelled anywhere else. A dim is an int (fixed) or a str (symbolic, the
name written into the ONNX graph). This module imports neither torch nor numpy.
"""

from dataclasses import dataclass

DTYPES = ("int64", "float32", "float16")
# Symbolic dims a graph may declare; anything else in a spec is a typo.
DIM_NAMES = ("batch", "src_len", "tgt_len", "past_len", "past_len + tgt_len", "seq_len")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    dims: tuple[int | str, ...]

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r} not in {DTYPES}")
        for d in self.dims:
            if isinstance(d, str) and d not in DIM_NAMES:
                raise ValueError(f"{self.name}: unknown dim name {d!r}; expected one of {DIM_NAMES}")

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.dims) if isinstance(d, str)}

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "dims": list(self.dims)}

    @classmethod
    def from_dict(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["dims"]))


@dataclass(frozen=True)
class GraphSpec:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

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
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    @classmethod
    def from_dict(cls, name: str, d: dict) -> "GraphSpec":
        return cls(
            name,
            tuple(TensorSpec.from_dict(t) for t in d["inputs"]),
            tuple(TensorSpec.from_dict(t) for t in d["outputs"]),
        )


def _find(tensors, name, graph):
    for t in tensors:
        if t.name == name:
            return t
    raise KeyError(f"graph {graph!r} has no tensor {name!r}")


# --- names ---------------------------------------------------------------------------------------
# Transformer: per decoder layer i, the cross-attention ("encoder") and self-attention ("decoder")
# K/V. Graph inputs carry the past, outputs the present.

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
ENCODER_ATTENTION_MASK = "encoder_attention_mask"
ENCODER_HIDDEN_STATES = "encoder_hidden_states"
LOGITS = "logits"


def past_kv(i: int, which: str, kv: str) -> str:
    return f"past_key_values.{i}.{which}.{kv}"


def present_kv(i: int, which: str, kv: str) -> str:
    return f"present.{i}.{which}.{kv}"


def past_conv(i: int) -> str:
    return f"past_conv_state.{i}"


def past_ssm(i: int) -> str:
    return f"past_ssm_state.{i}"


def present_conv(i: int) -> str:
    return f"present_conv_state.{i}"


def present_ssm(i: int) -> str:
    return f"present_ssm_state.{i}"


def state_pairs(spec: GraphSpec) -> list[tuple[str, str]]:
    """(present output, past input) pairs: feed each output back as that input next step."""
    pairs = []
    for out in spec.output_names:
        if out.startswith("present."):
            pairs.append((out, "past_key_values." + out[len("present.") :]))
        elif out.startswith("present_"):
            pairs.append((out, "past_" + out[len("present_") :]))
    return [(o, i) for o, i in pairs if i in spec.input_names]


# --- transformer ---------------------------------------------------------------------------------


def transformer_specs(num_layers: int, n_heads: int, head_dim: int, d_model: int,
                      tgt_vocab_size: int, dtype: str = "float32") -> dict[str, GraphSpec]:
    kv = ("key", "value")
    cross = lambda n: TensorSpec(n, dtype, ("batch", n_heads, "src_len", head_dim))  # noqa: E731
    encoder = GraphSpec(
        "encoder",
        inputs=(
            TensorSpec(INPUT_IDS, "int64", ("batch", "src_len")),
            TensorSpec(ATTENTION_MASK, "int64", ("batch", "src_len")),
        ),
        outputs=(TensorSpec(ENCODER_HIDDEN_STATES, dtype, ("batch", "src_len", d_model)),)
        + tuple(cross(present_kv(i, "encoder", x)) for i in range(num_layers) for x in kv),
    )
    decoder = GraphSpec(
        "decoder",
        inputs=(
            TensorSpec(INPUT_IDS, "int64", ("batch", "tgt_len")),
            TensorSpec(ENCODER_ATTENTION_MASK, "int64", ("batch", "src_len")),
        )
        + tuple(cross(past_kv(i, "encoder", x)) for i in range(num_layers) for x in kv)
        + tuple(
            TensorSpec(past_kv(i, "decoder", x), dtype, ("batch", n_heads, "past_len", head_dim))
            for i in range(num_layers)
            for x in kv
        ),
        outputs=(TensorSpec(LOGITS, dtype, ("batch", "tgt_len", tgt_vocab_size)),)
        + tuple(
            TensorSpec(present_kv(i, "decoder", x), dtype, ("batch", n_heads, "past_len + tgt_len", head_dim))
            for i in range(num_layers)
            for x in kv
        ),
    )
    return {"encoder": encoder, "decoder": decoder}


# --- mamba ---------------------------------------------------------------------------------------


def mamba_specs(n_layer: int, d_inner: int, d_conv: int, d_state: int, vocab_size: int,
                dtype: str = "float32", prefill_len: int | None = None) -> dict[str, GraphSpec]:
    """The SSM state and the logits stay float32 in every export; the conv state follows
    the model dtype. `prefill_len` fixes the prefill length (the `unrolled` scan)."""

    def graph(name, length):
        states_in = tuple(
            t
            for i in range(n_layer)
            for t in (
                TensorSpec(past_conv(i), dtype, ("batch", d_inner, d_conv)),
                TensorSpec(past_ssm(i), "float32", ("batch", d_inner, d_state)),
            )
        )
        states_out = tuple(
            t
            for i in range(n_layer)
            for t in (
                TensorSpec(present_conv(i), dtype, ("batch", d_inner, d_conv)),
                TensorSpec(present_ssm(i), "float32", ("batch", d_inner, d_state)),
            )
        )
        return GraphSpec(
            name,
            inputs=(TensorSpec(INPUT_IDS, "int64", ("batch", length)),) + states_in,
            outputs=(TensorSpec(LOGITS, "float32", ("batch", length, vocab_size)),) + states_out,
        )

    return {"prefill": graph("prefill", prefill_len or "seq_len"), "step": graph("step", 1)}
