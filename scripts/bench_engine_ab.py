"""The engine at another git revision beside the engine in this tree, in one process, runs
alternating (medians): 16 closed-loop clients, the same seeded requests as `bench-serve`.

    .venv/bin/python scripts/bench_engine_ab.py /tmp/sx/transformer-dates --rev 3ecde91~2 --repeats 3

The old engine module is read with `git show REV:seqexport/runtime/engine.py` and runs over
this tree's runtime (its model methods `join`/`take`/`begin` are kept for it). Also timed:
one at a time through generate() and static batches of 16, for the ratios.
"""

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import seqexport.runtime as rt
from seqexport.bench.serve import batched, bench_prompts, continuous
from seqexport.runtime import engine as new_engine


def engine_at(rev: str):
    source = subprocess.run(["git", "show", f"{rev}:seqexport/runtime/engine.py"], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).parent.parent).stdout
    path = Path(tempfile.mkdtemp()) / "engine_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("engine_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder")
    p.add_argument("--rev", required=True, help="git revision of the other engine")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args(argv)
    model = rt.load(args.folder, provider="cpu", threads=args.threads)
    prompts = bench_prompts(model, 64)
    counts = np.random.default_rng(1).integers(max(1, args.max_tokens // 4), args.max_tokens + 1, 64)
    work = [(q, int(n)) for q, n in zip(prompts, counts)]
    engines = {f"engine at {args.rev}": engine_at(args.rev), "engine here": new_engine}
    runs: dict[str, list] = {name: [] for name in engines}
    one, static = [], []
    for _ in range(args.repeats):
        for name, module in engines.items():
            engine = module.Engine(model, max_rows=args.clients, max_queue=64).start()
            try:
                r = continuous(engine, work, args.clients)
            finally:
                engine.close()
            runs[name].append((r["tokens_per_s"], r["token_p50_ms"], r["ttft_p50_ms"]))
        one.append(batched(model, work, 1)["tokens_per_s"])
        static.append(batched(model, work, args.clients)["tokens_per_s"])
    base = float(np.median(one))
    print(f"{args.folder}: {args.clients} clients, {args.repeats} alternating runs, medians; "
          f"one at a time {base:.0f} tok/s, static {np.median(static):.0f} ({np.median(static) / base:.2f}x)")
    for name, rows in runs.items():
        a = np.median(np.array(rows), axis=0)
        print(f"  {name}: {a[0]:.0f} tok/s ({a[0] / base:.2f}x one at a time), per-token p50 {a[1]:.2f} ms, "
              f"first token p50 {a[2]:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
