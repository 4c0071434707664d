"""The experts' two export forms side by side on a model with grouped sigmoid routing (Kimi-Linear's
experts: before, such routing had only the dense form): ONNX Runtime's MoE kernel, handed the
routing as logits (`families/hybrid/experts.py`), against the dense form (every expert on every
prefill token; the step gathers each row's k experts), and transformers' own model on the same
weights. Paired rounds in one process, every side at the same thread count.

    .venv/bin/python scripts/bench_moe_forms.py write DIR [--experts 64] [--layers 3]
    .venv/bin/python scripts/bench_moe_forms.py time DIR [--length 256] [--rounds 5] [--threads 2]

`write` saves `KimiLinearForCausalLM` (transformers' initialisation) at Kimi-Linear-48B-A3B's
widths as remembered, not read from the hub (d 2304; KDA and latent attention 32 heads of 128,
latent 512 + 64; a dense first MLP 9216 wide; experts 1024 wide, 8 a token, one shared; its 256
experts cut to `--experts`, so that a few layers fit in memory; vocabulary 32000), then exports
it twice: DIR/kernel (`--experts kernel`) and DIR/dense (`--experts dense`). `time` runs, in
turn each round: each form's prefill of `--length` tokens as generation runs it (the last
position's logits) and transformers' forward (`logits_to_keep=1`); then, in rounds of their own,
8 steps of each form from its prefill's state; it prints medians, kernel ÷ dense and kernel ÷ transformers as medians of
per-round ratios, and the forms' largest difference of the last logits.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

STEPS = 8


def write(folder: Path, experts: int, layers: int) -> None:
    import transformers

    torch.manual_seed(0)
    kinds = ["linear_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    model = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(
        hidden_size=2304, num_hidden_layers=layers, vocab_size=32000, intermediate_size=9216,
        moe_intermediate_size=1024, num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_local_experts=experts,
        num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.446, linear_num_heads=32, linear_head_dim=128, layer_types=kinds,
        pad_token_id=None, bos_token_id=None, eos_token_id=None))
    model.eval().save_pretrained(folder / "hf")
    print(f"wrote {folder / 'hf'}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")
    cli = str(Path(sys.executable).parent / "seqexport")
    for form in ("kernel", "dense"):
        subprocess.run([cli, "export", "hybrid", "--checkpoint", str(folder / "hf"), "--out", str(folder / form),
                        "--experts", form, "--overwrite"], check=True)


def time_all(folder: Path, length: int, rounds: int, threads: int) -> dict:
    import transformers

    import seqexport.runtime as rt
    from seqexport.bench.timing import median_ratio, paired_samples

    torch.set_num_threads(threads)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder / "hf").eval()
    forms = {form: rt.load(folder / form, "cpu", threads=threads) for form in ("kernel", "dense")}
    ids = np.random.default_rng(0).integers(0, 32000, (1, length))  # (1, L)
    prefills = {f"{form}_prefill": (lambda m=m: m.step(ids, m.start(1), last_only=True))
                for form, m in forms.items()}
    fns = {**prefills, "hf_prefill": lambda: hf(torch.from_numpy(ids), logits_to_keep=1, use_cache=False).logits}

    def steps(m):  # STEPS steps from a fresh prefill's state; seconds a step (the prefill untimed)
        state = m.step(ids, m.start(1), last_only=True)[1]
        begin = time.perf_counter()
        for _ in range(STEPS):
            _, state = m.step(np.array([5]), state)
        return (time.perf_counter() - begin) / STEPS

    with torch.inference_mode():
        last = {k: np.asarray(f()[0] if k != "hf_prefill" else f()).reshape(-1)[-32000:] for k, f in fns.items()}
        t = paired_samples(fns, rounds)  # (its first round warms up)
        t.update({f"{form}_step": [] for form in forms})  # steps, the forms in turn, after a round that warms up
        for r in range(rounds + 1):
            for form, m in forms.items():
                step_s = steps(m)
                if r:
                    t[f"{form}_step"].append(step_s)

    def ratio(a, b):
        return round(median_ratio(t[a], t[b]), 3)

    return {"length": length, "rounds": rounds, "threads": threads, "load_avg": os.getloadavg(),
            "median_ms": {k: round(1e3 * statistics.median(v), 1) for k, v in t.items()},
            "kernel_over_dense": {"prefill": ratio("kernel_prefill", "dense_prefill"),
                                  "step": ratio("kernel_step", "dense_step")},
            "kernel_over_transformers_prefill": ratio("kernel_prefill", "hf_prefill"),
            "last_logits_max_abs_diff": {k: float(np.abs(v - last["kernel_prefill"]).max())
                                         for k, v in last.items() if k != "kernel_prefill"}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="save Kimi-Linear's shape, then export both forms")
    w.add_argument("folder", type=Path)
    w.add_argument("--experts", type=int, default=64)
    w.add_argument("--layers", type=int, default=3)
    b = sub.add_parser("time", help="paired rounds: kernel, dense, transformers")
    b.add_argument("folder", type=Path)
    b.add_argument("--length", type=int, default=256)
    b.add_argument("--rounds", type=int, default=5)
    b.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.cmd == "write":
        write(args.folder, args.experts, args.layers)
    else:
        print(json.dumps(time_all(args.folder, args.length, args.rounds, args.threads)))


if __name__ == "__main__":
    main()
