"""Torch-free runtime: numpy + onnxruntime only.

    import seqexport.runtime as rt
    model = rt.load("exported/transformer-default")
    ids = rt.generate(model, [[5, 6, 7]], rt.SearchOptions(max_new_tokens=20))

Each family's runtime model lives with its family (`seqexport/families/<name>/runtime.py`);
`load` picks it from the manifest. `TransformerModel` and `MambaModel` stay importable
from here (on first use, so that this package never imports a family at start-up).
"""

from seqexport.errors import ArtifactError, InputError, SeqexportError, UsageError
from seqexport.runtime.base import RuntimeModel, State
from seqexport.runtime.engine import Engine, QueueFull, Request
from seqexport.runtime.generate import Generator, SearchOptions, beam_search, generate, stream
from seqexport.runtime.models import load

__all__ = [
    "ArtifactError", "Engine", "Generator", "InputError", "MambaModel", "QueueFull", "Request", "RuntimeModel",
    "SearchOptions", "SeqexportError", "State", "TransformerModel", "UsageError", "beam_search", "generate", "load", "stream",
]

_FAMILY_MODELS = {"TransformerModel": "transformer", "MambaModel": "mamba"}  # names of seqexport 0.1


def __getattr__(name: str):
    if name in _FAMILY_MODELS:
        from seqexport import families

        return families.get(_FAMILY_MODELS[name]).runtime.Model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
