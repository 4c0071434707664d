"""Prepacked shared weights against the mapped pages: one Mamba or RWKV-7 export loaded both ways, its step
(one token per row, the state fed back) at each batch and `begin` over mixed-length prompts,
rounds alternating, medians and paired ratios.

    .venv/bin/python scripts/bench_prepack.py DIR --batches 1 4 16 --threads 1

"packed" is the runtime's default for weights of at most `PACK_SHARED_BYTES` (the bundled
models); "pages" is what a larger model gets: sessions that read the one mapped weights file
(prepacking off where two graphs read a weight).
"""

import argparse
import json
import statistics
import time

import numpy as np

import seqexport.runtime as rt
import seqexport.runtime.session as session


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=20, help="steps timed per round")
    args = p.parse_args()
    default = session.PACK_SHARED_BYTES
    session.PACK_SHARED_BYTES = 0
    pages = rt.load(args.folder, "cpu", threads=args.threads)
    session.PACK_SHARED_BYTES = default
    packed = rt.load(args.folder, "cpu", threads=args.threads)
    models = {"pages": pages, "packed": packed}
    rng = np.random.default_rng(0)
    report = {}

    def paired(name, run):
        times = {k: [] for k in models}
        for _ in range(args.rounds):
            for k, m in models.items():
                times[k].append(run(k, m))
        ratio = statistics.median(b / a for a, b in zip(times["pages"], times["packed"], strict=True))
        report[name] = {k: round(statistics.median(v), 3) for k, v in times.items()} | {"packed/pages": round(ratio, 3)}

    for b in args.batches:
        ids = rng.integers(3, packed.vocab_size, (b,))
        states = {k: m.step(ids, m.start(b))[1] for k, m in models.items()}  # warm-up

        def steps(k, m, ids=ids, states=states):
            st = states[k]
            t = time.perf_counter()
            for _ in range(args.steps):
                _, st = m.step(ids, st)
            return (time.perf_counter() - t) / args.steps * 1e3

        paired(f"step ms, batch {b}", steps)
    prompts = [rng.integers(3, packed.vocab_size, n).tolist() for n in (12, 20, 28, 36)]

    def begin(k, m):
        t = time.perf_counter()
        m.begin(prompts)
        return (time.perf_counter() - t) * 1e3

    paired("begin ms, 4 prompts of 12-36 tokens", begin)
    for name, row in report.items():
        print(json.dumps({name: row}))


if __name__ == "__main__":
    main()
