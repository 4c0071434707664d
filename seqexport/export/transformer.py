"""Earlier import path of the transformer export (the README's first Python example used it)."""

from seqexport.families.transformer.export import export_transformer

__all__ = ["export_transformer"]
