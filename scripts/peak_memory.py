"""Peak memory of a command and every process it starts (an export forks one per graph), as
the sum of their proportional anonymous memory (Pss_Anon: pages a fork shares counted once,
file pages such as a mapped weights file left out), sampled every 50 ms; Linux only.

    .venv/bin/python scripts/peak_memory.py -- seqexport export hybrid --checkpoint DIR --out OUT

Prints each line the command writes to stderr with the peak so far and the memory then, and
the overall peak last (docs/export.md#memory).
"""

import os
import subprocess
import sys
import threading
import time


def tree(pid: int) -> list[int]:
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out += tree(int(child))
    except OSError:  # ended meanwhile
        pass
    return out


def pss_anon(pid: int) -> int:
    """Bytes of the process's proportional anonymous memory (0 once it has ended)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["Pss_Anon"].split()[0]) * 1024
    except (OSError, KeyError):
        return 0


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, int]] = []
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    while proc.poll() is None:
        samples.append((time.monotonic(), sum(pss_anon(p) for p in tree(proc.pid))))
        time.sleep(0.05)
    reader.join(5)
    gb = 2**30
    for at, line in lines:
        before = [m for t, m in samples if t <= at] or [0]
        print(f"{at - start:7.1f} s  peak {max(before) / gb:6.2f} GB  now {before[-1] / gb:6.2f} GB | {line}")
    peak = max((m for _, m in samples), default=0)
    print(f"peak {peak / gb:.2f} GB (Pss_Anon of the process tree), exit code {proc.returncode}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
