"""Mamba-2 of the mamba2-130m shape: our export beside onnxruntime mobius' build of the same
transformers checkpoint, transformers' own torch forward and our sequential reference, in one
process, 2 threads each, rounds alternating, medians.

    .venv/bin/python scripts/compare_mamba2_mobius.py checkpoint HF_DIR   # random weights, transformers layout
    seqexport export mamba2 --checkpoint HF_DIR --out OURS            # --ssd mixed, the default
    seqexport export mamba2 --checkpoint HF_DIR --out OURS_MM --ssd matmul
    seqexport export mamba2 --checkpoint HF_DIR --out OURS_LA --ssd linear-attention
    # mobius in its own venv (pip install torch==2.13.0 mobius-onnx):
    HF_HUB_OFFLINE=1 mobius build --model HF_DIR MOBIUS
    .venv/bin/python scripts/compare_mamba2_mobius.py compare HF_DIR OURS[,OURS_LA...] MOBIUS [ROUNDS]
    # resident memory after load, a prefill of 1024 and 16 steps, one fresh process each:
    .venv/bin/python scripts/compare_mamba2_mobius.py rss HF_DIR OURS [unpacked]   # unpacked: the step
    .venv/bin/python scripts/compare_mamba2_mobius.py rss HF_DIR mobius:MOBIUS     #   reads the pages too

`seqexport export mamba2` writes --ssd mixed unless told otherwise.
"""

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import transformers
from seqexport.models.mamba2 import ssd_sequential

import seqexport.runtime as rt
from seqexport.checkpoints.io import load_checkpoint


def checkpoint(out: str) -> None:
    torch.manual_seed(0)
    config = transformers.Mamba2Config(hidden_size=768, num_hidden_layers=24, state_size=128, head_dim=64, expand=2,
                                       num_heads=24, n_groups=1, conv_kernel=4, vocab_size=50288, chunk_size=256,
                                       tie_word_embeddings=True)
    model = transformers.Mamba2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.backbone.layers:
            dt = torch.rand(24) * 0.09 + 0.01
            layer.mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
    model.save_pretrained(out)


class Mobius:
    """mobius' model.onnx: one graph for prefill and step, state past_states.{i}.conv_state
    (b, conv_dim, k - 1) and .ssm_state (b, h, n, p)."""

    def __init__(self, folder: str, config):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = ort.InferenceSession(f"{folder}/model.onnx", options, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]
        h, p, n, k = config.num_heads, config.head_dim, config.state_size, config.conv_kernel
        conv = config.expand * config.hidden_size + 2 * config.n_groups * n
        self.shapes = {f"past_states.{i}.{name}": shape for i in range(config.num_hidden_layers)
                       for name, shape in (("conv_state", (conv, k - 1)), ("ssm_state", (h, n, p)))}

    def zeros(self, batch: int) -> dict:
        return {name: np.zeros((batch, *shape), np.float32) for name, shape in self.shapes.items()}

    def run(self, ids, state):
        out = dict(zip(self.outputs, self.session.run(None, {"input_ids": ids, **state})))
        return out["logits"], {k.replace("present.", "past_states."): v for k, v in out.items() if k != "logits"}


