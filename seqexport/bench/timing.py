"""How the benchmarks measure: medians of single calls taken in turn, eager at two thread
counts, memory read bandwidth, resident memory. Nothing here knows a model family."""

import os
import platform
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

Fn = Callable[[], object]
Log = Callable[[str], None]

# A warm-up call still running is reported this often; a timed call this slow reports what is
# left. (A Mamba prefill of 100 000 tokens spends minutes in one eager call: without these
# lines the terminal stayed silent that long.)
HEARTBEAT_S = 30.0
SLOW_CALL_S = 10.0


def duration(seconds: float) -> str:
    """'0.4 s', '42 s', '3 min 5 s', '1 h 20 min'."""
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


@contextmanager
def still_running(log: Log | None, what: str, every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Log '<what>: still running after …' every `every_s` seconds until the block ends
    (a thread that sleeps in between: nothing for a call that ends sooner)."""
    if log is None:
        yield
        return
    done, start = threading.Event(), time.perf_counter()

    def beat() -> None:
        while not done.wait(every_s):
            log(f"    {what}: still running after {duration(time.perf_counter() - start)}")

    thread = threading.Thread(target=beat, name="bench-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _budget_spent(r: int, spent_s: float, budget_s: float) -> bool:
    """Whether a function that has spent `spent_s` in rounds 0..r-1 sits out round r and the
    rest: at least 3 rounds each, then until the budget is spent."""
    return r >= 3 and spent_s > budget_s


def rounds_run(round_s: float, repeats: int, budget_s: float) -> int:
    """How many of `repeats` rounds `time_paired` gives a function whose round takes `round_s`."""
    n, total = 0, 0.0
    for r in range(repeats):
        if _budget_spent(r, total, budget_s):
            break
        total += round_s
        n += 1
    return n


def _warm_up(fn: Fn, name: str, log: Log | None, heartbeat_s: float, slow_call_s: float) -> float:
    """Call `fn` until warm (twice; once if slower than 1 s); seconds of the last call. A slow
    call beats while it runs and says what it took (see `time_paired`)."""
    with still_running(log, f"{name} (warm-up)", heartbeat_s):
        t = time.perf_counter()
        fn()
        once = time.perf_counter() - t
        if once < 1.0:  # a slow function is warm after one call
            t = time.perf_counter()
            fn()
            once = time.perf_counter() - t
    if log and once >= slow_call_s:
        log(f"    {name}: {duration(once)} a call (warm-up)")
    return once


def time_paired(fns: dict[str, Fn], repeats: int, sample_s: float,
                torch_threads: dict[str, int] | None = None, budget_s: float = 30.0,
                log: Log | None = None, heartbeat_s: float = HEARTBEAT_S,
                slow_call_s: float = SLOW_CALL_S) -> dict[str, float]:
    """Median seconds per call of each function.

    Each function is warmed up (twice; once if slower than 1 s); then, for `repeats` rounds,
    each in turn is called enough times to fill `sample_s` (at least once). Every call is timed on its own and
    the median is over all calls: on a shared machine a call that lost its core to
    another process is an outlier, not the norm. A function whose samples have taken
    `budget_s` stops after 3 rounds. `torch_threads` sets torch's intra-op thread count
    before a function's calls (untimed).

    With `log`, slow work says so: a warm-up call still running every `heartbeat_s`; a
    warm-up call slower than `slow_call_s`, its time; once the warm-ups have measured them,
    the rounds' time when over `slow_call_s`; and after each call slower than `slow_call_s`,
    the time left. Quick functions log nothing.
    """
    torch_threads = torch_threads or {}
    default = torch.get_num_threads()

    def threads_for(name):
        n = torch_threads.get(name, default)
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

    calls, round_s = {}, {}
    try:
        for name, fn in fns.items():
            threads_for(name)
            once = _warm_up(fn, name, log, heartbeat_s, slow_call_s)
            calls[name] = max(1, int(sample_s / max(once, 1e-7)))
            round_s[name] = calls[name] * once
        rounds = {name: rounds_run(round_s[name], repeats, budget_s) for name in fns}
        left = sum(rounds[name] * round_s[name] for name in fns)
        if log and left >= slow_call_s:
            most = max(rounds.values())
            log(f"    timing {', '.join(fns)}: about {duration(left)} more ({most} round{'' if most == 1 else 's'})")
        samples: dict[str, list[float]] = {name: [] for name in fns}
        clock = time.perf_counter
        for r in range(repeats):
            for name, fn in fns.items():
                got = samples[name]
                if _budget_spent(r, sum(got), budget_s):
                    continue
                threads_for(name)
                for _ in range(calls[name]):
                    t = clock()
                    fn()
                    got.append(clock() - t)
                left -= round_s[name]
                if log and got[-1] >= slow_call_s:
                    log(f"    {name}: round {r + 1} of {rounds[name]} took {duration(got[-1])}; "
                        f"about {duration(max(left, 0.0))} left")
    finally:
        torch.set_num_threads(default)
    return {name: statistics.median(v) for name, v in samples.items()}


def time_eager_and_ort(fns: dict[str, Fn], threads: int, repeats: int, sample_s: float,
                       log: Log | None = None) -> dict[str, float]:
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
    med = time_paired(timed, repeats, sample_s, per_fn, log=log)
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
