"""Export time: where a preset export's seconds go, and ours beside Optimum's in one run.

    scripts/bench_export_time.py phases [--family transformer] [--preset base]
        one export in this process (graphs one after another), each phase timed (wall and CPU
        seconds), per graph:
        torch.export tracing, run_decompositions, type promotion, translation to ONNX,
        the onnxscript optimizer, serialising the ModelProto, our own passes, saving.
    scripts/bench_export_time.py compare [--rounds 3] [--optimum /tmp/optvenv/bin/optimum-cli]
        `seqexport export transformer --preset base` and `optimum-cli export onnx` of a
        Marian model of the same shape (random weights from a config, saved locally: no
        download), alternating, each a fresh process; medians of wall and CPU seconds, ratio.

Optimum lives in its own venv (it pins another transformers):
    python -m venv /tmp/optvenv && /tmp/optvenv/bin/pip install -c constraints.txt optimum-onnx onnxruntime
"""

import argparse
import functools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Phases:
    """Wall and CPU seconds of wrapped functions, by (graph, phase); nested phases count in both."""

    def __init__(self):
        self.seconds = defaultdict(lambda: [0.0, 0.0])
        self.graph = "-"
        self.order = []

    def wrap(self, owner, attr: str, label: str, graph_from=None):
        inner = getattr(owner, attr)
        is_property = isinstance(inner, property)
        fn = inner.fget if is_property else inner

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            before = self.graph
            if graph_from is not None:
                self.graph = graph_from(*args, **kwargs)
            key = (self.graph, label)
            if key not in self.order:
                self.order.append(key)
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[key][0] += time.perf_counter() - w
                self.seconds[key][1] += time.process_time() - c
                self.graph = before

        setattr(owner, attr, property(timed) if is_property else timed)

    def table(self) -> str:
        rows = ["| graph | phase | wall s | CPU s |", "|---|---|---|---|"]
        rows += [f"| {g} | {p} | {self.seconds[g, p][0]:.2f} | {self.seconds[g, p][1]:.2f} |" for g, p in self.order]
        return "\n".join(rows)


def instrument() -> Phases:
    import onnx
    import onnx_ir
    import onnxscript.optimizer
    import onnxscript.rewriter.onnx_fusions
    from torch.onnx._internal.exporter import _capture_strategies, _core, _fx_passes, _onnx_program

    from seqexport.export import common, weights

    ph = Phases()
    ph.wrap(common, "export_graph", "export_graph (all of it)", graph_from=lambda m, a, spec, *r, **k: spec.name)
    for cls in _capture_strategies.CAPTURE_STRATEGIES:
        ph.wrap(cls, "_capture", "torch.export (tracing)")
    ph.wrap(_fx_passes, "decompose_with_registry", "run_decompositions (where not skipped)")
    ph.wrap(_fx_passes, "insert_type_promotion_nodes", "type promotion pass")
    ph.wrap(_core, "_exported_program_to_onnx_program", "translation to ONNX IR")
    ph.wrap(_onnx_program.ONNXProgram, "optimize", "onnxscript optimize (total)")
    ph.wrap(onnxscript.optimizer, "optimize_ir", "  optimize_ir (folding, rewrites)")
    ph.wrap(onnxscript.rewriter.onnx_fusions, "fuse", "  onnx_fusions.fuse")
    ph.wrap(onnx_ir.serde, "serialize_model", "IR -> ModelProto")
    ph.wrap(common, "keep_last_positions", "ours: keep_last_positions")
    ph.wrap(common, "_name_dims_as_spec", "ours: dims as the spec")
    ph.wrap(common, "save_graphs", "ours: save_graphs (all)", graph_from=lambda *a, **k: "all")
    ph.wrap(common, "share_weights", "ours: name + share weights")
    ph.wrap(weights.Weights, "write", "ours: write weights file")
    ph.wrap(onnx, "save_model", "onnx.save_model")
    ph.wrap(onnx.checker, "check_model", "onnx.checker (full_check)")
    ph.wrap(common, "source_record", "ours: checkpoint copy + hash", graph_from=lambda *a, **k: "all")
    ph.wrap(common, "graph_entry", "ours: manifest graph entries (hash)", graph_from=lambda *a, **k: "all")
    ph.wrap(common, "write_manifest", "ours: write manifest", graph_from=lambda *a, **k: "all")
    return ph


