"""The engine at another git revision beside the engine in this tree, in one process, runs
alternating (medians): closed-loop clients, the same seeded requests as `bench-serve`.

    .venv/bin/python scripts/bench_engine_ab.py exported/transformer-dates --rev HEAD~1 --repeats 8 [--pin-threads]

The other engine is read with `git show`: the package `seqexport/runtime/engine/` (its imports of
itself pointed at the copy), or at revisions before it was a package the module
`seqexport/runtime/engine.py`; it runs over this tree's runtime (so only changes inside the engine
are compared: for changes elsewhere, alternate fresh processes of two worktrees). `--export-b
FOLDER` instead runs this tree's engine over two exports of one model (e.g. `--attention
fused` beside the default), each ratio over its own export's one at a time. Each repeat
times generate() one at a time, then both engines, in an order that swaps every repeat; each
engine's ratio is the median of the repeats' own ratios (engine ÷ that repeat's one at a time).
"""

import argparse
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import seqexport.runtime as rt
from seqexport.bench.serve import _options, batched, bench_prompts, continuous
from seqexport.runtime import engine as engine_here

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "seqexport/runtime/engine"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True, cwd=ROOT).stdout


def engine_at(rev: str):
    """The engine module or package at `rev`, imported under the name `engine_at_rev`."""
    folder = Path(tempfile.mkdtemp()) / "engine_at_rev"
    folder.mkdir()
    files = git("ls-tree", "--name-only", f"{rev}:seqexport/runtime/").split()
    if "engine" in files:  # the package: its imports of itself pointed at the copy
        for name in git("ls-tree", "--name-only", f"{rev}:{PACKAGE}/").split():
            text = git("show", f"{rev}:{PACKAGE}/{name}").replace("seqexport.runtime.engine", "engine_at_rev")
            (folder / name).write_text(text)
    else:
        (folder / "__init__.py").write_text(git("show", f"{rev}:{PACKAGE}.py"))
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module("engine_at_rev")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder")
    other = p.add_mutually_exclusive_group(required=True)
    other.add_argument("--rev", help="git revision of the other engine")
    other.add_argument("--export-b", help="a second export of the model, run by this tree's engine")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=32, help="each request asks for a quarter of it to all of it")
    p.add_argument("--pin-threads", action="store_true", help="both engines with pin_threads (Linux, two CPUs or more)")
    args = p.parse_args(argv)
    model = rt.load(args.folder, provider="cpu", threads=args.threads)
    prompts = bench_prompts(model, args.requests)
    counts = np.random.default_rng(1).integers(max(1, args.max_tokens // 4), args.max_tokens + 1, args.requests)
    work = [(q, int(n)) for q, n in zip(prompts, counts)]
    if args.rev:
        ways = {f"engine at {args.rev}": (engine_at(args.rev), model), "engine here": (engine_here, model)}
    else:
        ways = {args.folder: (engine_here, model),
                args.export_b: (engine_here, rt.load(args.export_b, provider="cpu", threads=args.threads))}
    for _, m in ways.values():
        rt.generate(m, prompts[:2], _options(args.max_tokens))  # warm up ORT's kernels
    pin = {"pin_threads": True} if args.pin_threads else {}
    runs: dict[str, list] = {name: [] for name in ways}
    for i in range(args.repeats):
        ones = {}
        for name in (list(ways) if i % 2 == 0 else list(ways)[::-1]):
            package, m = ways[name]
            if id(m) not in ones:
                ones[id(m)] = batched(m, work, 1)["tokens_per_s"]
            engine = package.Engine(m, max_rows=args.clients, max_queue=args.requests, **pin).start()
            try:
                r = continuous(engine, work, args.clients)
            finally:
                engine.close()
            runs[name].append((r["tokens_per_s"], r["tokens_per_s"] / ones[id(m)], r["token_p50_ms"], r["ttft_p50_ms"]))
        print(f"repeat {i + 1}: one at a time " + "/".join(f"{o:.0f}" for o in ones.values()) + " tok/s; " +
              ", ".join(f"{name} {rows[-1][1]:.2f}x" for name, rows in runs.items()), flush=True)
    print(f"{args.folder}: {args.clients} clients, {args.requests} requests, {args.repeats} alternating repeats, medians")
    for name, rows in runs.items():
        a = np.median(np.array(rows), axis=0)
        print(f"  {name}: {a[0]:.0f} tok/s, {a[1]:.2f}x one at a time (each: " +
              " ".join(f"{r[1]:.2f}" for r in rows) + f"), per-token p50 {a[2]:.2f} ms, first token p50 {a[3]:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
