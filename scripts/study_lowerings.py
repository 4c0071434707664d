"""Mamba scan lowerings, whole model: export time, node count, ORT prefill vs the eager scans.

    .venv/bin/python scripts/study_lowerings.py --preset tiny --preset 130m --json docs/lowerings.json

The study itself is `seqexport.bench.lowering_study.study`; scripts/bench_scan.py times
the scan alone.
"""

import argparse
import json

from seqexport.bench.lowering_study import LOWERINGS, format_rows, study


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", dest="presets", action="append", help="Mamba preset (repeat): tiny, 130m [tiny]")
    p.add_argument("--lowering", dest="lowerings", action="append", choices=LOWERINGS,
                   help="lowering to study (repeat) [all]")
    p.add_argument("--length", type=int, default=1024, help="prefill length [1024]")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds, medians reported [5]")
    p.add_argument("--threads", type=int, default=2, help="threads of torch and ORT alike [2]")
    p.add_argument("--json", dest="json_path", help="write the rows here")
    args = p.parse_args()
    rows = []
    for preset in args.presets or ["tiny"]:
        rows += study(preset, args.length, args.lowerings or LOWERINGS, args.repeats, args.threads)
        print(format_rows(rows), flush=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
