"""Prompts of unequal length prefilled in one run (the prefill graph's attention mask) against a
run per prompt length (what exports without the mask do), side by side in one process on one
export: `begin` over the prompts, and `generate()` of a few tokens for them, medians.

    .venv/bin/python scripts/bench_ragged_prefill.py exported/rwkv-dates --prompts 50 --threads 2

The prompts are the date task's (seqexport.bench.serve.bench_prompts). Also prints the largest
difference between the two ways' first logits (the head's batched GEMM; the states are equal).
"""

import argparse

import numpy as np

import seqexport.runtime as rt
from seqexport.bench.serve import bench_prompts
from seqexport.bench.timing import time_paired


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=12, help="tokens generate() makes per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    model = rt.load(args.folder, provider="cpu", threads=args.threads)
    if not model.ragged_prefill:
        raise SystemExit(f"{args.folder}: its prefill graph takes no attention_mask (export it again)")
    prompts = bench_prompts(model, args.prompts)
    options = rt.SearchOptions(max_new_tokens=args.tokens, eos_id=-1)

    def ragged(on: bool):  # the runtime's own switch, per call
        model.__dict__["ragged_prefill"] = on

    ragged(True)
    together, _ = model.begin(prompts)
    ragged(False)
    per_length, _ = model.begin(prompts)
    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens; "
          f"largest first-logit difference {float(np.abs(together - per_length).max()):.1e}")
    fns = {"begin, one run": lambda: (ragged(True), model.begin(prompts)),
           "begin, a run per length": lambda: (ragged(False), model.begin(prompts)),
           f"generate {args.tokens}, one run": lambda: (ragged(True), rt.generate(model, prompts, options)),
           f"generate {args.tokens}, a run per length": lambda: (ragged(False), rt.generate(model, prompts, options))}
    for name, seconds in time_paired(fns, args.repeats, 0.3).items():
        print(f"{name:32s} {seconds * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