def phases(family: str, preset: str) -> None:
    ph = instrument()
    from seqexport import families
    from seqexport.checkpoints import resolve_model

    ckpt, preset = resolve_model(family, None, preset, 0)
    out = Path(tempfile.mkdtemp(prefix="bench_export_time-"))
    try:
        w, c = time.perf_counter(), time.process_time()
        families.get(family).export.export(ckpt, preset, out / "x", overwrite=True)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(ph.table())
    print(f"\n{family} {preset}: export {wall:.1f} s wall, {cpu:.1f} s CPU (load average {os.getloadavg()[0]:.1f})")


def marian_like(folder: Path) -> str:
    """Python that saves a Marian model of the transformer base preset's shape (d_model 512,
    8 heads, 6 + 6 layers, FFN 2048, vocabularies 10000; random weights) to `folder`."""
    return f"""
import torch
from transformers import MarianConfig, MarianMTModel
torch.manual_seed(0)
cfg = MarianConfig(vocab_size=10000, decoder_vocab_size=10000, d_model=512, encoder_layers=6, decoder_layers=6,
                   encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                   decoder_ffn_dim=2048, max_position_embeddings=512, pad_token_id=0, eos_token_id=1,
                   decoder_start_token_id=0, share_encoder_decoder_embeddings=False)
MarianMTModel(cfg).eval().save_pretrained({str(folder)!r})
"""


def timed_run(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU of the child and its children) seconds of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - w
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def compare(rounds: int, optimum_cli: str, threads: int) -> None:
    optimum_python = str(Path(optimum_cli).with_name("python"))
    seqexport_cli = str(Path(sys.executable).with_name("seqexport"))
    work = Path(tempfile.mkdtemp(prefix="bench_export_time-"))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        subprocess.run([optimum_python, "-c", marian_like(work / "marian")], check=True)
        runs = {
            "seqexport (encoder + decoder)": [seqexport_cli, "export", "transformer", "--preset", "base",
                                              "--out", str(work / "ours"), "--overwrite"],
            "optimum (encoder + decoder + decoder_with_past, merged)": [
                optimum_cli, "export", "onnx", "--model", str(work / "marian"),
                "--task", "text2text-generation-with-past", str(work / "optimum")],
        }
        times = {name: [] for name in runs}
        loads = []
        for r in range(rounds):
            for name, cmd in (runs.items() if r % 2 == 0 else reversed(runs.items())):
                shutil.rmtree(work / "optimum", ignore_errors=True)
                loads.append(os.getloadavg()[0])
                times[name].append(timed_run(cmd))
                print(f"round {r + 1} {name}: {times[name][-1][0]:.1f} s wall, {times[name][-1][1]:.1f} s CPU",
                      flush=True)
        print(f"\nmedians of {rounds} rounds, alternating, OMP_NUM_THREADS={threads}, "
              f"load average {min(loads):.1f}-{max(loads):.1f} over the runs:")
        med = {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
               for name, t in times.items()}
        for name, (w, c) in med.items():
            print(f"  {name}: {w:.1f} s wall, {c:.1f} s CPU")
        (ow, oc), (pw, pc) = med.values()
        print(f"  seqexport ÷ optimum: {ow / pw:.2f} wall, {oc / pc:.2f} CPU")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("phases")
    p.add_argument("--family", default="transformer")
    p.add_argument("--preset", default="base")
    c = sub.add_parser("compare")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--optimum", default="/tmp/optvenv/bin/optimum-cli")
    c.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.cmd == "phases":
        os.environ["SEQEXPORT_EXPORT_JOBS"] = "1"  # every graph in this process, where the phases are timed
        phases(args.family, args.preset)
    else:
        compare(args.rounds, args.optimum, args.threads)


if __name__ == "__main__":
    main()
