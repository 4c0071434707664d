"""The floor under an int4 copy's step ratio: its step graph's linears alone, at batch 1.

Each weight MatMul of the int4 step graph (MatMulNBits, or a MatMul on a float32 weight it kept)
becomes an independent MatMul of the same (K, N) over random weights, in one session; the same
chain with the same MatMuls as MatMulNBits (the copy's block size and accuracy level) in a
second. int4 ÷ float32 of the two is what ORT's GEMVs reach on this machine with nothing else in
the graph; the step ratio is that plus the rest of the step (norms, the scan's state update,
the attention over the cache), which int4 does not shrink. The chains are timed in the same
calls as the steps (`bench.int8.run_int8_bench`), so the step's rest — step minus its linears,
float32 and int4 — and the floor under the ratio, (int4 linears + float32 rest) ÷ float32 step,
come from one run on one machine state.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from seqexport.export import int4
from seqexport.manifest import MANIFEST


def step_linears(folder: Path) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]], dict]:
    """(graph, int4 (K, N) shapes, float32 (K, N) shapes, MatMulNBits attributes) of the copy's
    one-token graph: `step`, or a transformer's `decoder`."""
    m = json.loads((folder / MANIFEST).read_text())
    graph = next(g for g in ("step", "decoder") if g in m["graphs"])
    model = onnx.load(str(folder / m["graphs"][graph]["file"]), load_external_data=False)
    # the float32 weights are those in the shared weights file (constants under 1 KB stay in the
    # graph: a broadcast by ones is arithmetic, not a weight)
    stored = {n: t["dims"] for n, t in (m.get("weights") or {}).get("tensors", {}).items() if t["dtype"] == "float32"}
    q, f, attrs = [], [], {}
    for node in model.graph.node:
        if node.op_type == int4.NBITS:
            a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
            q.append((a["K"], a["N"]))
            attrs = a
        elif node.op_type == "MatMul" and len(stored.get(node.input[1], ())) == 2:
            f.append(tuple(stored[node.input[1]]))
    return graph, q, f, attrs


def chain(shapes: list[tuple[int, int]], seed: int = 0) -> onnx.ModelProto:
    """One MatMul per (K, N) weight, each reading a (1, K) input of its own width."""
    rng = np.random.default_rng(seed)
    nodes, inits, outputs = [], [], []
    for i, (k, n) in enumerate(shapes):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) * 0.02).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"y{i}"], name=f"linear{i}"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, n]))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in sorted({k for k, _ in shapes})]
    return helper.make_model(helper.make_graph(nodes, "linears", inputs, outputs, inits),
                             opset_imports=[helper.make_opsetid("", 18)])


def linears_sessions(folder: Path, threads: int) -> tuple[dict, dict]:
    """The copy's step linears alone as two callables, float32 and as the copy has them (to be
    timed beside the steps themselves, in one `time_paired`), and what they hold."""
    graph, q, f, attrs = step_linears(Path(folder))
    shapes = q + f
    fp32 = chain(shapes)
    copy = onnx.ModelProto()
    copy.CopyFrom(fp32)
    quantized = int4.quantize_graph(copy, {f"linear{i}" for i in range(len(q))}, 4,
                                    attrs.get("block_size", int4.BLOCK_SIZE), attrs.get("accuracy_level", 0))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = {name: ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
                for name, m in (("float32", fp32), ("int4", quantized))}
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal((1, i.shape[1])).astype(np.float32) for i in sessions["float32"].get_inputs()}
    meta = {"graph": graph, "linears": len(shapes), "int4_linears": len(q),
            "float32_weights_mb": sum(k * n for k, n in shapes) * 4 / 1e6}
    return meta, {n: (lambda s=s: s.run(None, feeds)) for n, s in sessions.items()}


def step_floor(step_fp32_ms: float, step_int4_ms: float, alone: dict) -> dict:
    """What the step spends outside its linears, float32 and int4 (timed in the same calls), and
    the floor under the step ratio that follows: int4's linears plus float32's rest, ÷ the
    float32 step (int4 shrinks the linears only; the rest — norms, the scan's state update,
    attention, every node's dispatch — is float32 in both)."""
    rest32 = step_fp32_ms - alone["float32_ms"]
    return {"rest_float32_ms": rest32, "rest_int4_ms": step_int4_ms - alone["int4_ms"],
            "floor_ratio": (alone["int4_ms"] + rest32) / step_fp32_ms}


def _one_round(folder: str, contexts: tuple[int, ...], new_tokens: int, repeats: int, threads: int) -> dict:
    """One fresh process's `run_int8_bench` of a quantised folder beside its source (JSON out)."""
    import subprocess
    import sys

    code = ("import json, sys; from seqexport.bench.int8 import run_int8_bench, baseline_of; "
            f"r = run_int8_bench({folder!r}, baseline_of({folder!r}), contexts={contexts!r}, "
            f"new_tokens={new_tokens}, repeats={repeats}, threads={threads}); print(json.dumps(r))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def alternating_rounds(folders: list[str], rounds: int = 3, contexts=(16,), new_tokens: int = 8, repeats: int = 5,
                       threads: int = 2, log=print) -> dict[str, list[dict]]:
    """Each quantised folder beside its float32 source, `rounds` times, every run a fresh process,
    the folders taken in turn within a round (a busy hour slows every model alike)."""
    out: dict[str, list[dict]] = {f: [] for f in folders}
    for r in range(rounds):
        for f in folders:
            out[f].append(_one_round(f, tuple(contexts), new_tokens, repeats, threads))
            row = out[f][-1]["rows"][0]
            log(f"round {r + 1} {f}: step ratio {row['step_ratio']:.3f}")
    return out


def format_rounds(results: dict[str, list[dict]]) -> str:
    """Medians over the rounds, each round's step ratio beside them."""
    from statistics import median

    lines = ["folder   weights   step fp32 ms   step q ms   q/fp32 (median; rounds)   linears alone q/fp32   "
             "floor (q linears + fp32 rest) / fp32 step   size fp32 -> q MB"]
    for f, runs in results.items():
        q = runs[0]["weights"]
        rows = [r["rows"][0] for r in runs]
        ratios = [row["step_ratio"] for row in rows]
        alone = [r["linears_alone"]["ratio"] for r in runs if "linears_alone" in r]
        floored = [r for r in runs if "floor_ratio" in r.get("linears_alone", {})]  # (floor, step ratio) per run
        floors = [r["linears_alone"]["floor_ratio"] for r in floored]
        over = [r["rows"][0]["step_ratio"] / r["linears_alone"]["floor_ratio"] for r in floored]
        size = runs[0]["disk_bytes"]
        lines.append(f"{f}   {q}   {median(row['step_float32_ms'] for row in rows):.2f}   "
                     f"{median(row[f'step_{q}_ms'] for row in rows):.2f}   "
                     f"{median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)})   "
                     f"{f'{median(alone):.3f}' if alone else 'n/a'}   "
                     f"{f'{median(floors):.3f} (ratio / floor {median(over):.2f})' if floors else 'n/a'}   "
                     f"{size['float32'] / 1e6:.0f} -> {size[q] / 1e6:.0f}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m seqexport.bench.int4 [--rounds N] QUANTISED_DIR...
    import argparse

    parser = argparse.ArgumentParser(description="Quantised copies beside their float32 sources, "
                                                 "alternating fresh-process rounds; medians.")
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    res = alternating_rounds(args.folders, args.rounds, (args.context,))
    print(format_rounds(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
