"""Earlier import path of `seqexport.parity.validate` (the README's first Python example used it)."""

from seqexport.parity.validate import validate

__all__ = ["validate"]
