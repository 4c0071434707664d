"""Measured comparisons: eager PyTorch vs ONNX Runtime on one exported folder, in one run.

    from seqexport.bench.run import run_bench, format_table
    result = run_bench("exported/transformer-tiny", contexts=(16, 64, 256))
    print(format_table(result))       # result is plain JSON-serialisable data

What is timed (torch and ORT with the same intra-op thread count; warm-up, then
medians of single calls over `repeats` rounds taken in turn, eager then ORT, so
that a busy machine slows both alike; eager is also timed at 1 torch thread and
ratios use the faster eager — see `timing.time_eager_and_ort`):

- the one-token decode step, as the family's bench module frames it (transformer:
  the cached decoder step at each past length; mamba: the step, whose state has
  one size at every context). Eager is the model's own cached step on the same
  arrays; ORT through the runtime (`model.step`: input checks, state book-keeping
  — what an application gets) advancing a state it owns (`cases.advancing_step`),
  and as the bare `InferenceSession.run`; for a model with an appended cache, also
  the step from an earlier state (`cases.branch_step`: the cache copied first), and
  branch ÷ advancing step;
- the prefill, where the family has one (mamba: eager with the sequential
  reference scan and with the export's scan lowering, vs the prefill graph);
- end-to-end greedy generation, tokens/s: the one eager decoder of the family
  (`families.eager_model`) with cache and without (the full forward over the
  whole prefix for every token), and the ORT runtime, all driven by
  `seqexport.runtime.generate` (eos disabled so every row makes all its tokens);
- session load time, RSS after load and after the runs, peak RSS, cache/state bytes;
- the artifact (`artifact.artifact_facts`): bytes on disk (graphs, shared weights, the
  checkpoint copy) against the model's weight bytes, and the export's own seconds;
- memory read bandwidth (a large float32 array summed) and the weight-streaming
  bound: the weight bytes one decode step must read ÷ that bandwidth, the least
  time a memory-bound batch-1 step can take.

What is family-specific comes from `families.get(family).bench` (see `cases`).
"""

import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from seqexport import families
from seqexport.bench.artifact import artifact_facts
from seqexport.bench.cases import Case
from seqexport.bench.tables import format_table
from seqexport.bench.timing import measure_bandwidth, peak_rss, rss_now, time_eager_and_ort
from seqexport.errors import ArtifactError, UsageError
from seqexport.manifest import MANIFEST, read_manifest
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load

__all__ = ["DEFAULT_CONTEXTS", "format_table", "run_bench"]

DEFAULT_CONTEXTS = (16, 64, 256, 1024)
# Per mode: repeats, contexts, new tokens, seconds per timed sample, size of the bandwidth array.
SETTINGS = {
    False: dict(repeats=7, contexts=DEFAULT_CONTEXTS, new_tokens=32, sample_s=0.05, bandwidth_mb=512),
    True: dict(repeats=2, contexts=(4, 16), new_tokens=4, sample_s=0.002, bandwidth_mb=64),
}

Log = Callable[[str], None]


def _ms(med: dict[str, float | None]) -> dict:
    """Seconds -> `<name>_ms`, and ORT ÷ the best time of each eager function."""
    out = {f"{k}_ms": None if v is None else v * 1e3 for k, v in med.items()}
    out["ort_over_eager"] = med["ort"] / med["eager_best"]
    out["ort_session_over_eager"] = med["ort_session"] / med["eager_best"]
    if med.get("ort_branch") is not None:  # a step from an earlier state (an appended cache copied first)
        out["branch_over_step"] = med["ort_branch"] / med["ort"]
    if med.get("ort_all") is not None:  # a prefill's every-position logits (mamba)
        out["ort_all_over_eager"] = med["ort_all"] / med["eager_best"]
    for name in med:
        if name.startswith("eager_") and name.endswith("_best") and name != "eager_best":
            out[f"ort_over_{name.removesuffix('_best')}"] = med["ort"] / med[name]
    return out


