"""Decode latency and cache/state size vs context: transformer `base` (float32 and int4), mamba
`130m` (float32 and int4), rwkv `0.1b`, mamba2 `130m` and the bundled hybrid (3 Mamba-2 layers +
1 attention layer: its cache grows in one layer only).

    .venv/bin/python scripts/bench_scaling.py [--work exported] [--out docs] [--contexts 16 64 256 1024 4096]
                                              [--rounds 3] [--busy]

Refuses to run on a busy machine (1-minute load average above half the cores, checked before
each round) unless --busy.

Exports the presets (random weights) and their int4 copies under --work unless already there,
then times the runtime's one-token step on ORT CPU (and CUDA where onnxruntime offers it) in
--rounds alternating rounds, each model in a fresh process, and writes the medians (each
point's rounds beside it) to <out>/scaling.json and <out>/scaling.png (the `plot` extra:
matplotlib).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from seqexport.bench.scaling import (
    DEFAULT_CONTEXTS,
    check_quiet,
    measure_scaling,
    merge_rounds,
    plot_scaling,
)
from seqexport.errors import UsageError

MODELS = {  # label: (family, preset, folder name, extra export options, quantised from (folder name, bits))
    "transformer base": ("transformer", "base", "transformer-base", [], None),
    "transformer base int4": ("transformer", "base", "transformer-base-int4", [], ("transformer-base", 4)),
    "mamba 130m": ("mamba", "130m", "mamba-130m-loop", ["--scan", "loop"], None),
    "mamba 130m int4": ("mamba", "130m", "mamba-130m-loop-int4", [], ("mamba-130m-loop", 4)),
    "rwkv 0.1b": ("rwkv", "0.1b", "rwkv-0.1b", [], None),
    "mamba2 130m": ("mamba2", "130m", "mamba2-130m", [], None),
    "hybrid (bundled)": ("hybrid", None, "hybrid-dates", [], None),  # None: the bundled trained model
}


def _cli(*args):  # each export or quantisation in its own process (DESIGN §6)
    subprocess.run([sys.executable, "-m", "seqexport.cli", *args], check=True)


def _ensure(work: Path) -> dict[str, Path]:
    folders = {}
    for label, (family, preset, name, extra, quantised) in MODELS.items():
        folder = work / name
        if not (folder / "manifest.json").exists():
            if quantised:
                _cli("quantize", str(work / quantised[0]), "--out", str(folder), "--bits", str(quantised[1]))
            else:
                _cli("export", family, *(["--preset", preset] if preset else []), "--out", str(folder), *extra)
        folders[label] = folder
    return folders


def _one_round(folders: dict[str, Path], args, log) -> dict:
    """Every model once, each in a fresh process (no model's pages or threads linger into the next)."""
    parts = []
    for label, folder in folders.items():
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "part.json"
            subprocess.run([sys.executable, __file__, "--one", label, str(folder), str(part), "--threads",
                            str(args.threads), "--repeats", str(args.repeats), "--contexts",
                            *map(str, args.contexts)], check=True)
            parts.append(json.loads(part.read_text()))
    return {**parts[0], "models": [m for p in parts for m in p["models"]],
            "bandwidth_gbs": float(np.median([p["bandwidth_gbs"] for p in parts])),
            "load_average_end": parts[-1]["load_average_end"]}


def _settle(busy: bool, log, wait_s: float = 300.0) -> None:
    """Wait (up to `wait_s`) for the load average to fall below the quiet mark: the exports just
    run raised it, and the 1-minute average lags; then check as the study does."""
    end = time.monotonic() + wait_s
    while not busy and time.monotonic() < end:
        try:
            check_quiet()
            return
        except UsageError:
            time.sleep(10)
    check_quiet(busy, log)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="exported", help="folder of the exports [exported]")
    ap.add_argument("--out", default="docs", help="where scaling.json and scaling.png go [docs]")
    ap.add_argument("--contexts", type=int, nargs="+", default=list(DEFAULT_CONTEXTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; each point is their median [3]")
    ap.add_argument("--busy", action="store_true", help="measure even on a busy machine (a warning)")
    ap.add_argument("--one", nargs=3, metavar=("LABEL", "FOLDER", "JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    if args.one:  # a child: one model, one round (the parent checked the load)
        label, folder, out = args.one
        # the parent checked the load before the round; what it reads now is this study's own
        result = measure_scaling({label: folder}, args.contexts, threads=args.threads, repeats=args.repeats,
                                 log=lambda m: None if m.startswith("warning: the machine is busy") else log(m),
                                 allow_busy=True)
        Path(out).write_text(json.dumps(result))
        return
    _settle(args.busy, log)  # before minutes of exports (a job that just ended lifts the 1-minute average)
    folders = _ensure(Path(args.work))
    rounds = []
    for r in range(args.rounds):
        _settle(args.busy, log)  # each round: another job may have started
        log(f"round {r + 1} of {args.rounds}")
        rounds.append(_one_round(folders, args, log))
    result = merge_rounds(rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(result, indent=2) + "\n")
    png = plot_scaling(result, out / "scaling.png")
    for m in result["models"]:
        cells = "  ".join(f"T={p['context']}: {p['step_ms']:.2f} ms "
                          f"({'/'.join(f'{t:.1f}' for t in p['step_ms_rounds'])}), {p['state_bytes'] / 2**20:.2f} MiB"
                          for p in m["points"])
        print(f"{m['label']} ({m['provider']}, bound {m['bound_ms']:.2f} ms): {cells}")
        a = m["artifact"]
        print(f"  on disk {a['total_bytes'] / 1e6:.1f} MB (graphs {a['graph_bytes'] / 1e6:.1f}, weights "
              f"{a['weights_file_bytes'] / 1e6:.1f}, checkpoint {a['checkpoint_bytes'] / 1e6:.1f}); export "
              f"{a['export_seconds']} s; load {m['load_seconds']:.2f} s, +{m['rss_added_by_load_bytes'] / 1e6:.0f} MB RSS")
    print(f"wrote {out / 'scaling.json'} and {png} ({png.stat().st_size / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
