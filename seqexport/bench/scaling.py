"""Decode cost as the context grows: the Transformer's KV cache against Mamba's and RWKV-7's
fixed states.

    from seqexport.bench.scaling import measure_scaling, plot_scaling
    result = measure_scaling({"transformer base": "exported/transformer-base",
                              "mamba 130m": "exported/mamba-130m-loop"})
    plot_scaling(result, "docs/scaling.png")      # needs the `plot` extra (matplotlib)

For every folder, provider (CPU, and CUDA where ORT offers it) and context T, the
one-token decode step of the runtime is timed with a state as after T tokens, and
the state's size is recorded. Transformer: a real encoder output (cross K/V of a
source of `src_len` tokens) and random self-attention K/V of past length T — the
step's cost depends only on their shapes. Mamba and RWKV-7: the conv/SSM (token-shift/WKV)
state has the same shape after any number of tokens, so a random one of that shape stands
for all T.
"""

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from seqexport import families
from seqexport.bench.artifact import artifact_facts
from seqexport.bench.cases import advancing_step
from seqexport.bench.timing import measure_bandwidth, rss_now, time_paired
from seqexport.errors import ArtifactError, UsageError
from seqexport.manifest import read_manifest
from seqexport.runtime.models import load
from seqexport.runtime.session import cuda_usable

DEFAULT_CONTEXTS = (16, 64, 256, 1024, 4096)
SRC_LEN = 32
# a 1-minute load average above this share of the cores: other work is taking CPU the timed
# steps need (on 2 cores at load 8-9 the base transformer's step read 45 ms for a quiet 5-9)
BUSY_LOAD_PER_CORE = 0.5


