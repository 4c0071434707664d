"""The transformer's decoder step with its attention as MatMuls beside ONNX's fused `Attention`
(`seqexport export transformer --attention matmul|fused` of one checkpoint), each ÷ the floor
of the step's linears alone (`bench.gemv_floor`) and ÷ that floor plus reading the state the
step must read (the valid self-attention cache and the cross K/V, once, at the memory read
bandwidth measured in the same process), in alternating fresh-process rounds.

    python -m seqexport.bench.attention --matmul exported/base --fused exported/base-fused \\
        --contexts 16 4096 --rounds 3

Each round is a fresh process timing both exports' runtime step (advancing, the cache owned)
in turn at each context (`families.transformer.bench.compare_cache_layouts`, which also times
the linears alone); the rounds alternate which export goes first. Reported: every round's
figures and the medians over rounds, with the load average before and after.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def one_round(folders: dict[str, str], contexts, threads: int, repeats: int) -> dict:
    """One process's figures: per context each label's ms, ÷ linears, and fused ÷ matmul."""
    from seqexport.families.transformer.bench import compare_cache_layouts

    r = compare_cache_layouts(folders, contexts, threads, repeats, 0.2)
    rows = [{"context": row["context"], **{f"{k}_ms": row[f"{k}_ms"] for k in folders},
             **{f"{k}_over_linears": row[f"{k}_over_linears"] for k in folders},
             **{f"{k}_over_floor": row[f"{k}_over_floor"] for k in folders}, "floor_ms": row["matmul_floor_ms"],
             "fused_over_matmul": row["fused_ms"] / row["matmul_ms"]} for row in r["rows"]]
    return {"linears_only_ms": r["linears_only_ms"], "gbs": r["bandwidth"]["gbs"], "rows": rows, "order": list(folders)}


def compare(matmul: Path, fused: Path, contexts, rounds: int = 3, threads: int = 2, repeats: int = 5) -> dict:
    """`rounds` fresh processes, alternating which export is timed first; medians over rounds."""
    results = []
    for i in range(rounds):
        order = [("matmul", str(matmul)), ("fused", str(fused))]
        folders = dict(order if i % 2 == 0 else order[::-1])
        args = json.dumps({"folders": folders, "contexts": list(contexts), "threads": threads, "repeats": repeats})
        out = subprocess.run([sys.executable, "-m", "seqexport.bench.attention", "--one", args],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    medians = []
    for j, context in enumerate(contexts):
        keys = [k for k in results[0]["rows"][j] if k != "context"]
        medians.append({"context": context, **{k: statistics.median(r["rows"][j][k] for r in results) for k in keys}})
    return {"rounds": results, "medians": medians, "gbs": statistics.median(r["gbs"] for r in results),
            "linears_only_ms": statistics.median(r["linears_only_ms"] for r in results)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matmul", type=Path, help="the export with --attention matmul")
    p.add_argument("--fused", type=Path, help="the same checkpoint exported with --attention fused")
    p.add_argument("--contexts", type=int, nargs="+", default=[16, 4096], help="tokens of context")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes, alternating which goes first")
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    p.add_argument("--repeats", type=int, default=5, help="rounds of calls within a process")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # one round, in this process (JSON arguments)
    args = p.parse_args(argv)
    if args.one:
        a = json.loads(args.one)
        print(json.dumps(one_round(a["folders"], a["contexts"], a["threads"], a["repeats"])))
        return
    if args.matmul is None or args.fused is None:
        p.error("--matmul and --fused are both needed")
    load = os.getloadavg()
    r = compare(args.matmul, args.fused, args.contexts, args.rounds, args.threads, args.repeats)
    r["load_average"] = [load, os.getloadavg()]
    print(f"load average {load[0]:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.threads} threads; "
          f"{args.rounds} fresh-process rounds; linears alone {r['linears_only_ms']:.2f} ms, "
          f"read bandwidth {r['gbs']:.1f} GB/s (medians)")
    print("floor = linears alone + the state the step reads (valid cache, cross K/V) once at that bandwidth")
    print(f"{'context':>7} {'round':>6} {'matmul ms':>9} {'fused ms':>8} {'matmul/linears':>14} "
          f"{'fused/linears':>13} {'floor ms':>8} {'matmul/floor':>12} {'fused/floor':>11} {'fused/matmul':>12}")
    for label, rows in [*((str(i), x["rows"]) for i, x in enumerate(r["rounds"])), ("median", r["medians"])]:
        for row in rows:
            print(f"{row['context']:>7} {label:>6} {row['matmul_ms']:>9.2f} {row['fused_ms']:>8.2f} "
                  f"{row['matmul_over_linears']:>14.2f} {row['fused_over_linears']:>13.2f} {row['floor_ms']:>8.2f} "
                  f"{row['matmul_over_floor']:>12.2f} {row['fused_over_floor']:>11.2f} {row['fused_over_matmul']:>12.2f}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
