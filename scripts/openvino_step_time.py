"""One-token step time of an exported recurrent model (Mamba, Mamba-2, RWKV-7, hybrid) on
OpenVINO beside ONNX Runtime, one thread each, in alternating rounds (`bench.timing.time_paired`):

    python scripts/openvino_step_time.py exported/rwkv-dates [--batch 1] [--past 16]

Each runtime steps its own copy of the same state, built from the same `past` prompt tokens.
"""

import argparse

import numpy as np

from seqexport.bench.timing import time_paired
from seqexport.runtime.models import load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--past", type=int, default=16, help="prompt tokens before the timed step")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    models = {rt: load(args.folder, provider="cpu", threads=1, runtime=rt) for rt in ("onnxruntime", "openvino")}
    rng = np.random.default_rng(0)
    vocab = next(iter(models.values())).vocab_size
    prompt = rng.integers(1, vocab, (args.batch, args.past))  # (b, past)
    token = rng.integers(1, vocab, (args.batch, 1))  # (b, 1)
    fns = {}
    for name, m in models.items():
        _, state = m.step(prompt, m.start(args.batch))
        fns[name] = lambda m=m, state=state: m.step(token, state)
    ms = {k: v * 1e3 for k, v in time_paired(fns, args.rounds, 0.5).items()}
    print(f"{args.folder} batch {args.batch} past {args.past}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items())
          + f"; openvino / onnxruntime {ms['openvino'] / ms['onnxruntime']:.2f}")


if __name__ == "__main__":
    main()
