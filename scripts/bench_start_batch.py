"""The engine's starter with newcomers prefilled one at a time or several in one run, side by
side in one process: `Engine(start_batch=N)` for each N, rounds alternating, and the same
requests one at a time through generate(), medians.

    .venv/bin/python scripts/bench_start_batch.py exported/rwkv-dates --start-batch 1 4 --repeats 8

Closed-loop clients as `seqexport bench-serve` (seqexport.bench.serve.continuous); requests of
12-48 tokens; ONNX Runtime with one intra-op thread. Prints tokens/s (and ÷ one at a time),
per-token and first-token p50, and the rows a batched step ran on average.
"""

import argparse
import collections

import numpy as np

from seqexport.runtime.engine import Engine
from seqexport.runtime.models import load
from seqexport.serve import bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--start-batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args()

    model = load(args.folder, threads=1)
    prompts = bench.bench_prompts(model, args.requests)
    counts = np.random.default_rng(1).integers(12, 49, args.requests)
    work = [(p, int(n)) for p, n in zip(prompts, counts)]
    bench.generate(model, prompts[:2], bench._options(48))  # warm up ORT's kernels
    runs, alone = collections.defaultdict(list), []
    for _ in range(args.repeats):
        alone.append(bench.batched(model, work[:64], 1)["tokens_per_s"])
        for n in args.start_batch:
            engine = Engine(model, max_rows=args.clients, max_queue=args.requests, start_batch=n).start()
            try:
                r = bench.continuous(engine, work, args.clients)
            finally:
                engine.close()
            runs[n].append((r["tokens_per_s"], r["token_p50_ms"], r["ttft_p50_ms"], r["tokens"] / max(engine.steps, 1)))
    one = float(np.median(alone))
    print(f"{args.folder}: one at a time {one:.0f} tok/s (runs {[round(x) for x in alone]})")
    for n, values in runs.items():
        a = np.array(values)  # (repeats, 4)
        print(f"start_batch {n}: {np.median(a[:, 0]):.0f} tok/s ({np.median(a[:, 0]) / one:.2f}x one at a time; "
              f"runs {np.round(a[:, 0]).astype(int).tolist()}), per-token p50 {np.median(a[:, 1]):.2f} ms, "
              f"first token p50 {np.median(a[:, 2]):.1f} ms, rows a step {np.median(a[:, 3]):.1f}")


if __name__ == "__main__":
    main()
