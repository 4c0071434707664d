"""One decode step through the runtime at several batch sizes, for one or more exports side by
side (blocks alternating between them, so that load from other jobs falls on all alike).

    .venv/bin/python scripts/bench_step_batch.py DIR [DIR ...] [--batch 1 4 16 64] [--threads 1]

Each block: the state after the prompts (`begin`), one untimed step, then 8 timed steps.
Prints per batch the median and fastest step, in wall time and in the calling thread's CPU
time (with one intra-op thread ORT computes on the calling thread, so CPU time is the step's
own cost even on a machine busy with other jobs), and the step at batch b over batch 1.
"""

import argparse
import os
import time

import numpy as np

from seqexport.runtime import load

STEPS = 8


def block(model, begun, tokens) -> tuple[float, float]:
    """Wall and CPU seconds per step over STEPS steps from the begun state."""
    _, state = model.step(tokens, begun)  # untimed: a state stepped again may copy its buffers
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(STEPS):
        _, state = model.step(tokens, state)
    return (time.perf_counter() - wall) / STEPS, (time.thread_time() - cpu) / STEPS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads [1]")
    p.add_argument("--rounds", type=int, default=25, help="timed blocks per export and batch [25]")
    args = p.parse_args()
    models = [load(f, threads=args.threads) for f in args.folders]
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.1f}; ms per step: median (fastest)")
    first: dict[int, list[float]] = {}
    for b in args.batch:
        rows = [[5 + (i % 7), 6, 7, 8, 9] for i in range(b)]
        begun = [m.begin(rows)[1] for m in models]
        tokens = np.full(b, 5, np.int64)
        times = [[] for _ in models]
        for _ in range(3):  # warm-up
            for m, s in zip(models, begun):
                block(m, s, tokens)
        for _ in range(args.rounds):
            for i, (m, s) in enumerate(zip(models, begun)):
                times[i].append(block(m, s, tokens))
        cells = []
        for i, (f, t) in enumerate(zip(args.folders, times)):
            wall, cpu = np.array(t).T * 1e3
            first.setdefault(i, [np.median(cpu)])
            cells.append(f"{os.path.basename(f.rstrip('/'))}: wall {np.median(wall):.3f} ({wall.min():.3f}) "
                         f"cpu {np.median(cpu):.3f} ({cpu.min():.3f}) x{np.median(cpu) / first[i][0]:.2f}")
        print(f"batch {b:3d}  " + "  |  ".join(cells), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}; x: median CPU time over the first batch's")


if __name__ == "__main__":
    main()
