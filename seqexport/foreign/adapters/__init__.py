"""The adapters, checked in this order; the first whose `detect(folder)` is true maps the folder.
One line per adapter (see `seqexport.foreign.adapter` for what one provides)."""

from pathlib import Path

from seqexport.errors import ArtifactError
from seqexport.foreign.adapter import ModelMap, check_names
from seqexport.foreign.adapters.genai import Genai
from seqexport.foreign.adapters.mobius import Mobius
from seqexport.foreign.adapters.optimum import Optimum
from seqexport.foreign.adapters.transformers_js import TransformersJs

ADAPTERS = [
    Optimum(),
    TransformersJs(),
    Genai(),
    Mobius(),
]


def choose(folder, io_map=None) -> ModelMap:
    """The folder's map: from the --io-map file when given, else from the first adapter that
    recognises the folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"{folder} is not a folder")
    if io_map is not None:
        from seqexport.foreign.adapters.io_map import read_io_map

        return read_io_map(folder, io_map)
    for adapter in ADAPTERS:
        if adapter.detect(folder):
            found = adapter.map(folder)
            check_names(folder, found)  # an adapter's map is held to what the graphs have, as --io-map's
            return found
    names = ", ".join(a.name for a in ADAPTERS)
    raise ArtifactError(f"{folder}: no adapter recognises it (tried {names}) and it has no manifest.json of "
                        "seqexport's; pass --io-map FILE naming its graphs' roles (docs/validate-other-tools.md)")
