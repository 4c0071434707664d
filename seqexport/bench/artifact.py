"""What an exported folder costs on disk, against the bytes of the weights it holds, and what
its export took (`export_seconds`, recorded in the manifest by `seqexport export`)."""

from pathlib import Path

import torch


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each tensor once (a tied head counts once)."""
    return sum({t.data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()}.values())


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def artifact_facts(folder: str | Path, manifest: dict, model: torch.nn.Module | None = None) -> dict:
    """Bytes on disk: the graph files, their weights (the shared file, or one .data per graph),
    the checkpoint copy inside the folder, everything; and ratios to the model's weight bytes."""
    folder = Path(folder)
    graphs = sum(g["bytes"] for g in manifest["graphs"].values())
    weights = (manifest.get("weights") or {}).get("bytes", 0) + sum(g.get("data_bytes", 0)
                                                                     for g in manifest["graphs"].values())
    source = manifest.get("source") or {}
    inside = source.get("checkpoint") and not Path(source["checkpoint"]).is_absolute()
    checkpoint = _size(folder / source["checkpoint"]) if inside and (folder / source["checkpoint"]).exists() else 0
    facts = {"graph_bytes": graphs, "weights_file_bytes": weights, "checkpoint_bytes": checkpoint,
             "total_bytes": _size(folder), "shared_weights": bool(manifest.get("weights")),
             "export_seconds": manifest.get("export_seconds")}
    if model is not None:
        w = weight_bytes(model)
        facts |= {"model_weight_bytes": w, "graphs_and_weights_over_weights": (graphs + weights) / w,
                  "total_over_weights": facts["total_bytes"] / w}
    return facts
