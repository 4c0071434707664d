"""`begin` (a prompt's prefill and first logits, as generate() starts) of two exports of one
Mamba or RWKV-7 model side by side: both loaded in one process, rounds alternating
(`seqexport.bench.timing.time_paired`), medians and their ratio NEW ÷ OLD.

    .venv/bin/python scripts/bench_begin.py OLD NEW --threads 1

Cases: one prompt of 25 tokens, four of 22-25, four of 9-41 (prompts of unequal length in one
ragged run) and one of 1024 tokens; ids drawn below both models' vocabulary.
"""

import argparse

import numpy as np

import seqexport.runtime as rt
from seqexport.bench.timing import time_paired


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7, help="rounds per case")
    args = p.parse_args()
    models = {"old": rt.load(args.old, "cpu", threads=args.threads), "new": rt.load(args.new, "cpu", threads=args.threads)}
    vocab = min(m.vocab_size for m in models.values())
    rng = np.random.default_rng(0)

    def ids(n: int) -> list[int]:
        return rng.integers(3, vocab, n).tolist()

    cases = {"1 x 25": [ids(25)], "4 x 22-25": [ids(25 - i) for i in range(4)],
             "4 x 9-41": [ids(n) for n in (9, 20, 33, 41)], "1 x 1024": [ids(1024)]}
    print(f"{'case':10} {'old ms':>9} {'new ms':>9} {'new/old':>8}")
    for name, rows in cases.items():
        s = time_paired({k: (lambda m=m, rows=rows: m.begin(rows)) for k, m in models.items()}, args.repeats, 0.05)
        print(f"{name:10} {s['old'] * 1e3:9.2f} {s['new'] * 1e3:9.2f} {s['new'] / s['old']:8.3f}")


if __name__ == "__main__":
    main()
