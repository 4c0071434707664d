"""A prefill against transformers' own model class (its torch path: no CUDA kernels here) on the
same weights, paired rounds in one process, every side at the same thread count: Mamba
(`MambaForCausalLM`, and our eager model with the sequential reference scan) or Qwen3.5
(`Qwen3_5ForCausalLM`).

    .venv/bin/python scripts/bench_prefill_hf.py write HF_DIR [--preset 130m | --preset qwen3.5-0.8b]
    seqexport export mamba --checkpoint HF_DIR --out DIR        # (hybrid, for qwen3.5-0.8b)
    .venv/bin/python scripts/bench_prefill_hf.py time HF_DIR DIR [--length 1024] [--rounds 3] [--threads 2]

`write` saves a model of a preset's shape, initialised by transformers as its class does, with
`save_pretrained`: a Mamba preset (130m: hidden 768, 24 layers, state 16, vocabulary 50280) or
the hybrid's qwen3.5-0.8b (its decays as Qwen3.5's init draws them: A up to 16). `time` runs,
in turn each round: ORT's prefill as generation runs it (the last position's logits), HF's
forward with `logits_to_keep=1` (likewise) and with every position's logits, and for Mamba our
eager forward with the reference scan; it prints medians and ORT ÷ each, as medians of
per-round ratios, and the largest difference of the last position's logits (the same weights
on every side).
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

    from seqexport.families import hybrid, mamba

    torch.manual_seed(0)
    if preset in mamba.FAMILY.presets:
        shape = mamba.FAMILY.presets[preset]
        model = transformers.MambaForCausalLM(transformers.MambaConfig(
            hidden_size=shape["d_model"], num_hidden_layers=shape["n_layer"], state_size=shape["d_state"],
            vocab_size=shape["vocab_size"]))
    elif "delta_k_heads" in hybrid.FAMILY.presets.get(preset, {}):
        s = hybrid.FAMILY.presets[preset]
        kinds = {"deltanet": "linear_attention", "attention": "full_attention"}
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
            vocab_size=s["vocab_size"], hidden_size=s["d_model"], intermediate_size=s["d_ff"],
            num_hidden_layers=len(s["layer_types"]), layer_types=[kinds[k] for k in s["layer_types"]],
            num_attention_heads=s["n_heads"], num_key_value_heads=s["n_kv_heads"], head_dim=s["head_dim"],
            linear_num_key_heads=s["delta_k_heads"], linear_num_value_heads=s["delta_v_heads"],
            linear_key_head_dim=s["delta_k_dim"], linear_value_head_dim=s["delta_v_dim"],
            linear_conv_kernel_dim=s["d_conv"], rms_norm_eps=s["rms_norm_eps"], tie_word_embeddings=s["tie_embeddings"],
            rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"],
                             "partial_rotary_factor": s["partial_rotary_factor"]}))
    else:
        raise SystemExit(f"--preset {preset!r}: a Mamba preset or a Qwen3.5 hybrid preset (qwen3.5-0.8b)")
    model.eval().save_pretrained(hf_dir)
    print(f"wrote {hf_dir}: {type(model).__name__} of the {preset} shape")


def time_all(hf_dir: Path, folder: Path, length: int, rounds: int, threads: int) -> dict:
    import transformers

    import seqexport.runtime as rt
    from seqexport.manifest import read_manifest
    from seqexport.parity.validate import eager_checkpoint

    torch.set_num_threads(threads)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    manifest = read_manifest(folder, verify=False)
    mamba = manifest["family"] == "mamba"
    ours = eager_checkpoint(folder, manifest, None).model.eval() if mamba else None
    m = rt.load(folder, "cpu", threads=threads)
    ids = np.random.default_rng(0).integers(0, m.vocab_size, (1, length))  # (1, L)
    tids = torch.from_numpy(ids)
    fns = {"ort_last": lambda: m.step(ids, m.start(1), last_only=True),
           "hf_last": lambda: hf(tids, logits_to_keep=1, use_cache=False).logits,
           "hf_all": lambda: hf(tids, use_cache=False).logits,
           **({"eager_ref": lambda: ours(tids)[0]} if mamba else {})}
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
    w = sub.add_parser("write", help="save transformers' model of a preset's shape, randomly initialised")
    w.add_argument("hf_dir", type=Path)
    w.add_argument("--preset", default="130m")
    b = sub.add_parser("time", help="paired rounds: ORT, HF (and for Mamba our eager reference)")
    b.add_argument("hf_dir", type=Path)
    b.add_argument("folder", type=Path, help="`seqexport export mamba|hybrid --checkpoint HF_DIR` of its weights")
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
