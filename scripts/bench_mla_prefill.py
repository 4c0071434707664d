"""A latent attention's prefill in two exports of one checkpoint side by side (e.g. the same
Kimi-Linear weights exported by two versions of seqexport), and transformers' forward on it:
paired rounds in one process, every side at the same thread count.

    .venv/bin/python scripts/bench_mla_prefill.py write DIR [--layers 2] [--mlp 9216]
    .venv/bin/python scripts/bench_mla_prefill.py time DIR/hf EXPORT_A EXPORT_B [--length 1024] [--rounds 5]

`write` saves `KimiLinearForCausalLM` (transformers' initialisation) whose layers are all latent
attention at Kimi-Linear-48B-A3B's widths as remembered, not read from the hub (d 2304; 32
heads, latent 512 + 64 shared key dims, 128 own key and value dims a head; dense MLPs `--mlp` wide;
vocabulary 32000), and exports it with this checkout's seqexport to DIR/export. `time` runs, in
turn each round, each export's prefill of `--length` random tokens (the last position's logits)
and transformers' forward (`logits_to_keep=1`); it prints medians, A ÷ B and each ÷ transformers
as medians of per-round ratios, and the largest difference of their last logits.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch


def write(folder: Path, layers: int, mlp: int) -> None:
    import transformers

    torch.manual_seed(0)
    model = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(
        hidden_size=2304, num_hidden_layers=layers, vocab_size=32000, intermediate_size=mlp,
        moe_intermediate_size=1024, num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_local_experts=8, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=layers, linear_num_heads=32, linear_head_dim=128,
        layer_types=["full_attention"] * layers, pad_token_id=None, bos_token_id=None, eos_token_id=None))
    model.eval().save_pretrained(folder / "hf")
    print(f"wrote {folder / 'hf'}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")
    cli = str(Path(sys.executable).parent / "seqexport")
    subprocess.run([cli, "export", "hybrid", "--checkpoint", str(folder / "hf"), "--out", str(folder / "export"),
                    "--overwrite"], check=True)


def time_all(hf_folder: Path, a: Path, b: Path, length: int, rounds: int, threads: int) -> None:
    import transformers

    import seqexport.runtime as rt
    from seqexport.bench.timing import median_ratio, paired_samples

    torch.set_num_threads(threads)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_folder).eval()
    models = {"A": rt.load(a, "cpu", threads=threads), "B": rt.load(b, "cpu", threads=threads)}
    ids = np.random.default_rng(0).integers(0, 32000, (1, length))  # (1, L)
    fns = {name: (lambda m=m: m.step(ids, m.start(1), last_only=True)[0]) for name, m in models.items()}
    fns["hf"] = lambda: hf(torch.from_numpy(ids), logits_to_keep=1, use_cache=False).logits
    with torch.inference_mode():
        last = {k: np.asarray(f()).reshape(-1)[-32000:] for k, f in fns.items()}
        t = paired_samples(fns, rounds)  # (its first round warms up)
    med = {k: float(np.median(v)) for k, v in t.items()}
    print(f"prefill of {length} tokens, {threads} threads, medians of {rounds} paired rounds:")
    print(f"  A {a}: {med['A'] * 1e3:.0f} ms   B {b}: {med['B'] * 1e3:.0f} ms   transformers {med['hf'] * 1e3:.0f} ms")
    print(f"  A / B {median_ratio(t['A'], t['B']):.3f}   A / transformers {median_ratio(t['A'], t['hf']):.3f}   "
          f"B / transformers {median_ratio(t['B'], t['hf']):.3f}")
    print(f"  last logits: |A - B| {np.abs(last['A'] - last['B']).max():.2e}, "
          f"|A - transformers| {np.abs(last['A'] - last['hf']).max():.2e}, "
          f"|B - transformers| {np.abs(last['B'] - last['hf']).max():.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("folder", type=Path)
    w.add_argument("--layers", type=int, default=2)
    w.add_argument("--mlp", type=int, default=9216, help="the MLPs' width (a small one leaves the attention's time)")
    t = sub.add_parser("time")
    t.add_argument("hf", type=Path)
    t.add_argument("a", type=Path)
    t.add_argument("b", type=Path)
    t.add_argument("--length", type=int, default=1024)
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.command == "write":
        write(args.folder, args.layers, args.mlp)
    else:
        time_all(args.hf, args.a, args.b, args.length, args.rounds, args.threads)


if __name__ == "__main__":
    main()
