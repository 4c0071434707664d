"""`begin` (a prompt's prefill and first logits, as generate() starts) of two exports of one
Mamba or RWKV-7 model side by side: both loaded in one process, rounds alternating, medians and
the paired ratio NEW ÷ OLD.

    .venv/bin/python scripts/bench_begin.py OLD NEW --threads 1

Cases: one prompt of 25 tokens, four of 22-25, four of 9-41 (prompts of unequal length in one
ragged run) and one of 1024 tokens; ids drawn below both models' vocabulary.
"""

import argparse
import statistics
import time

import numpy as np

import seqexport.runtime as rt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15, help="rounds per case (3 for the 1024-token case)")
    args = p.parse_args()
    models = [rt.load(d, "cpu", threads=args.threads) for d in (args.old, args.new)]
    vocab = min(m.vocab_size for m in models)
    rng = np.random.default_rng(0)

    def ids(n: int) -> list[int]:
        return rng.integers(3, vocab, n).tolist()

    cases = {"1 x 25": [ids(25)], "4 x 22-25": [ids(25 - i) for i in range(4)],
             "4 x 9-41": [ids(n) for n in (9, 20, 33, 41)], "1 x 1024": [ids(1024)]}
    print(f"{'case':10} {'old ms':>9} {'new ms':>9} {'new/old (paired)':>17}")
    for name, rows in cases.items():
        rounds = 3 if name == "1 x 1024" else args.rounds
        times: list[list[float]] = [[], []]
        for m in models:
            m.begin(rows)  # warm-up
        for _ in range(rounds):
            for i, m in enumerate(models):
                t = time.perf_counter()
                m.begin(rows)
                times[i].append((time.perf_counter() - t) * 1e3)
        ratio = statistics.median(new / old for old, new in zip(*times))
        print(f"{name:10} {statistics.median(times[0]):9.2f} {statistics.median(times[1]):9.2f} {ratio:17.3f}")


if __name__ == "__main__":
    main()
