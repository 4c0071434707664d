"""Graph I/O of a hybrid attention + Mamba-2 LM: prefill.onnx and step.onnx over a state of two
kinds (seqexport.state), per layer as the config's `layer_types` say:

    "attention"  past_key_values.{i}.key|value  (batch, n_kv_heads, past_len, head_dim)
                 appended: row r's first past_lengths[r] slots are valid; the graph returns
                 present.{i}.key|value for the new positions only (batch, n_kv_heads, seq_len, head_dim)
                 a sliding-window layer (`sliding_window_layers`): past_window.{i}.key|value
                 (batch, n_kv_heads, sliding_window, head_dim), its window, replaced whole: slot j
                 holds position past_lengths[r] - sliding_window + j (LFM3)
    "mamba2"     past_conv_state.{i} (batch, conv_dim, d_conv), past_ssm_state.{i}
                 (batch, nheads, headdim, d_state) float32: replaced whole each call
    "parallel"   both: the attention's key|value, then the mixer's conv|ssm (Falcon-H1)
    "zamba"      both: its call of the shared block's attention, then its mixer's (Zamba2)
    "conv"       past_conv_state.{i} (batch, d_model, short_conv_kernel): replaced whole (LFM2)
    "mamba"      past_conv_state.{i} (batch, d_inner, d_conv), past_ssm_state.{i} (batch, d_inner,
                 d_state) float32, d_inner = mamba1_expand * d_model: replaced whole (Jamba's Mamba-1)
    "deltanet"   past_conv_state.{i} (batch, 2 hk dk + hv dv, d_conv), past_ssm_state.{i} (batch, hv,
                 dk, dv) float32, the delta rule's state per value head: replaced whole (Qwen3.5's
                 Gated DeltaNet; hk, hv, dk, dv = delta_k_heads, delta_v_heads, delta_k_dim, delta_v_dim)
    "kda"        as "deltanet", one key head per value head (Kimi-Linear's Kimi Delta Attention)
    "mla"        past_key_values.{i}.latent (batch, 1, past_len, mla_kv_rank) and
                 past_key_values.{i}.rope (batch, 1, past_len, mla_rope_dim): appended as
                 "attention"'s, a latent and a key part every head shares (Kimi-Linear's latent attention)
    "mlp", "moe" no state

Row r's new tokens take positions past_lengths[r] onwards: rows at different positions share a
call (continuous batching). The prefill takes right-padded rows (attention_mask) and computes
logits for the last `logits_to_keep` positions. Torch-free: the runtime reads it.
"""

from seqexport.specs import ATTENTION_MASK, INPUT_IDS, LOGITS, LOGITS_TO_KEEP, GraphSpec, TensorSpec

PAST_LENGTHS = "past_lengths"  # (batch,) valid attention cache slots of each row
KV = ("key", "value")
LATENT = ("latent", "rope")  # an "mla" layer's cache
DELTA_KINDS = ("deltanet", "kda")  # (models.hybrid.DELTA_KINDS: this module is read without torch)

__all__ = ["ATTENTION_MASK", "INPUT_IDS", "KV", "LOGITS", "LOGITS_TO_KEEP", "PAST_LENGTHS", "graph_specs",
           "is_kv", "layer_inputs", "past_conv", "past_kv", "past_ssm", "past_window"]


def past_conv(i: int) -> str:
    return f"past_conv_state.{i}"


def past_ssm(i: int) -> str:
    return f"past_ssm_state.{i}"


def past_kv(i: int, kv: str) -> str:
    return f"past_key_values.{i}.{kv}"


def past_window(i: int, kv: str) -> str:
    return f"past_window.{i}.{kv}"


def is_kv(name: str) -> bool:
    """An attention cache input (appended), not a conv/SSM one (replaced)."""
    return name.startswith("past_key_values.")


def _present(name: str) -> str:
    """past_conv_state.0 -> present_conv_state.0; past_key_values.0.key -> present.0.key"""
    return name.replace("past_key_values.", "present.") if is_kv(name) \
        else name.replace("past_", "present_", 1)


def layer_inputs(kind: str, i: int, windowed: bool = False) -> tuple[str, ...]:
    """Layer i's state inputs, in the order of the model's per-layer tuple (`windowed`: a
    sliding-window attention layer's window)."""
    kv = tuple((past_window if windowed else past_kv)(i, kv) for kv in KV) \
        if kind in ("attention", "parallel", "zamba") else ()
    if kind == "conv":
        return (past_conv(i),)
    if kind == "mla":
        return tuple(past_kv(i, part) for part in LATENT)
    return kv + ((past_conv(i), past_ssm(i)) if kind in ("mamba2", "parallel", "mamba", *DELTA_KINDS, "zamba")
                 else ())


def graph_specs(config: dict, dtype: str = "float32") -> dict[str, GraphSpec]:
    """prefill (seq_len tokens, right-padded rows; logits for the last `logits_to_keep`) and step
    (one token), both over every layer's state."""
    vocab, kinds = config["vocab_size"], config["layer_types"]
    d_inner = config["mamba_nheads"] * config["headdim"]
    conv_dim = d_inner + 2 * config["ngroups"] * config["d_state"]
    nkv, hd = config["n_kv_heads"], config["head_dim"]
    windowed = set(config.get("sliding_window_layers") or ())  # (older manifests lack the key)

    def mamba1_inner() -> int:  # a "mamba" layer's width (read only where there is one: older manifests lack the key)
        return config["mamba1_expand"] * config["d_model"]

    def delta_conv_dim() -> int:  # a "deltanet" layer's conv channels (read only where there is one)
        return 2 * config["delta_k_heads"] * config["delta_k_dim"] + config["delta_v_heads"] * config["delta_v_dim"]

    def state(i: int, kind: str, past: bool, length) -> tuple[TensorSpec, ...]:
        role = "state" if past else ""
        dims = {past_kv(i, kv): (dtype, ("batch", nkv, "past_len" if past else length, hd)) for kv in KV}
        dims |= {past_window(i, kv): (dtype, ("batch", nkv, config.get("sliding_window"), hd)) for kv in KV}
        if kind == "mla":  # (older manifests lack the keys: read only where there is one)
            dims |= {past_kv(i, part): (dtype, ("batch", 1, "past_len" if past else length, config[key]))
                     for part, key in zip(LATENT, ("mla_kv_rank", "mla_rope_dim"), strict=True)}
        dims[past_conv(i)] = (dtype, ("batch", config["d_model"], config["short_conv_kernel"]) if kind == "conv"
                              else ("batch", mamba1_inner(), config["d_conv"]) if kind == "mamba"
                              else ("batch", delta_conv_dim(), config["d_conv"]) if kind in DELTA_KINDS
                              else ("batch", conv_dim, config["d_conv"]))
        dims[past_ssm(i)] = ("float32", ("batch", mamba1_inner(), config["d_state"]) if kind == "mamba"
                             else ("batch", config["delta_v_heads"], config["delta_k_dim"], config["delta_v_dim"])
                             if kind in DELTA_KINDS
                             else ("batch", config["mamba_nheads"], config["headdim"], config["d_state"]))
        return tuple(TensorSpec(n if past else _present(n), *dims[n], role)
                     for n in layer_inputs(kind, i, i in windowed))

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
            feeds=tuple((_present(n), n) for i, k in layers for n in layer_inputs(k, i, i in windowed) if not is_kv(n)),
            appends=tuple((_present(n), n) for i, k in layers for n in layer_inputs(k, i, i in windowed) if is_kv(n)),
        )

    return {"prefill": graph("prefill", "seq_len", prefill=True), "step": graph("step", 1)}
