"""The registry of model families: each kind is declared once, in its own package, and
listed here once. Everything outside `seqexport/families/` asks this registry instead of
comparing family names. See docs/adding-a-family.md."""

from seqexport.errors import SeqexportError
from seqexport.families.base import Family
from seqexport.families.hybrid import FAMILY as HYBRID
from seqexport.families.mamba import FAMILY as MAMBA
from seqexport.families.mamba2 import FAMILY as MAMBA2
from seqexport.families.rwkv import FAMILY as RWKV
from seqexport.families.transformer import FAMILY as TRANSFORMER

REGISTRY: dict[str, Family] = {f.name: f for f in (TRANSFORMER, MAMBA, RWKV, MAMBA2, HYBRID)}

__all__ = ["REGISTRY", "Family", "detect", "eager_model", "get", "names", "tokenizer_family"]


def names() -> list[str]:
    return list(REGISTRY)


def get(name, error: type[SeqexportError] = SeqexportError, where: str = "") -> Family:
    """The family called `name`; `error` (naming `where`) for an unknown one."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise error(f"{where + ': ' if where else ''}unknown model family {name!r}; expected one of {names()}")
    return REGISTRY[name]


def detect(config: dict) -> Family | None:
    """The family of a config.json that names none (a public layout), or None."""
    found = [f for f in REGISTRY.values() if f.detect(config)]
    return found[0] if len(found) == 1 else None


def eager_model(ckpt, tokenizer=None, cache: bool = True, device="cpu"):
    """The eager model of a loaded checkpoint behind the runtime's step API (needs torch)."""
    return get(ckpt.family).eager.Eager(ckpt.model, tokenizer, cache=cache, device=device)


def tokenizer_family(kind: str) -> Family | None:
    """The family whose own tokenizer a manifest's record of type `kind` is, or None."""
    return next((f for f in REGISTRY.values() if kind in f.tokenizer_types), None)
