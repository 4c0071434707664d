"""The three Mamba scan lowerings side by side: export time, node count, ORT prefill vs eager.

For each lowering, a preset is exported (prefill length L for `unrolled`), its
nodes counted (top level and inside Scan/Loop bodies), and a batch-1 prefill of
L tokens timed in ONNX Runtime against the eager model with the sequential
reference scan, with the same thread count, medians of paired repeats.
"""

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

from seqexport.checkpoints.presets import build_preset
from seqexport.export.scan import LOWERINGS
from seqexport.families.mamba.export import export_mamba
from seqexport.runtime.models import load


def count_nodes(graph: onnx.GraphProto) -> int:
    n = 0
    for node in graph.node:
        n += 1
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                n += count_nodes(a.g)
    return n


def study(preset: str, length: int = 1024, lowerings=LOWERINGS, repeats: int = 5, threads: int = 2,
          out_dir: str | None = None) -> list[dict]:
    torch.set_num_threads(threads)
    ckpt = build_preset("mamba", preset, seed=0)
    ids = np.random.default_rng(0).integers(0, ckpt.config.vocab_size, (1, length))
    rows = []
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        for lowering in lowerings:
            folder = Path(tmp) / lowering
            t = time.perf_counter()
            export_mamba(ckpt, preset, folder, scan=lowering, seq_len=length if lowering == "unrolled" else None)
            export_s = time.perf_counter() - t
            model = onnx.load(str(folder / "prefill.onnx"), load_external_data=False)
            rt = load(folder, provider="cpu", threads=threads, verify=False)
            state = rt.start(1)
            ort_times, eager_times = [], []
            with torch.inference_mode():
                tids = torch.from_numpy(ids)
                for i in range(repeats + 1):  # the first round warms up
                    t = time.perf_counter()
                    rt.step(ids, state)
                    o = time.perf_counter() - t
                    t = time.perf_counter()
                    ckpt.model(tids)
                    e = time.perf_counter() - t
                    if i:
                        ort_times.append(o)
                        eager_times.append(e)
            rows.append({
                "preset": preset, "lowering": lowering, "length": length, "threads": threads,
                "export_s": round(export_s, 1), "nodes": count_nodes(model.graph),
                "top_level_nodes": len(model.graph.node),
                "ort_prefill_ms": 1e3 * statistics.median(ort_times),
                "eager_reference_ms": 1e3 * statistics.median(eager_times),
                "ratio": statistics.median(o / e for o, e in zip(ort_times, eager_times)),
            })
            del rt
    return rows


def format_rows(rows) -> str:
    lines = [f"{'preset':6} {'lowering':9} {'L':>5} {'export s':>9} {'nodes':>7} {'ORT ms':>9} "
             f"{'eager ref ms':>13} {'ORT/eager':>10}"]
    for r in rows:
        lines.append(f"{r['preset']:6} {r['lowering']:9} {r['length']:5d} {r['export_s']:9.1f} {r['nodes']:7d} "
                     f"{r['ort_prefill_ms']:9.1f} {r['eager_reference_ms']:13.1f} {r['ratio']:10.3f}")
    return "\n".join(lines)