def timed(fn, n: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e3


def _ours_label(folder: str) -> str:
    """ours[<ssd form>] from the export's manifest (older exports: matmul)."""
    options = json.loads((Path(folder) / "manifest.json").read_text()).get("export_options", {})
    return f"ours[{options.get('ssd', 'matmul')}]"


def _ours_decode(m, prompt, steps) -> np.ndarray:
    """The prompt's last logits then each step's (b, 1 + n, v)."""
    logits, state = m.step(prompt, m.start(1), last_only=True)
    got = [logits[:, 0]]
    for t in steps.T:
        logits, state = m.step(t, state)
        got.append(logits)
    return np.stack(got, 1)


def _mobius_decode(mob, prompt, steps) -> np.ndarray:
    logits, state = mob.run(prompt, mob.zeros(1))
    got = [logits[:, -1]]
    for t in steps.T:
        logits, state = mob.run(t[:, None], state)
        got.append(logits[:, -1])
    return np.stack(got, 1)


def compare(hf_dir: str, ours_dirs: list[str], mobius_dir: str, rounds: int = 5) -> None:
    torch.set_num_threads(2)
    hf = transformers.Mamba2ForCausalLM.from_pretrained(hf_dir).eval()
    ours = {_ours_label(d): rt.load(d, provider="cpu", threads=2) for d in ours_dirs}
    mob = Mobius(mobius_dir, hf.config)
    rng = np.random.default_rng(0)

    # parity against transformers: a 64-token prompt, then 8 single steps
    prompt, steps = rng.integers(0, 50277, (1, 64)), rng.integers(0, 50277, (1, 8))
    with torch.no_grad():
        out = hf(torch.from_numpy(prompt), use_cache=True)
        cache, want = out.cache, [out.logits[:, -1]]
        for t in steps.T:
            out = hf(torch.from_numpy(t)[:, None], cache=cache, use_cache=True)
            cache = out.cache
            want.append(out.logits[:, -1])
    want = torch.stack(want, 1).numpy()
    errors = {label: float(np.abs(_ours_decode(m, prompt, steps) - want).max()) for label, m in ours.items()}
    errors["mobius"] = float(np.abs(_mobius_decode(mob, prompt, steps) - want).max())
    print(f"parity vs transformers, max |logits diff| (logits up to {np.abs(want).max():.1f}): "
          + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))

    ids = rng.integers(0, 50277, (1, 1024))
    token = np.array([7])
    cases = {}
    for label, m in ours.items():
        _, state = m.step(ids[:, :16], m.start(1), last_only=True)
        cases[f"{label}_prefill"] = (lambda m=m: m.step(ids, m.start(1), last_only=True), 1)
        cases[f"{label}_step"] = (lambda m=m, state=state: m.step(token, state), 10)
    _, mob_state = mob.run(ids[:, :16], mob.zeros(1))
    cases["mobius_prefill"] = (lambda: mob.run(ids, mob.zeros(1)), 1)
    cases["mobius_step"] = (lambda: mob.run(token[:, None], mob_state), 10)
    cases["transformers_prefill"] = (lambda: hf(torch.from_numpy(ids)), 1)
    times = {name: [] for name in cases}
    with torch.no_grad():
        for r in range(rounds):
            for name, (fn, n) in cases.items():
                times[name].append(timed(fn, n))
            print("round", r, {k: round(v[-1], 1) for k, v in times.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("medians, ms:", {k: round(v, 1) for k, v in med.items()})
    for label in ours:
        print(f"{label}: prefill of 1024 / mobius {med[f'{label}_prefill'] / med['mobius_prefill']:.3f}, "
              f"/ transformers {med[f'{label}_prefill'] / med['transformers_prefill']:.3f}; "
              f"step / mobius {med[f'{label}_step'] / med['mobius_step']:.3f}")

    ckpt = load_checkpoint(hf_dir)
    with torch.no_grad():
        start = time.perf_counter()
        ckpt.model(torch.from_numpy(ids), scan=ssd_sequential)
        sequential = (time.perf_counter() - start) * 1e3
    print(f"sequential reference prefill of 1024: {sequential:.0f} ms; "
          + ", ".join(f"{label} / sequential {med[f'{label}_prefill'] / sequential:.3f}" for label in ours))
    weights = sum(p.numel() for n, p in ckpt.model.named_parameters() if not n.startswith("backbone.embedding."))
    weights = (weights + ckpt.model.lm_head.weight.numel()) * 4
    state_bytes = 2 * sum(a.nbytes for a in next(iter(ours.values())).start(1).arrays.values())  # read and written
    big = np.ones(2**26, np.float32)
    big.sum()
    start = time.perf_counter()
    for _ in range(5):
        big.sum()
    gbs = 5 * big.nbytes / (time.perf_counter() - start) / 1e9
    bound = (weights + state_bytes) / gbs / 1e6
    print(f"step reads {weights / 1e6:.0f} MB of weights + {state_bytes / 1e6:.1f} MB of state at {gbs:.1f} GB/s "
          f"(numpy sum, this run): bound {bound:.2f} ms; "
          + ", ".join(f"{label} {med[f'{label}_step']:.2f} ms = {med[f'{label}_step'] / bound:.2f}x" for label in ours)
          + f", mobius {med['mobius_step']:.2f} ms = {med['mobius_step'] / bound:.2f}x")


def _rss_mb() -> float:
    """This process' resident memory now (VmRSS), MB."""
    line = next(v for v in Path("/proc/self/status").read_text().splitlines() if v.startswith("VmRSS:"))
    return int(line.split()[1]) / 1e3


def rss(hf_dir: str, folder: str, mode: str = "") -> None:
    """Resident memory of one model in this fresh process: after load, after a prefill of 1024
    tokens, after 16 steps. `unpacked`: as before 2026-12-02, the step reads the mapped weights
    (session.PACK_STEP_BYTES = 0) instead of packing its own copy."""
    import seqexport.runtime.session as session

    config = transformers.AutoConfig.from_pretrained(hf_dir)
    ids, token = np.random.default_rng(0).integers(0, 50277, (1, 1024)), np.array([7])
    base = _rss_mb()
    if folder.startswith("mobius:"):
        m = Mobius(folder[len("mobius:"):], config)
        loaded = _rss_mb()
        _, state = m.run(ids, m.zeros(1))
        prefilled = _rss_mb()
        for _ in range(16):
            _, state = m.run(token[:, None], state)
    else:
        if mode == "unpacked":
            session.PACK_STEP_BYTES = 0
        m = rt.load(folder, provider="cpu", threads=2)
        loaded = _rss_mb()
        _, state = m.step(ids, m.start(1), last_only=True)
        prefilled = _rss_mb()
        for _ in range(16):
            _, state = m.step(token, state)
    label = folder if not mode else f"{folder} ({mode})"
    print(f"{label}: RSS MB above the interpreter's {base:.0f}: after load {loaded - base:.0f}, after a prefill of "
          f"1024 {prefilled - base:.0f}, after 16 steps {_rss_mb() - base:.0f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["checkpoint"]:
        checkpoint(sys.argv[2])
    elif sys.argv[1:2] == ["rss"]:
        rss(*sys.argv[2:5])
    else:
        compare(sys.argv[2], sys.argv[3].split(","), sys.argv[4], *(int(a) for a in sys.argv[5:6]))
