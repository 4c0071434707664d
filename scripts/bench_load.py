"""Load seconds, RSS after load and after a short run, step time: one fresh process per folder,
the folders alternating round by round (so a busy machine slows each alike).

    .venv/bin/python scripts/bench_load.py exported/mamba-130m-old exported/mamba-130m --rounds 2

Each round runs, in a new process: `seqexport.runtime.load(DIR, "cpu", threads=2)` (manifest and
sha256 checks included), then a 64-token prefill and 15 one-token steps (Mamba: `step`); RSS is
read from /proc/self/statm.
"""

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096
import seqexport.runtime as rt
r0 = rss(); t = time.perf_counter()
m = rt.load(sys.argv[1], 'cpu', threads=2)
load = time.perf_counter() - t; r1 = rss()
lg, st = m.step(np.ones((1, 64), np.int64), m.start(1))
ts = []
for _ in range(15):
    t = time.perf_counter(); lg, st = m.step(np.ones((1,), np.int64), st); ts.append(time.perf_counter() - t)
print(json.dumps(dict(load_s=load, rss_start=r0, rss_after_load=r1, rss_after_run=rss(), step_ms=1e3 * float(np.median(ts)))))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    runs = {f: [] for f in args.folders}
    for _ in range(args.rounds):
        for f in args.folders:
            out = subprocess.run([sys.executable, "-c", CHILD, f], capture_output=True, text=True, check=True)
            runs[f].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for f, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{f}: load {med['load_s']:.2f} s, RSS after load {med['rss_after_load'] / 1e6:.0f} MB, after a "
              f"64-token prefill + 15 steps {med['rss_after_run'] / 1e6:.0f} MB, step {med['step_ms']:.1f} ms "
              f"(medians of {len(rs)})")


if __name__ == "__main__":
    main()
