"""Which validate a folder gets: ours (it holds our manifest.json) or the foreign checks."""

from pathlib import Path

from seqexport.errors import ArtifactError, UsageError
from seqexport.manifest import MANIFEST


def foreign_folder(folder, reference, io_map, checkpoint) -> bool:
    """True for a folder without our manifest (then --reference is required, --checkpoint
    refused); --reference and --io-map on one of ours are refused: its eager model is the
    checkpoint its manifest names (or --checkpoint), in our layout."""
    ours = (Path(folder) / MANIFEST).is_file()
    if ours:
        for option, value in (("--reference", reference), ("--io-map", io_map)):
            if value is not None:
                raise UsageError(f"{option} {value}: {folder} is seqexport's own export (it has {MANIFEST}); "
                                 f"{option} is for folders other tools made. Use --checkpoint to name its eager model")
        return False
    if not Path(folder).is_dir():
        return False  # ours says so, in its words
    if reference is None:
        raise ArtifactError(f"{str(folder)!r} has no {MANIFEST}; is it the output of `seqexport export`? To validate "
                            "another tool's export (Optimum, transformers.js-style graphs, --io-map) pass "
                            "--reference CHECKPOINT")
    if checkpoint is not None:
        raise UsageError(f"--checkpoint {checkpoint}: {folder} is another tool's export; its judge is "
                         "--reference (a transformers checkpoint)")
    return True
