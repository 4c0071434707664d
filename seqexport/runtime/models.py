"""Open an exported folder as the runtime model of its family (see `seqexport.families`).

    model = seqexport.runtime.load("exported/transformer-tiny")
"""

import os
from pathlib import Path

from seqexport import families
from seqexport.errors import ArtifactError, UsageError
from seqexport.manifest import MANIFEST, read_manifest
from seqexport.runtime.base import RuntimeModel, State, tokens_2d

__all__ = ["RuntimeModel", "State", "load", "tokens_2d"]


def load(folder: str | Path, provider: str = "auto", verify: bool = True, threads: int | None = None,
         io_binding: bool | None = None, manifest: dict | None = None, runtime: str = "onnxruntime") -> RuntimeModel:
    """Open an exported folder: reads manifest.json (checking graph hashes unless verify=False).

    provider: auto (CUDA when onnxruntime-gpu can use a GPU, else CPU), cpu or cuda.
    io_binding: keep the cache/state as OrtValues between steps (default: on with CUDA).
    manifest: the folder's manifest when the caller has already read (and checked) it.
    runtime: what runs the graphs: onnxruntime, or openvino (the openvino extra; provider auto or cpu).
    """
    if not isinstance(folder, str | os.PathLike):
        raise UsageError(f"folder: expected the path of an exported folder, got {type(folder).__name__}")
    if not isinstance(verify, bool):
        raise UsageError(f"verify: expected True or False, got {verify!r}")
    if io_binding is not None and not isinstance(io_binding, bool):
        raise UsageError(f"io_binding: expected True or False, got {io_binding!r}")
    if manifest is None:
        manifest = read_manifest(folder, verify=verify)
    family = families.get(manifest["family"], ArtifactError, where=f"{Path(folder) / MANIFEST}")
    return family.runtime.Model(folder, provider=provider, threads=threads, io_binding=io_binding,
                                  manifest=manifest, runtime=runtime)
