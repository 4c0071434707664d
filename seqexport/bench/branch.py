"""A branch step beside an advancing one, for any family, side by side in one process.

A branch steps an earlier state again (beam search, "regenerate", n samples from one prompt).
A replaced state (Mamba, RWKV-7, the Mamba-2 layers) is a graph input like any other: a branch
costs what an advancing step costs. An appended cache (the transformer's self-attention, the
hybrid's attention layers) is written in place by an advancing step, and by a step from an
earlier state once the continuations made from it are let go ("regenerate"); while a newer
state is held, a branch copies it once (`seqexport.state.appended.CopyPool`).

    python -m seqexport.bench.branch exported/transformer-base exported/hybrid --contexts 16 4096

Per folder and context: single calls of the advancing step, of the branch step (a newer state
held: a copy) and of the regenerate step (none held) taken in turn (`timing.paired_samples`),
their medians and the medians of the per-round ratios; and the first branch, into memory the
process did not hold yet (`first_branch_ms`, one call).
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from seqexport import families
from seqexport.bench.cases import advancing_step, branch_step, regenerate_step
from seqexport.bench.timing import median_ratio, paired_samples
from seqexport.runtime.models import load


def branch_vs_advance(folder, contexts, threads: int = 2, repeats: int = 15, seed: int = 0) -> dict:
    """{"family", "rows": [{context, advance_ms, branch_ms, branch_over_advance, regenerate_ms,
    regenerate_over_advance, first_branch_ms}]}."""
    rt = load(folder, "cpu", threads=threads)
    bench = families.get(rt.family).bench
    contexts = bench.check_contexts(rt.config, tuple(contexts))
    rng = np.random.default_rng(seed)
    rows = []
    for context in contexts:
        state = bench.decode_state(rt, 1, context, rng, bench.PROMPT_LEN[False])
        tokens = rng.integers(1, rt.vocab_size, 1, dtype=np.int64)
        branch = branch_step(rt, tokens, state)
        t = time.perf_counter()
        branch()  # the first: its copy goes into memory no earlier branch let go
        first = time.perf_counter() - t
        got = paired_samples({"advance": advancing_step(rt, tokens, state), "branch": branch,
                              "regenerate": regenerate_step(rt, tokens, state)}, repeats)
        rows.append({"context": context, "advance_ms": statistics.median(got["advance"]) * 1e3,
                     "branch_ms": statistics.median(got["branch"]) * 1e3,
                     "branch_over_advance": median_ratio(got["branch"], got["advance"]),
                     "regenerate_ms": statistics.median(got["regenerate"]) * 1e3,
                     "regenerate_over_advance": median_ratio(got["regenerate"], got["advance"]),
                     "first_branch_ms": first * 1e3, "state_bytes": state.nbytes})
    return {"folder": str(folder), "family": rt.family, "threads": threads, "repeats": repeats, "rows": rows}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="exported folders")
    p.add_argument("--contexts", type=int, nargs="+", default=[16, 4096], help="tokens of context behind the state")
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    p.add_argument("--repeats", type=int, default=15, help="rounds of one advancing and one branch step each")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    load_start = os.getloadavg()
    results = [branch_vs_advance(f, args.contexts, args.threads, args.repeats) for f in args.folders]
    print(f"load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, "
          f"{args.threads} threads, {args.repeats} alternating rounds (medians)")
    print(f"{'folder':<36} {'family':<12} {'context':>7} {'state MB':>9} {'advance ms':>10} {'branch ms':>9} "
          f"{'branch/advance':>14} {'regenerate/advance':>18} {'first branch ms':>15}")
    for r in results:
        for row in r["rows"]:
            print(f"{r['folder'][-36:]:<36} {r['family']:<12} {row['context']:>7} {row['state_bytes'] / 1e6:>9.1f} "
                  f"{row['advance_ms']:>10.2f} {row['branch_ms']:>9.2f} {row['branch_over_advance']:>14.2f} "
                  f"{row['regenerate_over_advance']:>18.2f} {row['first_branch_ms']:>15.1f}")
    if args.json:
        args.json.write_text(json.dumps({"load_average": [load_start, os.getloadavg()], "results": results},
                                        indent=1))


if __name__ == "__main__":
    main()
