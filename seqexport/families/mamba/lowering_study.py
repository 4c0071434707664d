"""The Mamba scan lowerings side by side: export time, node count, ORT prefill vs eager.

Two framings of the one study (scripts/study_lowerings.py; --d-inner for the scan alone):

- `study(preset)`: the whole model. The preset is exported once per lowering (at the
  prefill length L for `unrolled`), its prefill graph's nodes counted, and a batch-1
  prefill of L tokens run through the runtime;
- `study_scan(d_inner)`: the scan alone at one mixer width. Each lowering is exported
  as a graph of its own and run in a bare InferenceSession.

Both compare ORT with two eager baselines: the sequential reference scan
(`selective_scan_ref`) and the chunked one (`scan_chunked`, the `loop` lowering's eager
kernel: exp(ΔA) and ΔBu made per chunk). Torch and ORT get the same thread count; one
call of each per round, in turn; medians, and ratios as medians of per-round ratios.
Nodes are counted inside Scan/Loop bodies too.
"""

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from seqexport.bench.timing import median_ratio, paired_samples
from seqexport.checkpoints.presets import build_preset
from seqexport.families.mamba.export import export_mamba
from seqexport.families.mamba.scan import LOWERINGS, custom_translation_table, scan_for
from seqexport.families.mamba.scan_lowerings import scan_chunked
from seqexport.models.mamba import selective_scan_ref
from seqexport.runtime.models import load

EAGER_SCANS = {"reference": selective_scan_ref, "chunked": scan_chunked}
SCAN_INPUTS = ["u", "delta", "B", "C", "h0"]


