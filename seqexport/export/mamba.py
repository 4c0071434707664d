"""Earlier import path of the Mamba export."""

from seqexport.families.mamba.export import export_mamba

__all__ = ["export_mamba"]
