"""Which tensors of an exported prefill graph hold subnormal floats (nonzero, below 1.2e-38):
Intel's cores compute with those many times slower, so a lowering that forms them (products of
two small decays, say) can make a prefill several times slower there and not on AMD's.

    .venv/bin/python scripts/count_subnormals.py exported/hybrid-dates --length 256

Every top-level node's outputs become graph outputs (a copy of the graph in a temporary file
beside it), the prefill runs once on random token ids from a fresh state (ORT's graph
optimisations off, so the tensors are the graph's own), and each float tensor holding any
subnormal is listed: its count, share, operator, node and the scope the exporter recorded.
Exit status 1 when any is found.
"""

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from seqexport.parity.inputs import random_inputs
from seqexport.runtime.models import load
from seqexport.runtime.session import session_options


def count(folder: Path, length: int, graph: str = "prefill") -> list[tuple[int, float, str, str, str]]:
    """(subnormals, share, op type, node name, scope) of each float tensor that holds any."""
    model = load(folder, "cpu", threads=2)
    g = model.graphs[graph]
    proto = onnx.load_model(str(g.path), load_external_data=False)
    listed = {o.name for o in proto.graph.output}
    made_by = {}
    for node in proto.graph.node:
        scope = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "")
        for name in node.output:
            if name and name not in listed:
                proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                made_by[name] = (node.op_type, node.name, scope)
    shared = model.shared_weights.for_graph(g.path) if model.shared_weights else None
    opts = session_options(2, shared)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.NamedTemporaryFile(dir=g.path.parent, suffix=".onnx") as copy:  # beside it: its weights' paths
        onnx.save_model(proto, copy.name)
        session = ort.InferenceSession(copy.name, opts, providers=["CPUExecutionProvider"])
    feeds = random_inputs(g.spec, dict(batch=1, seq_len=length, past_len=0), np.random.default_rng(0), zero_state=True)
    feeds |= {t.name: np.array([1], np.int64) for t in g.spec.inputs if t.role == "keep"}
    names = [o.name for o in session.get_outputs()]
    tiny = np.finfo(np.float32).tiny
    found = []
    for name, value in zip(names, session.run(None, feeds), strict=True):
        if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.size:
            n = int(np.count_nonzero((np.abs(value) < tiny) & (value != 0)))
            if n:
                found.append((n, n / value.size, *made_by.get(name, ("(graph output)", name, ""))))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--length", type=int, default=256, help="prompt tokens [256]")
    p.add_argument("--graph", default="prefill")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    found = count(args.folder, args.length, args.graph)
    print(f"{len(found)} float tensors of {args.folder}'s {args.graph} ({args.length} tokens) hold subnormals")
    for n, share, op, node, scope in sorted(found, reverse=True)[: args.top]:
        print(f"  {n:9d} {share:8.3%}  {op:12s} {node}  {scope}")
    by_op = Counter()
    for n, _, op, _, _ in found:
        by_op[op] += n
    if by_op:
        print("  by operator: " + ", ".join(f"{op} {n}" for op, n in by_op.most_common()))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
