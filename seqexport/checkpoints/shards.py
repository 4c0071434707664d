"""Sharded weights, as `save_pretrained` writes a checkpoint past its `max_shard_size` (every
model of a few billion parameters on the Hub: Bamba-9B, Granite-4.0-H, Nemotron-H, Mamba-2.8b):
an index (`model.safetensors.index.json` or `pytorch_model.bin.index.json`) whose
"weight_map" names, for every tensor, the file beside it that holds it.

    {"metadata": {...}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}

The shards must hold exactly what the index says: a tensor missing from its shard, or one a
shard holds that the index lists elsewhere or not at all (a stale shard from another save), is
refused rather than merged, since either would load weights nobody can name.
"""

from collections.abc import Callable
from pathlib import Path

import torch

from seqexport.errors import CheckpointError, listed, shown
from seqexport.jsonfile import read_json_object

INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def is_index(path: Path) -> bool:
    return path.name in INDEX_FILES


def weight_map(index: Path) -> dict[str, str]:
    """The index's tensor name -> shard file name, checked: a JSON object's "weight_map" of
    names to plain file names in the index's folder."""
    data = read_json_object(index, CheckpointError, f"{index} is missing")
    mapping = data.get("weight_map")
    if not isinstance(mapping, dict) or not mapping:
        found = "no 'weight_map'" if mapping is None else f"'weight_map' {shown(mapping)}"
        raise CheckpointError(f"{index} has {found}: expected an object naming the shard file of every tensor")
    for name, shard in mapping.items():
        if not isinstance(shard, str):
            raise CheckpointError(f"{index}: the shard of {name!r} is {shown(shard)}, expected a file name")
        if shard != Path(shard).name or shard in ("", ".", ".."):
            raise CheckpointError(f"{index}: the shard of {name!r} is {shard!r}, expected the name of a file "
                                  "in the same folder")
    return mapping


def shard_paths(index: Path) -> list[Path]:
    """The shard files the index names, each once, in name order (as transformers reads them)."""
    return [index.parent / name for name in sorted(set(weight_map(index).values()))]


def read_sharded(index: Path, read_file: Callable[[Path], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every shard read with `read_file` and merged, after checking each holds exactly the
    tensors the index gives it."""
    mapping = weight_map(index)
    wanted: dict[str, set[str]] = {}
    for name, shard in mapping.items():
        wanted.setdefault(shard, set()).add(name)
    missing = [shard for shard in sorted(wanted) if not (index.parent / shard).is_file()]
    if missing:
        raise CheckpointError(f"{index} names {len(missing)} shard file(s) the folder does not have: "
                              + ", ".join(missing))
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(wanted):
        tensors = read_file(index.parent / shard)
        absent = sorted(wanted[shard] - set(tensors))
        if absent:
            raise CheckpointError(f"{index.parent / shard} does not hold {listed(absent, 20)}, which {index.name} "
                                  "puts in it")
        stray = sorted(set(tensors) - wanted[shard])
        if stray:
            elsewhere = [f"{n} (listed in {mapping[n]})" if n in mapping else f"{n} (not listed)" for n in stray]
            raise CheckpointError(f"{index.parent / shard} holds tensors {index.name} does not put in it: "
                                  f"{listed(elsewhere, 20)}; is it a shard of another save?")
        state.update(tensors)
    return state

