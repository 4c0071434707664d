"""Graph I/O of a hybrid attention + Mamba-2 LM: prefill.onnx and step.onnx over a state of two
kinds (seqexport.state), per layer as the config's `layer_types` say:

    "attention"  past_key_values.{i}.key|value  (batch, n_kv_heads, past_len, head_dim)
                 appended: row r's first past_lengths[r] slots are valid; the graph returns
                 present.{i}.key|value for the new positions only (batch, n_kv_heads, seq_len, head_dim)
    "mamba2"     past_conv_state.{i} (batch, conv_dim, d_conv), past_ssm_state.{i}
                 (batch, nheads, headdim, d_state) float32: replaced whole each call
    "mlp"        no state

Row r's new tokens take positions past_lengths[r] onwards: rows at different positions share a
call (continuous batching). The prefill takes right-padded rows (attention_mask) and computes
logits for the last `logits_to_keep` positions. Torch-free: the runtime reads it.
"""

from seqexport.specs import ATTENTION_MASK, INPUT_IDS, LOGITS, LOGITS_TO_KEEP, GraphSpec, TensorSpec

PAST_LENGTHS = "past_lengths"  # (batch,) valid attention cache slots of each row
KV = ("key", "value")

__all__ = ["ATTENTION_MASK", "INPUT_IDS", "KV", "LOGITS", "LOGITS_TO_KEEP", "PAST_LENGTHS", "graph_specs",
           "layer_inputs", "past_conv", "past_kv", "past_ssm"]


def past_conv(i: int) -> str:
    return f"past_conv_state.{i}"


def past_ssm(i: int) -> str:
    return f"past_ssm_state.{i}"


def past_kv(i: int, kv: str) -> str:
    return f"past_key_values.{i}.{kv}"


def _present(name: str) -> str:
    """past_conv_state.0 -> present_conv_state.0; past_key_values.0.key -> present.0.key"""
    return name.replace("past_key_values.", "present.") if name.startswith("past_key_values.") \
        else name.replace("past_", "present_", 1)


def layer_inputs(kind: str, i: int) -> tuple[str, ...]:
    """Layer i's state inputs, in the order of the model's per-layer tuple."""
    if kind == "mamba2":
        return past_conv(i), past_ssm(i)
    if kind == "attention":
        return tuple(past_kv(i, kv) for kv in KV)
    return ()


def graph_specs(config: dict, dtype: str = "float32") -> dict[str, GraphSpec]:
    """prefill (seq_len tokens, right-padded rows; logits for the last `logits_to_keep`) and step
    (one token), both over every layer's state."""
    vocab, kinds = config["vocab_size"], config["layer_types"]
    d_inner = config["mamba_nheads"] * config["headdim"]
    conv_dim = d_inner + 2 * config["ngroups"] * config["d_state"]
    nkv, hd = config["n_kv_heads"], config["head_dim"]

    def state(i: int, kind: str, past: bool, length) -> tuple[TensorSpec, ...]:
        names = layer_inputs(kind, i)
        role = "state" if past else ""
        if kind == "attention":
            dims = ("batch", nkv, "past_len" if past else length, hd)
            return tuple(TensorSpec(n if past else _present(n), dtype, dims, role) for n in names)
        if kind == "mamba2":
            conv, ssm = names
            return (TensorSpec(conv if past else _present(conv), dtype, ("batch", conv_dim, config["d_conv"]), role),
                    TensorSpec(ssm if past else _present(ssm), "float32",
                               ("batch", config["mamba_nheads"], config["headdim"], config["d_state"]), role))
        return ()

    def graph(name, length, prefill=False):
        layers = list(enumerate(kinds))
        return GraphSpec(
            name,
            inputs=(TensorSpec(INPUT_IDS, "int64", ("batch", length), "tokens", vocab),)
            + ((TensorSpec(ATTENTION_MASK, "int64", ("batch", length), "mask"),) if prefill else ())
            + (TensorSpec(PAST_LENGTHS, "int64", ("batch",), "lengths"),)
            + tuple(t for i, k in layers for t in state(i, k, True, length))
            + ((TensorSpec(LOGITS_TO_KEEP, "int64", (1,), "keep"),) if prefill else ()),
            outputs=(TensorSpec(LOGITS, "float32", ("batch", "kept_len" if prefill else length, vocab)),)
            + tuple(t for i, k in layers for t in state(i, k, False, length)),
            feeds=tuple((_present(n), n) for i, k in layers if k == "mamba2" for n in layer_inputs(k, i)),
            appends=tuple((_present(n), n) for i, k in layers if k == "attention" for n in layer_inputs(k, i)),
        )

    return {"prefill": graph("prefill", "seq_len", prefill=True), "step": graph("step", 1)}
