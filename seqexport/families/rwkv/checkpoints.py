"""RWKV-7 checkpoints in two layouts: ours (config.json + model.safetensors, the keys of
`RwkvLM`) and BlinkDL's `.pth` releases (one file, no config: sizes inferred from the tensors
as the `rwkv` package's loader does). The state-dict keys of both are the same."""

from torch import Tensor

from seqexport.models.rwkv import RwkvConfig, RwkvLM

Config = RwkvConfig
UNUSED = ("blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2")  # the first layer has no value residual


def config_from_dict(d: dict) -> RwkvConfig:
    if "family" in d and d["family"] != "rwkv":
        raise ValueError(f"config names family {d['family']!r}; expected 'rwkv'")
    return RwkvConfig.from_dict({k: v for k, v in d.items() if k != "family"})


def config_from_weights(state: dict[str, Tensor]) -> RwkvConfig:
    """The config of a BlinkDL RWKV-7 `.pth`: heads and head size from `blocks.0.att.r_k`
    (h, n), vocabulary and width from `emb.weight`, layers from the block indices, the
    channel-mix width and LoRA ranks from their matrices. ValueError naming a missing key."""
    need = ("emb.weight", "blocks.0.att.r_k", "blocks.0.ffn.key.weight", "blocks.0.att.w1", "blocks.0.att.a1",
            "blocks.0.att.g1")
    missing = [k for k in need if k not in state]
    if missing:
        raise ValueError(f"not an RWKV-7 (x070) state dict: missing {missing}")
    vocab, c = state["emb.weight"].shape
    h, n = state["blocks.0.att.r_k"].shape
    if h * n != c:
        raise ValueError(f"blocks.0.att.r_k is {h}x{n} but emb.weight is {c} wide")
    n_layer = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    mv = state.get("blocks.1.att.v1")
    return RwkvConfig(n_embd=int(c), n_layer=n_layer, vocab_size=int(vocab), head_size=int(n),
                      d_ffn=int(state["blocks.0.ffn.key.weight"].shape[0]),
                      d_decay=int(state["blocks.0.att.w1"].shape[1]), d_aaa=int(state["blocks.0.att.a1"].shape[1]),
                      d_mv=int(mv.shape[1]) if mv is not None else None,
                      d_gate=int(state["blocks.0.att.g1"].shape[1]))


def build_model(config: RwkvConfig) -> RwkvLM:
    return RwkvLM(config)


def convert_state_dict(state: dict[str, Tensor], config: RwkvConfig) -> dict[str, Tensor]:
    """Either layout -> the keys of `RwkvLM(config)`: the first layer's unused value-residual
    LoRA of the releases is dropped; the rest are the same names and shapes (bf16 / fp16
    release weights are cast to float32 by the load). The input dict is not modified."""
    return {k: (v.float() if v.is_floating_point() else v) for k, v in state.items() if k not in UNUSED}