def count_nodes(graph: onnx.GraphProto) -> int:
    """Nodes of a graph and, recursively, of every subgraph (Scan and Loop bodies)."""
    return sum(1 + sum(count_nodes(a.g) for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
               for node in graph.node)


def _compare(ort_fn: Callable, eager: dict[str, Callable], repeats: int) -> dict:
    """ORT against each eager baseline, paired round by round: ms and ORT ÷ eager."""
    with torch.inference_mode():
        samples = paired_samples({"ort": ort_fn, **eager}, repeats)
    out = {"ort_ms": 1e3 * statistics.median(samples["ort"])}
    out |= {f"eager_{name}_ms": 1e3 * statistics.median(samples[name]) for name in eager}
    out |= {f"ort_over_{name}": median_ratio(samples["ort"], samples[name]) for name in eager}
    return out


def _counts(model: onnx.ModelProto) -> dict:
    return {"nodes": count_nodes(model.graph), "top_level_nodes": len(model.graph.node)}


def _with_threads(threads: int, fn: Callable[[], list[dict]]) -> list[dict]:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


# --- the whole model ------------------------------------------------------------------------------


def study(preset: str, length: int = 1024, lowerings=LOWERINGS, repeats: int = 5, threads: int = 2,
          out_dir: str | None = None) -> list[dict]:
    """One row per lowering: a Mamba preset's prefill of `length` tokens, ORT vs eager."""
    ckpt = build_preset("mamba", preset, seed=0)
    ids = np.random.default_rng(0).integers(0, ckpt.config.vocab_size, (1, length))  # (1, L)
    tids = torch.from_numpy(ids)
    eager = {name: (lambda scan=scan: ckpt.model(tids, scan=scan)) for name, scan in EAGER_SCANS.items()}

    def rows():
        out = []
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            for lowering in lowerings:
                folder = Path(tmp) / lowering
                t = time.perf_counter()
                export_mamba(ckpt, preset, folder, scan=lowering, seq_len=length if lowering == "unrolled" else None)
                export_s = time.perf_counter() - t
                graph = onnx.load(str(folder / "prefill.onnx"), load_external_data=False)
                rt = load(folder, provider="cpu", threads=threads, verify=False)
                state = rt.start(1)
                out.append({"preset": preset, "lowering": lowering, "length": length, "threads": threads,
                            "export_s": round(export_s, 1), **_counts(graph),
                            **_compare(lambda rt=rt, state=state: rt.step(ids, state), eager, repeats)})
                del rt
        return out

    return _with_threads(threads, rows)


# --- the scan alone -------------------------------------------------------------------------------


class ScanModule(nn.Module):
    """One lowering of the scan with A and D as weights: (u, delta, B, C, h0) -> (y, h)."""

    def __init__(self, lowering: str, A: torch.Tensor, D: torch.Tensor):
        super().__init__()
        self.A, self.D, self.scan = nn.Parameter(A), nn.Parameter(D), scan_for(lowering)

    def forward(self, u, delta, B, C, h0):
        return self.scan(u, delta, self.A, B, C, self.D, h0)


def _scan_session(lowering: str, A, D, inputs: tuple, threads: int) -> tuple[ort.InferenceSession, dict, float]:
    """The lowering exported alone (batch dynamic; the length too but for `unrolled`): its
    session, node counts and export seconds."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch} if lowering == "unrolled" else {0: batch, 1: length}
    t = time.perf_counter()
    model = torch.onnx.export(
        ScanModule(lowering, A, D).eval(), inputs, dynamo=True, verbose=False, input_names=SCAN_INPUTS,
        dynamic_shapes=(dims, dims, dims, dims, {0: batch}),
        custom_translation_table=custom_translation_table(lowering),
    ).model_proto
    export_s = time.perf_counter() - t
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session, _counts(model), export_s


def study_scan(d_inner: int, d_state: int = 16, length: int = 1024, lowerings=LOWERINGS, repeats: int = 7,
               threads: int = 2, seed: int = 0) -> list[dict]:
    """One row per lowering: the scan alone at batch 1, ORT vs eager."""
    g = torch.Generator().manual_seed(seed)
    A = -torch.exp(torch.rand(d_inner, d_state, generator=g) * 2)  # (d_in, n), negative: a stable decay
    D = torch.randn(d_inner, generator=g)  # (d_in,)
    x = (torch.randn(1, length, d_inner, generator=g),  # u (1, L, d_in)
         torch.rand(1, length, d_inner, generator=g) * 0.5,  # delta (1, L, d_in)
         torch.randn(1, length, d_state, generator=g),  # B (1, L, n)
         torch.randn(1, length, d_state, generator=g),  # C (1, L, n)
         torch.randn(1, d_inner, d_state, generator=g))  # h0 (1, d_in, n)
    u, delta, B, C, h0 = x
    feeds = {name: t.numpy() for name, t in zip(SCAN_INPUTS, x, strict=True)}
    eager = {name: (lambda scan=scan: scan(u, delta, A, B, C, D, h0)) for name, scan in EAGER_SCANS.items()}

    def rows():
        out = []
        for lowering in lowerings:
            session, counts, export_s = _scan_session(lowering, A, D, x, threads)
            out.append({"d_inner": d_inner, "d_state": d_state, "lowering": lowering, "length": length,
                        "threads": threads, "export_s": round(export_s, 1), **counts,
                        **_compare(lambda s=session: s.run(None, feeds), eager, repeats)})
        return out

    return _with_threads(threads, rows)


def format_rows(rows: list[dict]) -> str:
    """Rows of `study` or `study_scan`: one line per (model or width, lowering)."""
    lines = [f"{'model':15} {'lowering':9} {'L':>5} {'export s':>9} {'nodes':>7} {'ORT ms':>9} {'eager ref ms':>13} "
             f"{'chunked ms':>11} {'ORT/ref':>8} {'ORT/chunked':>12}"]
    for r in rows:
        what = r["preset"] if "preset" in r else f"scan {r['d_inner']}x{r['d_state']}"
        lines.append(f"{what:15} {r['lowering']:9} {r['length']:5d} {r['export_s']:9.1f} {r['nodes']:7d} "
                     f"{r['ort_ms']:9.1f} {r['eager_reference_ms']:13.1f} {r['eager_chunked_ms']:11.1f} "
                     f"{r['ort_over_reference']:8.3f} {r['ort_over_chunked']:12.3f}")
    return "\n".join(lines)
