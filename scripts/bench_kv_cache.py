"""The transformer decoder step over a cache appended in place vs one that is concatenated
(an export made before `past_lengths`), side by side at each context, with the bound of
reading the weights and the valid cache once, and the step's linears alone timed as Gemms
(how close ORT's GEMV itself comes to the bound).

    .venv/bin/python scripts/bench_kv_cache.py APPENDED_DIR CONCAT_DIR [--context 16 256 1024 4096]
"""

import argparse
import json

from seqexport.families.transformer.bench import compare_cache_layouts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("appended")
    ap.add_argument("concat")
    ap.add_argument("--context", type=int, nargs="+", default=[16, 256, 1024, 4096])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    r = compare_cache_layouts({"appended": a.appended, "concat": a.concat}, a.context, a.threads, a.repeats)
    print(f"memory read bandwidth {r['bandwidth']['gbs']:.1f} GB/s; weights read per step "
          f"{r['weights_bytes'] / 1e6:.1f} MB; batch 1, {a.threads} threads, medians")
    print(f"{'context':>7} {'appended ms':>11} {'concat ms':>9} {'appended/concat':>15} "
          f"{'bound ms':>8} {'appended/bound':>14} {'concat/bound':>12}")
    for row in r["rows"]:
        print(f"{row['context']:>7} {row['appended_ms']:>11.2f} {row['concat_ms']:>9.2f} {row['ratio_concat'] ** -1:>15.2f} "
              f"{row['appended_bound_ms']:>8.2f} {row['appended_over_bound']:>14.2f} {row['concat_over_bound']:>12.2f}")
    print(f"the step's linears alone (Gemms at batch 1, no other operator, no cache): {r['linears_only_ms']:.2f} ms, "
          f"{r['linears_only_over_weights_bound']:.2f}x the weights' bound: the floor ORT's GEMV sets")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