def check_quiet(allow_busy: bool = False, log: Callable[[str], None] | None = None) -> float:
    """The 1-minute load average; UsageError when the machine is busy (unless `allow_busy`,
    which only warns): the figures would measure the other work, not the model."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > BUSY_LOAD_PER_CORE * cores:
        message = (f"the machine is busy: load average {load:.1f} on {cores} cores (quiet: <= "
                   f"{BUSY_LOAD_PER_CORE * cores:g}); the timings would measure the other work")
        if not allow_busy:
            raise UsageError(message + "; wait for a quiet machine, or allow it (allow_busy / --busy)")
        if log:
            log("warning: " + message)
    return load


def _providers(providers) -> list[str]:
    if providers is None:
        return ["cpu", "cuda"] if cuda_usable() else ["cpu"]
    return list(providers)


def _weights(folder: Path, manifest: dict, bench) -> int:
    from seqexport.parity.validate import eager_checkpoint

    model = eager_checkpoint(folder, manifest, None).model
    return bench.step_weight_bytes(model, manifest["dtype"])


def _points(rt, bench, batch: int, contexts, repeats: int, rng, log) -> list[dict]:
    """The runtime's one-token step with a state as after each context: median ms, state bytes.
    Every context's step is timed in the same rounds, in turn (`time_paired`), so a slower
    minute of the machine, or the first calls of a fresh process, slow every context alike
    (timed one context after another, a recurrent model read slower at 16 tokens than at 1024)."""
    steps, sizes = {}, {}
    for context in contexts:
        log(f"  {rt.provider}: a state as after {context} tokens")
        state = bench.decode_state(rt, batch, context, rng, SRC_LEN)
        tokens = rng.integers(1, rt.vocab_size, batch, dtype=np.int64)
        steps[context] = advancing_step(rt, tokens, state)  # as in a decode: cache owned
        sizes[context] = state.nbytes
    med = time_paired(steps, repeats, 0.05)
    return [{"context": c, "step_ms": med[c] * 1e3, "state_bytes": sizes[c]} for c in contexts]


def measure_scaling(folders: dict[str, str | Path], contexts=DEFAULT_CONTEXTS, providers=None, threads: int = 2,
                    repeats: int = 5, batch: int = 1, log: Callable[[str], None] | None = None,
                    bandwidth_mb: int = 512, allow_busy: bool = False) -> dict:
    """Per-token decode latency and cache/state bytes at each context, for each labelled folder.

    The family's bench module builds the state (`decode_state`) and says which contexts
    the model can hold (`check_contexts`). Refused on a busy machine (`check_quiet`) unless
    `allow_busy`."""
    log = log or (lambda msg: None)
    check_quiet(allow_busy, log)
    rng = np.random.default_rng(0)
    result = {"contexts": list(contexts), "threads": threads, "batch": batch, "src_len": SRC_LEN,
              "repeats": repeats, "load_average_start": list(os.getloadavg()), "models": []}
    for label, folder in folders.items():
        folder = Path(folder)
        manifest = read_manifest(folder, verify=False)
        family = manifest["family"]
        bench = families.get(family, ArtifactError, where=str(folder)).bench
        try:
            bench.check_contexts(manifest["config"], contexts)
        except UsageError as e:
            raise UsageError(f"{folder}: {e}") from None
        weights = _weights(folder, manifest, bench)
        for provider in _providers(providers):
            rss, started = rss_now(), time.perf_counter()
            rt = load(folder, provider, threads=threads)
            # the RSS the load added (earlier models of this run stay loaded until collected)
            entry = {"label": label, "folder": str(folder), "family": family, "provider": rt.provider,
                     "preset": (manifest.get("source") or {}).get("preset"), "step_weight_bytes": weights,
                     "quantized": (manifest.get("quantization") or {}).get("weights"),
                     "load_seconds": time.perf_counter() - started,
                     "rss_added_by_load_bytes": (rss_now() or 0) - (rss or 0),
                     "artifact": artifact_facts(folder, manifest)}
            log(f"  {label} on {rt.provider}: contexts {', '.join(map(str, contexts))}, timed in turn")
            entry["points"] = _points(rt, bench, batch, contexts, repeats, rng, log)
            result["models"].append(entry)
    bw = measure_bandwidth(bandwidth_mb, threads=threads)
    result["bandwidth_gbs"] = bw["gbs"]
    result["load_average_end"] = list(os.getloadavg())
    for m in result["models"]:
        m["bound_ms"] = m["step_weight_bytes"] / (bw["gbs"] * 1e9) * 1e3
    return result


def plot_scaling(result: dict, path: str | Path) -> Path:
    """Two panels: decode latency per token, and cache/state size, against the context."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("plotting needs matplotlib: pip install 'seqexport[plot]'") from None
    fig, (lat, mem) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    colors = {}
    for m in result["models"]:
        x = [p["context"] for p in m["points"]]
        # a quantised copy: its float32 source's bound does not bound it, and its state is the
        # source's (float32), so it gets a latency line only
        quantized = m.get("quantized")
        weights = f"{quantized} weights" if quantized else f"{m['step_weight_bytes'] / 1e6:.0f} MB of weights"
        name = f"{m['label']} ({m['provider'].replace('ExecutionProvider', '')}, {weights})"
        line, = lat.plot(x, [p["step_ms"] for p in m["points"]], "o--" if quantized else "o-", label=name)
        color = colors.setdefault(m["label"], line.get_color())
        line.set_color(color)
        if m["provider"].startswith("CPU") and not quantized:
            lat.axhline(m["bound_ms"], color=color, ls=":", lw=1)
            mem.plot(x, [p["state_bytes"] / 2**20 for p in m["points"]], "o-", color=color, label=m["label"])
    lat.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="ms per token",
            title=f"decode step, batch {result['batch']}, {result['threads']} threads")
    lat.plot([], [], "k:", lw=1, label=f"weights ÷ {result['bandwidth_gbs']:.0f} GB/s")
    lat.legend(fontsize=7)
    mem.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="MiB",
            title="KV cache / recurrent state per sequence")
    mem.legend(fontsize=7)
    for m in result["models"]:
        if m["provider"].startswith("CPU") and not m.get("quantized"):
            last = m["points"][-1]
            mem.annotate(f"{last['state_bytes'] / 2**20:.3g} MiB", (last["context"], last["state_bytes"] / 2**20),
                         textcoords="offset points", xytext=(-8, 0), ha="right", va="center", fontsize=7)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax in (lat, mem):
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xticks(result["contexts"])
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def merge_rounds(rounds: list[dict]) -> dict:
    """One study from several rounds of `measure_scaling` (each round a fresh process per model,
    the models alternating): every point's step is the median of its rounds (kept beside it as
    `step_ms_rounds`), the bandwidth the median of the rounds' measurements, each model's bound
    recomputed from it. The rounds must have timed the same models at the same contexts."""
    if not rounds:
        raise UsageError("no rounds to merge")
    first = rounds[0]
    keys = [(m["label"], m["provider"], [p["context"] for p in m["points"]]) for m in first["models"]]
    for r in rounds[1:]:
        other = [(m["label"], m["provider"], [p["context"] for p in m["points"]]) for m in r["models"]]
        if other != keys:
            raise UsageError(f"rounds timed different models or contexts: {keys} vs {other}")
    bandwidth = float(np.median([r["bandwidth_gbs"] for r in rounds]))
    merged = {**first, "rounds": len(rounds), "bandwidth_gbs": bandwidth,
              "bandwidth_gbs_rounds": [r["bandwidth_gbs"] for r in rounds],
              "load_average_rounds": [r["load_average_start"] for r in rounds],
              "load_average_end": rounds[-1]["load_average_end"], "models": []}
    for i, model in enumerate(first["models"]):
        points = []
        for j, point in enumerate(model["points"]):
            times = [r["models"][i]["points"][j]["step_ms"] for r in rounds]
            points.append({**point, "step_ms": float(np.median(times)), "step_ms_rounds": times})
        bound = model["step_weight_bytes"] / (bandwidth * 1e9) * 1e3
        merged["models"].append({**model, "points": points, "bound_ms": bound})
    return merged
