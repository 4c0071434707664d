"""How the benchmarks measure: medians of single calls taken in turn, eager at two thread
counts, memory read bandwidth, resident memory. Nothing here knows a model family."""

import os
import platform
import resource
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

Fn = Callable[[], object]


def time_paired(fns: dict[str, Fn], repeats: int, sample_s: float,
                torch_threads: dict[str, int] | None = None, budget_s: float = 30.0) -> dict[str, float]:
    """Median seconds per call of each function.

    Each function is warmed up (twice; once if slower than 1 s); then, for `repeats` rounds,
    each in turn is called enough times to fill `sample_s` (at least once). Every call is timed on its own and
    the median is over all calls: on a shared machine a call that lost its core to
    another process is an outlier, not the norm. A function whose samples have taken
    `budget_s` stops after 3 rounds. `torch_threads` sets torch's intra-op thread count
    before a function's calls (untimed).
    """
    torch_threads = torch_threads or {}
    default = torch.get_num_threads()

    def threads_for(name):
        n = torch_threads.get(name, default)
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

    calls = {}
    for name, fn in fns.items():
        threads_for(name)
        t = time.perf_counter()
        fn()
        once = time.perf_counter() - t
        if once < 1.0:  # a slow function is warm after one call
            t = time.perf_counter()
            fn()
            once = time.perf_counter() - t
        calls[name] = max(1, int(sample_s / max(once, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter
    try:
        for r in range(repeats):
            for name, fn in fns.items():
                got = samples[name]
                if r >= 3 and sum(got) > budget_s:
                    continue
                threads_for(name)
                for _ in range(calls[name]):
                    t = clock()
                    fn()
                    got.append(clock() - t)
    finally:
        torch.set_num_threads(default)
    return {name: statistics.median(v) for name, v in samples.items()}


def time_eager_and_ort(fns: dict[str, Fn], threads: int, repeats: int, sample_s: float) -> dict[str, float]:
    """`time_paired`, every `eager*` function timed at `threads` torch threads and at 1.

    On a busy 2-core machine torch's OpenMP threads can stall at each barrier while a
    core runs someone else (seen here: a 0.5 ms step taking 60 ms at 2 threads and
    0.45 ms at 1). `<name>_best` is the faster of the two: ORT is compared with the
    best eager time, never with a stalled one. Returns seconds, None where not timed.
    """
    timed, per_fn = dict(fns), {}
    if threads > 1:
        for name, fn in fns.items():
            if name.startswith("eager"):
                timed[name + "_1t"], per_fn[name + "_1t"] = fn, 1
    med = time_paired(timed, repeats, sample_s, per_fn)
    out: dict[str, float] = {}
    for name in fns:
        out[name] = med[name]
        if name.startswith("eager"):
            out[name + "_1t"] = med.get(name + "_1t")
            out[name + "_best"] = min(med[name], med.get(name + "_1t", med[name]))
    return out


def paired_samples(fns: dict[str, Fn], repeats: int) -> dict[str, list[float]]:
    """Seconds of single calls, one call of each function per round, in turn; the first
    round warms up and is dropped. Round r of every list ran under the same machine load,
    so per-round ratios pair like with like (slow calls, seconds each: no `sample_s`)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(repeats + 1):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            if r:
                samples[name].append(time.perf_counter() - t)
    return samples


def median_ratio(num: list[float], den: list[float]) -> float:
    """The median of per-round ratios of two `paired_samples` lists."""
    return statistics.median(n / d for n, d in zip(num, den, strict=True))


def measure_bandwidth(mb: int = 512, repeats: int = 9, threads: int = 2) -> dict:
    """Memory read bandwidth, GB/s: a float32 array of `mb` MB summed by numpy (1 thread) and
    by torch at 1 and at `threads` threads; medians of single sums.

    `gbs`, the one the bound uses, is the highest of the three: the bound must be a time
    that reading the weights cannot beat. (numpy's pairwise sum reads ≈ 25 GB/s here,
    torch's ≈ 35 GB/s.)
    """
    a = np.full(mb * (1 << 20) // 4, 1.0, np.float32)  # written, so every page is real
    t = torch.from_numpy(a)
    med = time_paired({"numpy": lambda: np.add.reduce(a), "torch_1t": lambda: t.sum(),
                       "torch": lambda: t.sum()}, repeats, 0.0, {"torch_1t": 1, "torch": threads})
    out = {"bytes": a.nbytes, "torch_threads": threads,
           **{f"{k}_gbs": a.nbytes / v / 1e9 for k, v in med.items()}}
    out["gbs"] = max(out["numpy_gbs"], out["torch_1t_gbs"], out["torch_gbs"])
    return out


def rss_now() -> int | None:
    """Resident set size now, bytes (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss() -> int:
    """High-water mark of the resident set, bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024
