"""Mamba prefill, paired rounds: the eager model's forward with the sequential reference scan
(torch at 1 thread: on a busy 2-core machine its 2-thread barriers stall) against the runtime's
prefill as generation runs it (the last position's logits) and with every position's.

    .venv/bin/python scripts/bench_prefill_ratio.py DIR[,DIR2...] LENGTH ROUNDS [ORT_THREADS [TORCH_THREADS]]

ORT_THREADS defaults to 2, TORCH_THREADS to 1; give both the same count to compare like with
like on a quiet machine. Several folders (exports of the same checkpoint, e.g. before and after a
change) are timed in the same rounds, each against the eager model of the first; their keys
then carry the folder's position (ort_last_1, ...), and ort_last_1/ort_last_0 is the median of
the per-round ratios to the first folder. Every round's seconds are printed too (rounds_s).
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import seqexport.runtime as rt
from seqexport.manifest import read_manifest
from seqexport.parity.validate import eager_checkpoint

folders, L, rounds = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
torch_threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
torch.set_num_threads(torch_threads)
models = [rt.load(f, 'cpu', threads=int(sys.argv[4]) if len(sys.argv) > 4 else 2) for f in folders]
model = eager_checkpoint(Path(folders[0]), read_manifest(folders[0], verify=False), None).model.eval()
ids = np.random.default_rng(0).integers(0, models[0].vocab_size, (1, L))
tids = torch.from_numpy(ids)
EAGER = f"eager_ref_{torch_threads}t"
fns = {EAGER: lambda: model(tids)}
for i, m in enumerate(models):
    tag = f"_{i}" if len(models) > 1 else ""
    fns[f"ort_last{tag}"] = lambda m=m: m.step(ids, m.start(1), last_only=True)  # falls back to all without the input
    fns[f"ort_all{tag}"] = lambda m=m: m.step(ids, m.start(1))
t = {k: [] for k in fns}
with torch.inference_mode():
    for r in range(rounds + 1):
        for k, f in fns.items():
            s = time.perf_counter()
            f()
            if r:  # round 0 warms up
                t[k].append(time.perf_counter() - s)
med = {k: statistics.median(v) for k, v in t.items()}
ratio = {f"{k}/eager": statistics.median(a / b for a, b in zip(t[k], t[EAGER])) for k in fns if k != EAGER}
for k in fns:  # a later folder against the first, round by round (before/after a change)
    first = k.rsplit("_", 1)[0] + "_0"
    if len(models) > 1 and k.startswith("ort_") and k != first:
        ratio[f"{k}/{first}"] = statistics.median(a / b for a, b in zip(t[k], t[first]))
print(json.dumps({"folder": sys.argv[1], "L": L, "rounds": rounds, "load_avg": [round(x, 2) for x in os.getloadavg()],
                  "median_s": {k: round(v, 3) for k, v in med.items()},
                  "paired_ratio": {k: round(v, 3) for k, v in ratio.items()},
                  "rounds_s": {k: [round(x, 3) for x in v] for k, v in t.items()}}))
