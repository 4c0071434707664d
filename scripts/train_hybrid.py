"""Train the bundled hybrid date normaliser on the CPU, score it on held-out dates, save it.

    .venv/bin/python scripts/train_hybrid.py [--steps N] [--out DIR] [--eval-n N] [--seed S]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from seqexport.training.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("hybrid"))
