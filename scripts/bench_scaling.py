"""Decode latency and cache/state size vs context: transformer `base`, mamba `130m`, rwkv `0.1b`,
mamba2 `130m` and the bundled hybrid (3 Mamba-2 layers + 1 attention layer: its cache grows in
one layer only).

    .venv/bin/python scripts/bench_scaling.py [--work exported] [--out docs] [--contexts 16 64 256 1024 4096]
                                              [--busy]

Refuses to run on a busy machine (1-minute load average above half the cores) unless --busy.

Exports the three presets (random weights) under --work unless already there, times the
runtime's one-token step on ORT CPU (and CUDA where onnxruntime offers it), and writes
<out>/scaling.json and <out>/scaling.png (the `plot` extra: matplotlib).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from seqexport.bench.scaling import DEFAULT_CONTEXTS, check_quiet, measure_scaling, plot_scaling

MODELS = {  # label: (family, preset, folder name, extra export options)
    "transformer base": ("transformer", "base", "transformer-base", []),
    "mamba 130m": ("mamba", "130m", "mamba-130m-loop", ["--scan", "loop"]),
    "rwkv 0.1b": ("rwkv", "0.1b", "rwkv-0.1b", []),
    "mamba2 130m": ("mamba2", "130m", "mamba2-130m", []),
    "hybrid (bundled)": ("hybrid", None, "hybrid-dates", []),  # None: the bundled trained model
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="exported", help="folder of the exports [exported]")
    ap.add_argument("--out", default="docs", help="where scaling.json and scaling.png go [docs]")
    ap.add_argument("--contexts", type=int, nargs="+", default=list(DEFAULT_CONTEXTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--busy", action="store_true", help="measure even on a busy machine (a warning)")
    args = ap.parse_args()
    check_quiet(args.busy, lambda msg: print(msg, file=sys.stderr))  # before minutes of exports

    folders = {}
    for label, (family, preset, name, extra) in MODELS.items():
        folder = Path(args.work) / name
        if not (folder / "manifest.json").exists():  # each export in its own process (DESIGN §6)
            chosen = ["--preset", preset] if preset else []
            subprocess.run([sys.executable, "-m", "seqexport.cli", "export", family, *chosen,
                            "--out", str(folder), *extra], check=True)
        folders[label] = folder
    result = measure_scaling(folders, args.contexts, threads=args.threads, repeats=args.repeats,
                             log=lambda msg: print(msg, file=sys.stderr), allow_busy=args.busy)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(result, indent=2) + "\n")
    png = plot_scaling(result, out / "scaling.png")
    for m in result["models"]:
        cells = "  ".join(f"T={p['context']}: {p['step_ms']:.2f} ms, {p['state_bytes'] / 2**20:.2f} MiB"
                          for p in m["points"])
        print(f"{m['label']} ({m['provider']}, bound {m['bound_ms']:.2f} ms): {cells}")
        a = m["artifact"]
        print(f"  on disk {a['total_bytes'] / 1e6:.1f} MB (graphs {a['graph_bytes'] / 1e6:.1f}, weights "
              f"{a['weights_file_bytes'] / 1e6:.1f}, checkpoint {a['checkpoint_bytes'] / 1e6:.1f}); export "
              f"{a['export_seconds']} s; load {m['load_seconds']:.2f} s, +{m['rss_added_by_load_bytes'] / 1e6:.0f} MB RSS")
    print(f"wrote {out / 'scaling.json'} and {png} ({png.stat().st_size / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
