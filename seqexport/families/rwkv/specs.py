"""Graph I/O of an RWKV-7 LM: prefill.onnx and step.onnx with every layer's token shifts and
WKV state.

The WKV state and the logits stay float32 in every export; the two token shifts follow the
model dtype. Torch-free: the runtime reads it.
"""

from seqexport.specs import ATTENTION_MASK, INPUT_IDS, LOGITS, LOGITS_TO_KEEP, GraphSpec, TensorSpec

__all__ = ["ATTENTION_MASK", "INPUT_IDS", "LOGITS", "LOGITS_TO_KEEP", "KINDS", "graph_specs", "past", "present"]

# a layer's state, in the order of models/rwkv.py's LayerState
KINDS = ("att_shift", "wkv_state", "ffn_shift")


def past(kind: str, i: int) -> str:
    return f"past_{kind}.{i}"


def present(kind: str, i: int) -> str:
    return f"present_{kind}.{i}"


def graph_specs(config: dict, dtype: str = "float32") -> dict[str, GraphSpec]:
    """prefill (seq_len tokens, dynamic; logits for the last `logits_to_keep` of them) and step
    (one token)."""
    n_layer, c, vocab = config["n_layer"], config["n_embd"], config["vocab_size"]
    n = config["head_size"]
    h = c // n

    def layer_state(name, i: int, role: str) -> tuple[TensorSpec, ...]:
        return (TensorSpec(name("att_shift", i), dtype, ("batch", c), role),
                TensorSpec(name("wkv_state", i), "float32", ("batch", h, n, n), role),
                TensorSpec(name("ffn_shift", i), dtype, ("batch", c), role))

    def graph(name, length, keep=False):
        return GraphSpec(
            name,
            inputs=(TensorSpec(INPUT_IDS, "int64", ("batch", length), "tokens", vocab),)
            # rows of unequal length in one prefill: right-padded (export.ragged)
            + ((TensorSpec(ATTENTION_MASK, "int64", ("batch", length), "mask"),) if keep else ())
            + tuple(t for i in range(n_layer) for t in layer_state(past, i, "state"))
            + ((TensorSpec(LOGITS_TO_KEEP, "int64", (1,), "keep"),) if keep else ()),
            outputs=(TensorSpec(LOGITS, "float32", ("batch", "kept_len" if keep else length, vocab)),)
            + tuple(t for i in range(n_layer) for t in layer_state(present, i, "")),
            feeds=tuple((present(k, i), past(k, i)) for i in range(n_layer) for k in KINDS),
        )

    return {"prefill": graph("prefill", "seq_len", keep=True), "step": graph("step", 1)}
