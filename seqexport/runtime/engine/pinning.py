"""Where the engine's two threads run (Linux thread affinity).

- By default the starter keeps off the CPU the engine thread last ran on (`StarterApart`);
  the engine thread itself is never restricted.
- `Engine(pin_threads=True)`: the engine thread on one CPU, the starter on the others.

Why either: the engine thread wakes the starter, and Linux tends to run a woken thread on
its waker's CPU, where the starter's prefill (a transformer's encoder, 0.37 ms) then holds up
the batched step."""

import ctypes
import os
from collections.abc import Callable


def _sched_getcpu() -> Callable[[], int] | None:
    """glibc's sched_getcpu (the CPU the calling thread runs on; a vDSO read, well under a
    microsecond), or None where the C library has none."""
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    getcpu.restype, getcpu.argtypes = ctypes.c_int, []
    return getcpu


current_cpu = _sched_getcpu()


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

    The bundled transformer at 16 clients, 2 cores, alternating fresh processes (2026-12-03,
    15 rounds each): 16 clients ÷ one at a time median 4.08x unpinned (3.04-5.55), 4.39x
    pinned (3.51-6.69); that afternoon, 30 rounds each, 4.25x and 4.41x. The starter and every
    other thread kept off the engine's CPU did worse (3.74x). One engine a machine only: two
    engines (two replicas) would both take the first CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[0]}, set(cpus[1:])


def pin(cpus: set[int] | None) -> None:
    """The calling thread onto `cpus` (Linux: pid 0 is the calling thread), if any."""
    if cpus:
        os.sched_setaffinity(0, cpus)


class StarterApart:
    """The starter thread kept off the CPU the engine thread ran on at its last batched step:
    the engine thread notes its CPU just before each step (`note_engine`), and the starter,
    before it begins a request, moves itself onto the process's other CPUs when that CPU has
    changed (`keep_off`: one system call a change, none otherwise).

    Unlike `pin_threads` nothing is fixed: the engine thread may run anywhere, the starter
    loses one CPU of the process's, and each process (each replica) keeps its own pair apart,
    so it is safe as a default on any machine. The bundled transformer at 16 clients, 2 cores,
    alternating fresh processes (2026-12-04, 30 rounds each): 16 clients ÷ one at a time median
    5.02x against 4.74x without it (the starter's encoder no longer lands on the engine's CPU);
    `pin_threads` 4.60x in the same alternation (12 rounds)."""

    def __init__(self):
        self.engine_cpu = -1  # (written by the engine thread, read by the starter: an int swap)
        self._avoiding: int | None = None
        self._cpus: set[int] | None = None

    @staticmethod
    def possible() -> bool:
        """Linux thread affinity, a C library that says the current CPU, and two CPUs or more."""
        return current_cpu is not None and cannot_pin() is None

    def note_engine(self) -> None:
        """On the engine thread."""
        self.engine_cpu = current_cpu()

    def keep_off(self) -> None:
        """On the starter thread: off the engine's last CPU, on every other CPU it may use."""
        cpu = self.engine_cpu
        if cpu < 0 or cpu == self._avoiding:
            return
        if self._cpus is None:
            self._cpus = os.sched_getaffinity(0)  # the starter's CPUs before it moved
        rest = self._cpus - {cpu}
        os.sched_setaffinity(0, rest or self._cpus)
        self._avoiding = cpu
