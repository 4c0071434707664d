"""Thread pinning for `Engine(pin_threads=True)`: the engine thread on one CPU, the starter on
the others (Linux thread affinity)."""

import os


def cannot_pin() -> str | None:
    """Why `pin_threads` cannot be had here (None: it can): it needs Linux's thread affinity
    and two CPUs this process may use, one for the engine thread and one for the starter."""
    if not hasattr(os, "sched_setaffinity"):
        return "this platform sets no thread affinity (Linux only)"
    cpus = len(os.sched_getaffinity(0))
    return None if cpus >= 2 else f"needs two CPUs this process may use, it has {cpus}"


def thread_cpus() -> tuple[set[int], set[int]]:
    """(the engine thread's CPUs, the starter's) for `pin_threads`: the first CPU this process
    may use, and the others (the engine refused `pin_threads` where `cannot_pin` says why).

    Why: the engine thread wakes the starter, and Linux tends to run a woken thread on its
    waker's CPU, where the starter's prefill (a transformer's encoder, 0.37 ms) then holds up
    the batched step. The bundled transformer at 16 clients, 2 cores, alternating fresh
    processes (2026-12-03, 15 rounds each): 16 clients ÷ one at a time median 4.08x unpinned
    (3.04-5.55), 4.39x pinned (3.51-6.69); that afternoon, 30 rounds each, 4.25x and 4.41x.
    The starter and every other thread kept off the engine's CPU did worse (3.74x). One engine a machine only: two engines (two replicas)
    would both take the first CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[0]}, set(cpus[1:])


def pin(cpus: set[int] | None) -> None:
    """The calling thread onto `cpus` (Linux: pid 0 is the calling thread), if any."""
    if cpus:
        os.sched_setaffinity(0, cpus)
