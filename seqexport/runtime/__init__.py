"""Torch-free runtime: numpy + onnxruntime only.

    import seqexport.runtime as rt
    model = rt.load("exported/transformer-default")
    ids = rt.generate(model, [[5, 6, 7]], rt.SearchOptions(max_new_tokens=20))

Each family's runtime model lives with its family (`seqexport/families/<name>/runtime.py`);
`load` picks it from the manifest.
"""

from seqexport.errors import ArtifactError, InputError, SeqexportError, UsageError
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.engine import Engine, QueueFull, Request
from seqexport.runtime.generate import (
    Generator,
    SearchOptions,
    beam_search,
    generate,
    model_options,
    stream,
)
from seqexport.runtime.models import load

__all__ = [
    "ArtifactError", "Engine", "Generator", "InputError", "QueueFull", "Request", "RuntimeModel",
    "SearchOptions", "SeqexportError", "State", "UsageError", "beam_search", "generate", "load",
    "model_options", "stream",
]
