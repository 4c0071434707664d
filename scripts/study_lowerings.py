"""The three Mamba scan lowerings side by side: export time, node count, ORT prefill vs the
eager reference and chunked scans (batch 1, the same thread count on both sides, medians).

    .venv/bin/python scripts/study_lowerings.py --preset tiny --preset 130m   # the whole model
    .venv/bin/python scripts/study_lowerings.py --d-inner 128 1536            # the scan alone

The studies are `seqexport.families.mamba.lowering_study.study` and `study_scan`.
"""

import argparse
import json

from seqexport.families.mamba.lowering_study import LOWERINGS, format_rows, study, study_scan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", dest="presets", action="append", help="Mamba preset (repeat): tiny, 130m [tiny]")
    p.add_argument("--d-inner", type=int, nargs="+", help="time the scan alone at these mixer widths instead")
    p.add_argument("--d-state", type=int, default=16, help="SSM state size of the scan-only study [16]")
    p.add_argument("--lowering", dest="lowerings", action="append", choices=LOWERINGS,
                   help="lowering to study (repeat) [all]")
    p.add_argument("--length", type=int, default=1024, help="prefill length [1024]")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds, medians reported [5]")
    p.add_argument("--threads", type=int, default=2, help="threads of torch and ORT alike [2]")
    p.add_argument("--json", dest="json_path", help="write the rows here")
    args = p.parse_args()
    lowerings = args.lowerings or list(LOWERINGS)
    runs = ([lambda d=d: study_scan(d, args.d_state, args.length, lowerings, args.repeats, args.threads)
             for d in args.d_inner] if args.d_inner else
            [lambda p=p: study(p, args.length, lowerings, args.repeats, args.threads) for p in args.presets or ["tiny"]])
    rows = []
    for run in runs:
        rows += run()
        print(format_rows(rows), flush=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
