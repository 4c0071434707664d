"""Train the bundled mamba date normaliser on the CPU, score it on held-out dates, save it.

    .venv/bin/python scripts/train_mamba.py [--steps N] [--out DIR] [--eval-n N] [--seed S]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from seqexport.train import TRAIN_CONFIGS, train_and_save  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TRAIN_CONFIGS["mamba"].steps, help="optimiser steps")
    parser.add_argument("--out", default="models/pretrained/mamba-dates", help="checkpoint folder to write")
    parser.add_argument("--eval-n", type=int, default=1000, help="held-out pairs to score")
    parser.add_argument("--seed", type=int, default=0, help="seed of init, training data and eval data")
    args = parser.parse_args(argv)
    train_and_save("mamba", args.out, steps=args.steps, eval_n=args.eval_n, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
