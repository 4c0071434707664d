"""Graph I/O of a Mamba-2 LM: prefill.onnx and step.onnx with every layer's conv and SSM state.

    past_conv_state.{i}  (batch, conv_dim, d_conv)            the last d_conv conv inputs, model dtype
    past_ssm_state.{i}   (batch, nheads, headdim, d_state)   float32 in every export

conv_dim = d_inner + 2 * ngroups * d_state (x, B and C go through the conv together). The
logits stay float32. Torch-free: the runtime reads it.
"""

from seqexport.specs import ATTENTION_MASK, INPUT_IDS, LOGITS, LOGITS_TO_KEEP, GraphSpec, TensorSpec

__all__ = ["ATTENTION_MASK", "INPUT_IDS", "LOGITS", "LOGITS_TO_KEEP", "graph_specs", "past_conv", "past_ssm",
           "present_conv", "present_ssm"]


def past_conv(i: int) -> str:
    return f"past_conv_state.{i}"


def past_ssm(i: int) -> str:
    return f"past_ssm_state.{i}"


def present_conv(i: int) -> str:
    return f"present_conv_state.{i}"


def present_ssm(i: int) -> str:
    return f"present_ssm_state.{i}"


def graph_specs(config: dict, dtype: str = "float32") -> dict[str, GraphSpec]:
    """prefill (seq_len tokens, right-padded rows with an attention_mask; logits for the last
    `logits_to_keep`) and step (one token)."""
    n_layer, d_inner = config["n_layer"], config["expand"] * config["d_model"]
    d_conv, d_state, vocab = config["d_conv"], config["d_state"], config["vocab_size"]
    nheads, headdim = d_inner // config["headdim"], config["headdim"]
    conv_dim = d_inner + 2 * config["ngroups"] * d_state

    def layer_state(conv: str, ssm: str, role: str) -> tuple[TensorSpec, TensorSpec]:
        return (TensorSpec(conv, dtype, ("batch", conv_dim, d_conv), role),
                TensorSpec(ssm, "float32", ("batch", nheads, headdim, d_state), role))

    def graph(name, length, keep=False):
        return GraphSpec(
            name,
            inputs=(TensorSpec(INPUT_IDS, "int64", ("batch", length), "tokens", vocab),)
            + ((TensorSpec(ATTENTION_MASK, "int64", ("batch", length), "mask"),) if keep else ())
            + tuple(t for i in range(n_layer) for t in layer_state(past_conv(i), past_ssm(i), "state"))
            + ((TensorSpec(LOGITS_TO_KEEP, "int64", (1,), "keep"),) if keep else ()),
            outputs=(TensorSpec(LOGITS, "float32", ("batch", "kept_len" if keep else length, vocab)),)
            + tuple(t for i in range(n_layer) for t in layer_state(present_conv(i), present_ssm(i), "")),
            feeds=tuple(f for i in range(n_layer)
                        for f in ((present_conv(i), past_conv(i)), (present_ssm(i), past_ssm(i)))),
        )

    return {"prefill": graph("prefill", "seq_len", keep=True), "step": graph("step", 1)}
