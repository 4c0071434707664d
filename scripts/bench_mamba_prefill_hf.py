"""Mamba prefill against transformers' own `MambaForCausalLM` (its torch path: no CUDA kernels
here) and our eager model with the sequential reference scan, on the same weights, paired
rounds in one process, every side at the same thread count.

    .venv/bin/python scripts/bench_mamba_prefill_hf.py write HF_DIR [--preset 130m]
    seqexport export mamba --checkpoint HF_DIR --out DIR
    .venv/bin/python scripts/bench_mamba_prefill_hf.py time HF_DIR DIR [--length 1024] [--rounds 3] [--threads 2]

`write` saves a randomly initialised MambaForCausalLM of a preset's shape (the 130m preset:
hidden 768, 24 layers, state 16, vocabulary 50280) with `save_pretrained`. `time` runs, in
turn each round: ORT's prefill as generation runs it (the last position's logits), HF's forward
with `logits_to_keep=1` (likewise) and with every position's logits, and our eager forward
with the reference scan; it prints medians and ORT ÷ each, as medians of per-round ratios, and
the largest difference of the last position's logits (the same weights on every side).
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def write(hf_dir: Path, preset: str) -> None:
    import transformers

    from seqexport.families.mamba import FAMILY

    shape = FAMILY.presets[preset]
    cfg = transformers.MambaConfig(hidden_size=shape["d_model"], num_hidden_layers=shape["n_layer"],
                                   state_size=shape["d_state"], vocab_size=shape["vocab_size"])
    torch.manual_seed(0)
    transformers.MambaForCausalLM(cfg).eval().save_pretrained(hf_dir)
    print(f"wrote {hf_dir}: MambaForCausalLM {preset} shape")


def time_all(hf_dir: Path, folder: Path, length: int, rounds: int, threads: int) -> dict:
    import transformers

    import seqexport.runtime as rt
    from seqexport.manifest import read_manifest
    from seqexport.parity.validate import eager_checkpoint

    torch.set_num_threads(threads)
    hf = transformers.MambaForCausalLM.from_pretrained(hf_dir).eval()
    ours = eager_checkpoint(folder, read_manifest(folder, verify=False), None).model.eval()
    m = rt.load(folder, "cpu", threads=threads)
    ids = np.random.default_rng(0).integers(0, m.vocab_size, (1, length))  # (1, L)
    tids = torch.from_numpy(ids)
    fns = {"ort_last": lambda: m.step(ids, m.start(1), last_only=True),
           "hf_last": lambda: hf(tids, logits_to_keep=1, use_cache=False).logits,
           "hf_all": lambda: hf(tids, use_cache=False).logits,
           "eager_ref": lambda: ours(tids)[0]}
    t = {k: [] for k in fns}
    last = {}
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up
            for k, f in fns.items():
                s = time.perf_counter()
                out = f()
                if r:
                    t[k].append(time.perf_counter() - s)
                else:
                    last[k] = np.asarray(out[0] if k == "ort_last" else out)[..., -1, :]  # (1, v) or (v,)
    diff = {k: float(np.abs(np.asarray(v).reshape(-1)[: m.vocab_size] - last["ort_last"].reshape(-1)).max())
            for k, v in last.items() if k != "ort_last"}
    return {"length": length, "rounds": rounds, "threads": threads, "load_avg": os.getloadavg(),
            "median_s": {k: round(statistics.median(v), 3) for k, v in t.items()},
            "ort_last_over": {k: round(statistics.median(a / b for a, b in zip(t["ort_last"], v)), 3)
                              for k, v in t.items() if k != "ort_last"},
            "last_logits_max_abs_diff_vs_ort": diff}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="save a random MambaForCausalLM of a preset's shape")
    w.add_argument("hf_dir", type=Path)
    w.add_argument("--preset", default="130m")
    b = sub.add_parser("time", help="paired rounds: ORT, HF, our eager reference")
    b.add_argument("hf_dir", type=Path)
    b.add_argument("folder", type=Path, help="`seqexport export mamba --checkpoint HF_DIR` of the same weights")
    b.add_argument("--length", type=int, default=1024)
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.cmd == "write":
        write(args.hf_dir, args.preset)
    else:
        print(json.dumps(time_all(args.hf_dir, args.folder, args.length, args.rounds, args.threads)))


if __name__ == "__main__":
    main()