def _time_cases(cases: Iterable[Case], threads: int, repeats: int, sample_s: float, log: Log) -> list[dict]:
    rows = []
    for case in cases:
        log(f"  {case.label}")
        with torch.inference_mode():
            med = time_eager_and_ort(case.fns, threads, repeats, sample_s, log)
        rows.append({**case.row, **_ms(med)})
    return rows


def _generation(rt, ckpt, bench, batch: int, prompt_len: int, new_tokens: int, threads: int, repeats: int,
                sample_s: float, rng, log: Log) -> dict:
    """Greedy tokens/s of the eager decoder (with and without cache) and of the ORT runtime."""
    log(f"  generation: batch {batch}, {new_tokens} new tokens")
    prompts = bench.generation_prompts(rt, batch, prompt_len, rng)
    options = SearchOptions(max_new_tokens=new_tokens, eos_id=-1)
    models = {"eager_cache": families.eager_model(ckpt, rt.tokenizer, cache=True),
              "eager_nocache": families.eager_model(ckpt, rt.tokenizer, cache=False), "ort": rt}
    fns = {name: (lambda m=m: generate(m, prompts, options)) for name, m in models.items()}
    with torch.inference_mode():
        med = time_eager_and_ort(fns, threads, repeats, sample_s, log)
    made = batch * new_tokens
    row = {"batch": batch, "new_tokens": new_tokens, "prompt_len": prompts.shape[1],
           **{f"{k}_tps": None if v is None else made / v for k, v in med.items()}}
    row["ort_over_eager_cache"] = row["ort_tps"] / row["eager_cache_best_tps"]
    row["ort_over_eager_nocache"] = row["ort_tps"] / row["eager_nocache_best_tps"]
    return row


def _check_sizes(name: str, values) -> tuple[int, ...]:
    values = tuple(values)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{name}: expected positive integers, got {v!r}")
    if not values:
        raise UsageError(f"{name}: expected at least one value")
    return values


def _load(folder: Path, provider: str, threads: int, fast: bool) -> tuple[object, list[float], int | None, int | None]:
    """The runtime model, its load times (a median of three for small models; manifest and
    sha256 checks included) and the RSS it added."""
    rss0 = rss_now()
    t = time.perf_counter()
    rt = load(folder, provider, threads=threads)
    loads = [time.perf_counter() - t]
    rss_loaded = rss_now()
    while not fast and len(loads) < 3 and loads[0] < 2.0:
        del rt
        t = time.perf_counter()
        rt = load(folder, provider, threads=threads)
        loads.append(time.perf_counter() - t)
    added = (rss_loaded - rss0) if rss0 is not None and rss_loaded is not None else None
    return rt, loads, added, rss_loaded


