"""Mamba step graph by batch size, exports side by side: the runtime's `step` (one token per row,
the state fed back) at each batch, rounds alternating between the folders, medians.

    .venv/bin/python scripts/bench_mamba_step.py DIR [DIR ...] --batches 1 4 16 64 --threads 0 1

Prints per folder and thread count the median (or min) ms per step at each batch and its ratio to
batch 1 (threads 0: the runtime's default). With two folders, also the paired ratio
second/first at each batch (each round times both back to back).
"""

import argparse
import json
import statistics
import time

import numpy as np

import seqexport.runtime as rt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--threads", type=int, nargs="+", default=[0, 1])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--steps", type=int, default=10, help="steps timed per round")
    p.add_argument("--stat", choices=("median", "min"), default="median",
                   help="per-round figure to report (min: what a quiet machine sees, on a busy one)")
    args = p.parse_args()
    report = {}
    stat = min if args.stat == "min" else statistics.median
    for threads in args.threads:
        models = [rt.load(f, "cpu", threads=threads or None) for f in args.folders]
        for b in args.batches:
            ids = np.random.default_rng(0).integers(3, models[0].vocab_size, (b,))
            states = [m.step(ids, m.start(b))[1] for m in models]  # warm-up
            times = [[] for _ in models]
            for _ in range(args.rounds):
                for i, m in enumerate(models):
                    st = states[i]
                    t = time.perf_counter()
                    for _ in range(args.steps):
                        _, st = m.step(ids, st)
                    times[i].append((time.perf_counter() - t) / args.steps * 1e3)
            for f, ts in zip(args.folders, times, strict=True):
                report.setdefault(f"{f} t={threads}", {})[b] = round(stat(ts), 3)
            if len(models) == 2:
                paired = statistics.median(x / y for x, y in zip(times[1], times[0], strict=True))
                report.setdefault(f"second/first t={threads}", {})[b] = round(paired, 3)
    for key, by_batch in report.items():
        if key.startswith("second/first"):
            print(json.dumps({key: by_batch}))
            continue
        base = by_batch[args.batches[0]]
        print(json.dumps({key: {"ms": by_batch, f"ratio_to_b{args.batches[0]}":
                                {b: round(v / base, 2) for b, v in by_batch.items()}}}))


if __name__ == "__main__":
    main()
