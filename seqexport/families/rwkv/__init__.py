"""RWKV-7 "Goose" (x070) language models: prefill.onnx (the WKV recurrence as a chunked ONNX
Scan) + step.onnx with explicit token-shift and WKV state. The declaration the registry reads
(torch-free)."""

from pathlib import Path

from seqexport.families.base import Family
from seqexport.families.recurrent import GRAPHS

WORLD_VOCAB = 65536  # the RWKV World tokenizer's vocabulary (every public RWKV-7 release)
# its token list (Apache-2.0, from the `rwkv` package; see vocab/README.md)
WORLD_VOCAB_FILE = Path(__file__).resolve().parent / "vocab" / "rwkv_vocab_v20230424.txt"


def _detect_weights(keys: set[str]) -> bool:
    """Tensor names of a bare BlinkDL RWKV-7 `.pth` (x070: r_k and k_a exist only in v7)."""
    return {"emb.weight", "blocks.0.att.r_k", "blocks.0.att.k_a", "head.weight"} <= keys


def _default_tokenizer(config: dict) -> dict | None:
    """A model with the World vocabulary and no tokenizer of its own reads text with the RWKV
    World tokenizer (shipped with seqexport)."""
    if config.get("vocab_size") != WORLD_VOCAB:
        return None
    # "source": the file an export copies into the artifact (see seqexport.families.rwkv.tokenizer)
    return {"type": "rwkv", "file": WORLD_VOCAB_FILE.name, "source": str(WORLD_VOCAB_FILE),
            "vocab_size": WORLD_VOCAB, "bos_id": None, "eos_id": 0, "pad_id": None}


FAMILY = Family(
    name="rwkv",
    package=__name__,
    graphs=GRAPHS,
    presets={
        "tiny": dict(n_embd=64, n_layer=2, vocab_size=100, head_size=16),
        # the RWKV-7 0.1B shape (RWKV-x070-World-0.1B): LoRA ranks as BlinkDL suggests for c 768
        "0.1b": dict(n_embd=768, n_layer=12, vocab_size=WORLD_VOCAB, head_size=64),
    },
    config_fields=dict(vocab_size=1, n_embd=1, n_layer=1, head_size=1),
    bundled="rwkv-dates",
    tokenizer_types=("rwkv",),
    # `seqexport quantize` keeps float32 the LoRAs that write the WKV state: the decay w, the
    # in-context rate a and the value mix v (an int8 error there compounds over every later
    # token: bundled rwkv-dates free-running 58% -> 100% equal tokens); they are small
    int8_keep_float=("*.att.w[12]", "*.att.a[12]", "*.att.v[12]"),
    detect_weights=_detect_weights,
    public_layouts="BlinkDL's RWKV-7 weights file (.pth), no config.json",
    default_tokenizer=_default_tokenizer,
    summary="Export an RWKV-7 LM: prefill.onnx + step.onnx with explicit token-shift/WKV state.",
)
