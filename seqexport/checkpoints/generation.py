"""A checkpoint folder's generation defaults, read as transformers reads them: its
generation_config.json, else (a checkpoint saved before that file existed) the generation keys
its config.json carries. The rules and the record: seqexport.generation_config."""

from pathlib import Path

from seqexport.checkpoints.io import CONFIG_FILE, Checkpoint
from seqexport.errors import CheckpointError
from seqexport.generation_config import generation_record
from seqexport.jsonfile import read_json_object

GENERATION_FILE = "generation_config.json"


def checkpoint_generation(ckpt: Checkpoint) -> dict | None:
    """The manifest's `generation` record for `ckpt`, or None (a preset, a bare weights file, a
    folder that sets no generation key); CheckpointError naming the file and key for a value
    transformers would refuse."""
    if ckpt.path is None or not Path(ckpt.path).is_dir():
        return None
    folder = Path(ckpt.path)
    file = GENERATION_FILE if (folder / GENERATION_FILE).is_file() else CONFIG_FILE
    path = folder / file
    data = read_json_object(path, CheckpointError, f"{path} is missing")
    try:
        return generation_record(data, str(path), file)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
