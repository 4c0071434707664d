"""Torch-free runtime: numpy + onnxruntime only.

    import seqexport.runtime as rt
    model = rt.load("exported/transformer-default")
    ids = rt.generate(model, [[5, 6, 7]], rt.SearchOptions(max_new_tokens=20))
"""

from seqexport.errors import ArtifactError, InputError, SeqexportError, UsageError
from seqexport.families.mamba.runtime import MambaModel
from seqexport.families.transformer.runtime import TransformerModel
from seqexport.runtime.base import State
from seqexport.runtime.generate import Generator, SearchOptions, beam_search, generate, stream
from seqexport.runtime.models import load

__all__ = [
    "ArtifactError", "Generator", "InputError", "MambaModel", "SearchOptions", "SeqexportError", "State",
    "TransformerModel", "UsageError", "beam_search", "generate", "load", "stream",
]
