"""Greedy generation, ours beside Hugging Face Optimum's `ORTModelForSeq2SeqLM.generate`, on
models of one shape: the transformer `base` preset (d_model 512, 8 heads, 6 + 6 layers, FFN
2048, vocabularies 10000) and a Marian model of the same shape with random weights, exported
by `optimum-cli export onnx --task text2text-generation-with-past`.

    .venv/bin/python scripts/compare_optimum_generate.py WORK [--rounds 5] [--new-tokens 64]
        [--source-len 16] [--threads 2] [--repeats 3] [--attention matmul|fused] [--ours DIR]

Builds what WORK lacks (WORK/marian, WORK/optimum, WORK/ours; `--ours DIR` times that export
instead), then runs `--rounds` rounds, each a fresh process per side, alternating which side
goes first. In each process: load, one warm-up generation, then `--repeats` generations of one
source of `--source-len` tokens, batch 1, `--new-tokens` new tokens each (no eos stops either:
ours with eos_id -1, Optimum's with min_new_tokens), `--threads` intra-op threads (and torch's,
which Optimum's generate loop runs on). ms per token = a whole generate() call (the encoder
included) ÷ new tokens, the median of the process's repeats; printed per round, then the
medians over rounds and ours ÷ Optimum's. Optimum lives in its own venv (`scripts/peers.sh
optimum` builds .venv-peers/optimum).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_export_time import marian_like  # noqa: E402  (the Marian of the export-time comparison)

OURS = """
import json, sys, time
import numpy as np
import seqexport.runtime as rt
a = json.loads(sys.argv[1])
m = rt.load(a["folder"], provider="cpu", threads=a["threads"])
src = [list(np.random.default_rng(0).integers(2, 10000, a["source_len"]).tolist())]
opts = rt.SearchOptions(max_new_tokens=a["new_tokens"], eos_id=-1)
rt.generate(m, src, opts)
times = []
for _ in range(a["repeats"]):
    t = time.perf_counter()
    out = rt.generate(m, src, opts)
    times.append(time.perf_counter() - t)
assert len(out[0]) == a["new_tokens"], len(out[0])
print(json.dumps({"ms_per_token": sorted(times)[len(times) // 2] / a["new_tokens"] * 1e3}))
"""

OPTIMUM = """
import json, sys, time
import numpy as np
import onnxruntime as ort
import torch
from optimum.onnxruntime import ORTModelForSeq2SeqLM
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
so = ort.SessionOptions()
so.intra_op_num_threads = a["threads"]
so.inter_op_num_threads = 1
m = ORTModelForSeq2SeqLM.from_pretrained(a["folder"], session_options=so, provider="CPUExecutionProvider")
ids = torch.from_numpy(np.random.default_rng(0).integers(2, 10000, (1, a["source_len"])))
kw = dict(max_new_tokens=a["new_tokens"], min_new_tokens=a["new_tokens"], do_sample=False, num_beams=1)
with torch.inference_mode():
    m.generate(input_ids=ids, **kw)
    times = []
    for _ in range(a["repeats"]):
        t = time.perf_counter()
        out = m.generate(input_ids=ids, **kw)
        times.append(time.perf_counter() - t)
new = out.shape[1] - 1  # the decoder start token comes first
assert new == a["new_tokens"], new
print(json.dumps({"ms_per_token": sorted(times)[len(times) // 2] / a["new_tokens"] * 1e3}))
"""


def peer_python() -> Path:
    return ROOT / ".venv-peers" / "optimum" / "bin" / "python"


def build(work: Path, attention: str, ours: bool = True) -> None:
    """The Marian checkpoint, Optimum's export of it and our `base` export, where missing."""
    work.mkdir(parents=True, exist_ok=True)
    if not peer_python().is_file():
        subprocess.run(["bash", str(ROOT / "scripts" / "peers.sh"), "optimum"], check=True)
    if not (work / "marian" / "config.json").is_file():
        subprocess.run([str(peer_python()), "-c", marian_like(work / "marian")], check=True)
    if not (work / "optimum" / "decoder_model.onnx").is_file() and not (work / "optimum" / "decoder_model_merged.onnx").is_file():
        subprocess.run([str(peer_python().with_name("optimum-cli")), "export", "onnx", "--model", str(work / "marian"),
                        "--task", "text2text-generation-with-past", str(work / "optimum")], check=True)
    if ours and not (work / "ours" / "manifest.json").is_file():
        subprocess.run([str(Path(sys.executable).with_name("seqexport")), "export", "transformer", "--preset", "base",
                        "--attention", attention, "--out", str(work / "ours"), "--overwrite"], check=True)


def one(side: str, folder: Path, a: argparse.Namespace) -> float:
    """ms per token of one fresh process of `side`."""
    python, code = (sys.executable, OURS) if side == "ours" else (str(peer_python()), OPTIMUM)
    args = json.dumps({"folder": str(folder), "threads": a.threads, "repeats": a.repeats,
                       "new_tokens": a.new_tokens, "source_len": a.source_len})
    env = os.environ | {"OMP_NUM_THREADS": str(a.threads)}
    out = subprocess.run([python, "-c", code, args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{side} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["ms_per_token"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--source-len", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attention", default="matmul", choices=("matmul", "fused"))
    p.add_argument("--ours", type=Path, help="time this export of ours instead of WORK/ours")
    p.add_argument("--build-only", action="store_true")
    a = p.parse_args()
    build(a.work, a.attention, ours=a.ours is None)
    if a.build_only:
        return
    folders = {"ours": a.ours or a.work / "ours", "optimum": a.work / "optimum"}
    times = {side: [] for side in folders}
    load = os.getloadavg()[0]
    for r in range(a.rounds):
        order = list(folders) if r % 2 == 0 else list(folders)[::-1]
        for side in order:
            times[side].append(one(side, folders[side], a))
        print(f"round {r + 1}: ours {times['ours'][-1]:.2f} ms/token, optimum {times['optimum'][-1]:.2f} ms/token, "
              f"ours/optimum {times['ours'][-1] / times['optimum'][-1]:.3f}", flush=True)
    med = {side: statistics.median(t) for side, t in times.items()}
    print(f"\nmedians of {a.rounds} alternating fresh-process rounds (greedy, batch 1, {a.new_tokens} new tokens, "
          f"source {a.source_len} tokens, {a.threads} threads; load average {load:.2f} -> {os.getloadavg()[0]:.2f}):")
    ratios = [o / p for o, p in zip(times["ours"], times["optimum"], strict=True)]
    print(f"  ours {med['ours']:.2f} ms/token, optimum {med['optimum']:.2f} ms/token, "
          f"ours/optimum {med['ours'] / med['optimum']:.3f} (the medians' ratio); the rounds' ratios: median "
          f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
