"""Mamba scan lowerings, the scan alone: ORT CPU vs the eager reference and chunked scans.

    .venv/bin/python scripts/bench_scan.py [--d-inner 128 1536] [--length 1024] [--repeats 7]

Batch 1, the same thread count on both sides; medians of paired repeats. The study itself
is `seqexport.bench.lowering_study.study_scan`; scripts/study_lowerings.py times the whole model.
"""

import argparse
import json

from seqexport.bench.lowering_study import LOWERINGS, format_rows, study_scan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-inner", type=int, nargs="+", default=[128, 1536])
    p.add_argument("--d-state", type=int, default=16)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lowerings", nargs="+", default=list(LOWERINGS), choices=LOWERINGS)
    p.add_argument("--json", dest="json_path", help="write the rows here")
    args = p.parse_args()
    rows = []
    for d_inner in args.d_inner:
        rows += study_scan(d_inner, args.d_state, args.length, args.lowerings, args.repeats, args.threads)
        print(format_rows(rows), flush=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
