"""Where an export goes by default, and the vocabulary a tokenizer must fit."""

from seqexport import families


def default_name(family: str, ckpt, preset: str | None) -> str:
    """exported/<name>: the preset's or the checkpoint folder's name, led by the family."""
    name = preset if preset else (ckpt.path.stem if ckpt.path.is_file() else ckpt.path.name)  # a .pth file
    return name if name.startswith(family) else f"{family}-{name}"


def default_out(family: families.Family, ckpt, preset: str | None, options: dict) -> str:
    return f"exported/{default_name(family.name, ckpt, preset)}{family.out_suffix(options)}"


def vocab_limit(config: dict) -> int | None:
    """The smallest vocabulary of a model (a tokenizer must fit every one it feeds or reads)."""
    return min((v for k, v in config.items() if k.endswith("vocab_size")), default=None)
