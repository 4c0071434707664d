"""int8 beside float32, measured side by side in one run: file sizes, the runtime's one-token step
(medians, timed in blocks: alternating call by call thrashes the cache), held-out exact match of
the bundled date models, and teacher-forced top-1 agreement with the float32 eager model.

    .venv/bin/python scripts/int8_report.py FP32_DIR INT8_DIR [--held-out 1000] [--repeats 7]
"""

import argparse
import json
from pathlib import Path

import numpy as np

from seqexport import families
from seqexport.bench.timing import time_paired
from seqexport.parity.validate import validate
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load
from seqexport.runtime.tokenizer import encode_prompt


def size_mb(folder: Path) -> float:
    """Graph files plus the shared weights file (exports before it: the graphs' own data files)."""
    m = json.loads((folder / "manifest.json").read_text())
    weights = (m.get("weights") or {}).get("bytes", 0)
    return (sum(g["bytes"] + g.get("data_bytes", 0) for g in m["graphs"].values()) + weights) / 1e6


def exact_match(model, n: int) -> float:
    from seqexport.training.dates import make_split

    pairs = make_split("test", n, seed=0)
    record = model.manifest["tokenizer"]
    prompts = [encode_prompt(model.tokenizer, model.prompt_frame, x, record) for x, _ in pairs]
    out = []
    for i in range(0, n, 50):
        out += generate(model, prompts[i : i + 50], SearchOptions(max_new_tokens=16))
    return sum(model.tokenizer.decode(o) == y for o, (_, y) in zip(out, pairs)) / n


def teacher_forced_agreement(folder: Path, steps: int):
    """validate's teacher-forced check alone (int8 rule, seed 0, batch 2) against the eager model."""
    from seqexport.manifest import read_manifest
    from seqexport.parity import checks
    from seqexport.parity.validate import eager_checkpoint

    manifest = read_manifest(folder)
    model = eager_checkpoint(folder, manifest, None).model.float().eval()
    rt = load(folder, "cpu")
    rng = np.random.default_rng(0)
    cases = families.get(manifest["family"]).parity.Cases(model, rt, rng, 2, "cpu")
    return checks.teacher_forced(rt, cases, steps, 1e-4, 1e-3, rng, checks.QuantRule())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("fp32", type=Path)
    p.add_argument("int8", type=Path)
    p.add_argument("--held-out", type=int, default=0, help="exact match over this many held-out dates (bundled)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=64, help="decode state as after this many tokens")
    p.add_argument("--teacher-forced-only", action="store_true", help="agreement from the teacher-forced decode alone")
    args = p.parse_args()
    models = {k: load(f, "cpu", threads=args.threads) for k, f in (("fp32", args.fp32), ("int8", args.int8))}
    rng = np.random.default_rng(0)
    bench = families.get(models["fp32"].family).bench
    context = min(args.context, bench.check_contexts(models["fp32"].config, None, (args.context, 16))[0])
    state = bench.decode_state(models["fp32"], 1, context, rng, bench.PROMPT_LEN[False])
    tokens = rng.integers(1, models["fp32"].vocab_size, 1, dtype=np.int64)
    med = time_paired({k: (lambda m=m: m.step(tokens, state)) for k, m in models.items()}, args.repeats, 0.2)
    print(f"step (batch 1, context {context}): fp32 {med['fp32'] * 1e3:.3f} ms, int8 {med['int8'] * 1e3:.3f} ms, "
          f"int8/fp32 {med['int8'] / med['fp32']:.2f}")
    print(f"size: fp32 {size_mb(args.fp32):.1f} MB, int8 {size_mb(args.int8):.1f} MB")
    if args.teacher_forced_only:  # a large preset: validate's eager no-cache decodes take long
        c = teacher_forced_agreement(args.int8, 32)
        print(f"{c.check}: {c.label} {c.note} -> {'ok' if c.passed else 'FAIL'}")
    else:
        report = validate(args.int8, steps=32, write_summary=False)
        for c in report.cases:
            if c.check != "graphs":
                print(f"{c.check}: {c.label} {c.note} -> {'ok' if c.passed else 'FAIL'}")
    if args.held_out:
        print(f"held-out exact match over {args.held_out}: fp32 {exact_match(models['fp32'], args.held_out):.1%}, "
              f"int8 {exact_match(models['int8'], args.held_out):.1%}")


if __name__ == "__main__":
    main()
