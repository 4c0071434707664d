"""Where a prefill graph's time goes, or a transformer decoder step's: ONNX Runtime's own
profiler over one exported folder.

    .venv/bin/python scripts/profile_prefill.py exported/mamba-130m --length 1024 --threads 2
    .venv/bin/python scripts/profile_prefill.py exported/transformer-base --length 4096

Runs the prefill graph (the runtime's session options and shared weights) on a fresh state,
`--runs` times after a warm-up, with `logits_to_keep` 1 (what generation asks for) and 0 (every
position; what exports without the input always did), and prints the kernel time by operator
type and by top-level node (a Loop's body counts under its Loop), as shares of the total. For a
transformer, `--length` is the decoder step's context: one token over a cache of that many
valid slots, in the buffer the runtime would hold (`seqexport bench`'s step).
"""

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from seqexport.manifest import read_manifest
from seqexport.parity.inputs import random_inputs
from seqexport.runtime.models import load
from seqexport.runtime.session import session_options


def profile(folder: Path, graph: str, length: int, keep: int | None, threads: int, runs: int) -> dict:
    model = load(folder, "cpu", threads=threads)
    transformer = model.family == "transformer"
    g = model.graphs["decoder" if transformer else graph]
    shared = model.shared_weights.for_graph(g.path) if model.shared_weights else None
    rng = np.random.default_rng(0)
    if transformer:  # the decoder step: one token over `length` valid cache slots
        from seqexport.families.transformer.bench import PROMPT_LEN, _step_feeds

        feeds = {k: np.asarray(v) for k, v in _step_feeds(model, 1, length, rng, PROMPT_LEN[False]).items()}
        keeps = []
    else:
        feeds = random_inputs(g.spec, dict(batch=1, seq_len=length, past_len=0), rng, zero_state=True)  # (a hybrid: no cache yet)
        keeps = [t.name for t in g.spec.inputs if t.role == "keep"]
    if keep is not None:
        feeds |= {name: np.array([keep], np.int64) for name in keeps}
    plain = ort.InferenceSession(str(g.path), session_options(threads, shared), providers=["CPUExecutionProvider"])
    plain.run(None, feeds)
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        plain.run(None, feeds)
        walls.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as tmp:
        opts = session_options(threads, shared)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "prefill")
        session = ort.InferenceSession(str(g.path), opts, providers=["CPUExecutionProvider"])
        session.run(None, feeds)  # warm-up, excluded below
        for _ in range(runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs_seen = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    first_timed = runs_seen[1]["ts"] if len(runs_seen) > 1 else 0
    body = _body_node_names(onnx.load_model(str(g.path), load_external_data=False).graph)
    by_op, by_node, in_body, calls = Counter(), Counter(), Counter(), Counter()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < first_timed:
            continue
        op, node = e.get("args", {}).get("op_name", "?"), e["name"].removesuffix("_kernel_time")
        if node in body:  # a Loop/Scan's time includes its body's nodes: listed apart below
            in_body[op] += e["dur"]
        else:  # a top-level node (those ORT fused have new names: none is in a body)
            by_op[op] += e["dur"]
            by_node[node] += e["dur"]
            calls[op] += 1
    return {"graph": g.spec.name, "length": length, "logits_to_keep": keep if keeps else "(no input)",
            "wall_ms_median": float(np.median(walls)) * 1e3, "kernel_us": by_op, "node_us": by_node,
            "body_us": in_body, "runs": runs, "op_calls": calls}


def _body_node_names(graph) -> set[str]:
    """Names of the nodes inside every Loop/Scan/If body of `graph`, at any depth."""
    names = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                names |= {n.name for n in sub.node} | _body_node_names(sub)
    return names


def show(r: dict, top: int) -> None:
    total = sum(r["kernel_us"].values()) or 1
    print(f"\n{r['graph']} L={r['length']} logits_to_keep={r['logits_to_keep']}: wall {r['wall_ms_median']:.1f} ms "
          f"(median of {r['runs']}), kernels {total / r['runs'] / 1e3:.1f} ms per run, "
          f"{sum(r['op_calls'].values()) / r['runs']:.0f} top-level nodes run")
    for title, counts in (("by operator type (top-level nodes)", r["kernel_us"]), ("by node", r["node_us"]),
                          ("inside Loop/Scan bodies, by operator type", r["body_us"])):
        print(f"  {title}:")
        for name, us in counts.most_common(top):
            n = r["op_calls"][name] / r["runs"] if counts is r["kernel_us"] else 0
            print(f"    {us / total:6.1%}  {us / r['runs'] / 1e3:8.2f} ms  {name}" + (f"  ({n:.0f} nodes)" if n else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--graph", default="prefill")
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--top", type=int, default=10)
    args = p.parse_args()
    transformer = read_manifest(args.folder, verify=False)["family"] == "transformer"
    for keep in ((None,) if transformer else (1, 0)):
        show(profile(args.folder, args.graph, args.length, keep, args.threads, args.runs), args.top)


if __name__ == "__main__":
    main()
