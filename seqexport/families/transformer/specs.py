"""Graph I/O of the encoder-decoder Transformer: encoder.onnx and decoder.onnx (DESIGN §4).

Per decoder layer i, the cross-attention ("encoder") and self-attention ("decoder") K/V.
The self-attention cache is a preallocated buffer (b, h, past_len, k) of which row r's first
`past_lengths[r]` slots are valid; the decoder returns only the new positions' K/V, which
the runtime writes into the buffer in place (`appends`; seqexport.state.appended). Rows
may sit at different positions: row r's new tokens take positions past_lengths[r] onwards.
Artifacts exported before `past_lengths` (a decoder that concatenates and returns the whole
cache) still load and run, batch-synchronously. Torch-free: the runtime reads it.
"""

from seqexport.specs import INPUT_IDS, LOGITS, GraphSpec, TensorSpec

ATTENTION_MASK = "attention_mask"
ENCODER_ATTENTION_MASK = "encoder_attention_mask"
ENCODER_HIDDEN_STATES = "encoder_hidden_states"
PAST_LENGTHS = "past_lengths"  # (batch,) valid self-attention cache slots of each row
KV = ("key", "value")

__all__ = ["ATTENTION_MASK", "ENCODER_ATTENTION_MASK", "ENCODER_HIDDEN_STATES", "INPUT_IDS", "LOGITS",
           "PAST_LENGTHS", "graph_specs", "past_kv", "present_kv"]


def past_kv(i: int, which: str, kv: str) -> str:
    """which: "encoder" (cross-attention) or "decoder" (self-attention); kv: "key" or "value"."""
    return f"past_key_values.{i}.{which}.{kv}"


def present_kv(i: int, which: str, kv: str) -> str:
    return f"present.{i}.{which}.{kv}"


def graph_specs(config: dict, dtype: str = "float32") -> dict[str, GraphSpec]:
    """The two graphs of a transformer whose config (as in config.json) is `config`."""
    n, h = config["num_layers"], config["n_heads"]
    k = config["d_model"] // h
    layers = range(n)
    cross = lambda name, role="": TensorSpec(name, dtype, ("batch", h, "src_len", k), role)  # noqa: E731
    encoder = GraphSpec(
        "encoder",
        inputs=(
            TensorSpec(INPUT_IDS, "int64", ("batch", "src_len"), "tokens", config["src_vocab_size"]),
            TensorSpec(ATTENTION_MASK, "int64", ("batch", "src_len"), "mask"),
        ),
        outputs=(TensorSpec(ENCODER_HIDDEN_STATES, dtype, ("batch", "src_len", config["d_model"])),)
        + tuple(cross(present_kv(i, "encoder", x)) for i in layers for x in KV),
        # computed once per source, then fed to every decoder step
        feeds=tuple((present_kv(i, "encoder", x), past_kv(i, "encoder", x)) for i in layers for x in KV),
    )
    decoder = GraphSpec(
        "decoder",
        inputs=(
            TensorSpec(INPUT_IDS, "int64", ("batch", "tgt_len"), "tokens", config["tgt_vocab_size"]),
            TensorSpec(ENCODER_ATTENTION_MASK, "int64", ("batch", "src_len"), "mask"),
            TensorSpec(PAST_LENGTHS, "int64", ("batch",), "lengths"),
        )
        + tuple(cross(past_kv(i, "encoder", x), "state") for i in layers for x in KV)
        + tuple(TensorSpec(past_kv(i, "decoder", x), dtype, ("batch", h, "past_len", k), "state")
                for i in layers for x in KV),
        outputs=(TensorSpec(LOGITS, dtype, ("batch", "tgt_len", config["tgt_vocab_size"])),)
        + tuple(TensorSpec(present_kv(i, "decoder", x), dtype, ("batch", h, "tgt_len", k))
                for i in layers for x in KV),
        appends=tuple((present_kv(i, "decoder", x), past_kv(i, "decoder", x)) for i in layers for x in KV),
    )
    return {"encoder": encoder, "decoder": decoder}