def run_bench(folder, provider: str = "auto", batches=(1,), contexts=None, new_tokens: int | None = None,
              threads: int = 2, repeats: int | None = None, fast: bool = False,
              log: Log | None = None) -> dict:
    """Benchmark an exported folder against its eager model; returns JSON-serialisable results.

    contexts: transformer past lengths of the decoder step, Mamba prefill lengths
    [16 64 256 1024; fast: 4 16]. new_tokens: tokens generated end to end [32; fast: 4].
    repeats: timed samples per figure, medians reported [7; fast: 2].
    """
    from seqexport.parity.validate import eager_checkpoint

    log = log or (lambda msg: None)
    folder = Path(folder)
    cfg = SETTINGS[bool(fast)]
    batches = _check_sizes("batches", batches)
    contexts = None if contexts is None else _check_sizes("contexts", contexts)
    repeats = _check_sizes("repeats", [repeats or cfg["repeats"]])[0]
    new_tokens = _check_sizes("new_tokens", [new_tokens or cfg["new_tokens"]])[0]
    threads = _check_sizes("threads", [threads])[0]
    manifest = read_manifest(folder, verify=False)
    family, dtype = manifest["family"], manifest["dtype"]
    bench = families.get(family, ArtifactError, where=str(folder / MANIFEST)).bench
    notes: list[str] = []
    contexts = bench.check_contexts(manifest["config"], contexts, cfg["contexts"], notes)
    prompt_len = bench.PROMPT_LEN[bool(fast)]
    if dtype != "float32":
        notes.append(f"the graphs are {dtype}; the eager model runs in float32")
    rng = np.random.default_rng(0)
    timing = dict(threads=threads, repeats=repeats, sample_s=cfg["sample_s"], log=log)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        log(f"bench {folder}: {family}, {threads} threads")
        rt, loads, session_rss, rss_loaded = _load(folder, provider, threads, fast)
        ckpt = eager_checkpoint(folder, manifest, None)
        model = ckpt.model.float().eval()
        if rt.provider != "CPUExecutionProvider":
            notes.append(f"ORT runs on {rt.provider}; the eager model on the CPU")
        result = {
            "folder": str(folder), "family": family, "dtype": dtype,
            "preset": (manifest.get("source") or {}).get("preset"),
            "export_options": manifest.get("export_options", {}),
            "provider": rt.provider, "threads": {"torch": torch.get_num_threads(), "ort": threads},
            "fast": bool(fast), "repeats": repeats,
            "versions": {"torch": torch.__version__, "onnxruntime": ort.__version__,
                         "numpy": np.__version__, "python": platform.python_version()},
            "machine": {"cpus": os.cpu_count(), "load_average_start": list(os.getloadavg())},
            "load_seconds": statistics.median(loads),
            "session_rss_bytes": session_rss,
            "rss_after_load_bytes": rss_loaded,
            "artifact": artifact_facts(folder, manifest, model),
            "notes": notes,
        }
        result["steps"] = _time_cases(bench.step_cases(rt, model, batches, contexts, prompt_len, rng), **timing)
        result |= bench.extra_results(rt, model, contexts, rng, threads=threads, repeats=repeats,
                                      sample_s=cfg["sample_s"])
        result["prefills"] = _time_cases(bench.prefill_cases(rt, model, batches, contexts, rng, notes), **timing)
        result["generation"] = [_generation(rt, ckpt, bench, b, prompt_len, new_tokens, rng=rng, **timing)
                                for b in batches]
        result["rss_after_run_bytes"] = rss_now()  # every weight page touched by now
        result["peak_rss_bytes"] = peak_rss()  # before the bandwidth array
        log("  memory bandwidth")
        bw = measure_bandwidth(cfg["bandwidth_mb"], repeats=max(3, repeats) if fast else 9, threads=threads)
    finally:
        torch.set_num_threads(old_threads)
    result["machine"]["load_average_end"] = list(os.getloadavg())
    result["bandwidth"] = bw
    weights = bench.step_weight_bytes(model, dtype)
    result["step_weights"] = {"bytes": weights, "bound_ms": weights / (bw["gbs"] * 1e9) * 1e3}
    if "linears_only_ms" in result:
        result["step_weights"]["linears_only_over_bound"] = result["linears_only_ms"] / result["step_weights"]["bound_ms"]
    for row in result["steps"]:
        # Weights are read once for the whole batch. With the state: what the family says a step
        # must move (the transformer's valid cache, read once), else the state read and the new
        # state written (a fresh array every step).
        moved = weights + row.get("state_moved_bytes", 2 * row["state_bytes"])
        row["bound_ms"] = result["step_weights"]["bound_ms"]
        row["bound_with_state_ms"] = moved / (bw["gbs"] * 1e9) * 1e3
        row["ort_over_bound"] = row["ort_ms"] / row["bound_ms"]
        row["ort_over_bound_with_state"] = row["ort_ms"] / row["bound_with_state_ms"]
        row["ort_session_over_bound"] = row["ort_session_ms"] / row["bound_ms"]
    return result
