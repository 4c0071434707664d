"""The floor under an int4 copy's step ratio: its step graph's linears alone, at batch 1.

The weight MatMuls of the float32 source's one-token graph (MatMul or Gemm on a weight in the
shared weights file) and of the int4 copy's (MatMulNBits, or a MatMul on a float32 weight it
kept) are taken out of the two graphs as they are — the same nodes, attributes and stored
weights, each now reading a (1, K) input of its own width — into two graphs of linears alone.
int4 ÷ float32 of the two is what ORT's GEMVs reach on this machine with nothing else in the
graph; the step ratio is that plus the rest of the step (norms, the scan's state update, the
attention over the cache), which int4 does not shrink. The two are timed in the same calls as
the steps (`bench.int8.run_int8_bench`), so the step's rest — step minus its linears, float32
and int4 — and the floor under the ratio, (int4 linears + float32 rest) ÷ float32 step, come
from one run on one machine state. (Random MatMuls of the same shapes, as this once used, were
another kernel than the graph's transposed Gemms; `run_int8_bench`'s blocks of calls say why
the float32 linears once read slower than the whole float32 step.)
"""

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnx.external_data_helper import load_external_data_for_tensor

from seqexport.errors import UsageError
from seqexport.export import int4
from seqexport.manifest import MANIFEST

LINEAR_OPS = ("MatMul", "Gemm", int4.NBITS)


def one_token_graph(folder: Path) -> tuple[str, Path]:
    """(name, file) of a folder's one-token graph: `step`, or a transformer's `decoder`."""
    m = json.loads((folder / MANIFEST).read_text())
    graph = next(g for g in ("step", "decoder") if g in m["graphs"])
    return graph, folder / m["graphs"][graph]["file"]


def _width(node: onnx.NodeProto, weight: onnx.TensorProto) -> int:
    """K of the node's (1, K) input: MatMulNBits says it; a Gemm's weight is (N, K) when transB."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == int4.NBITS:
        return attrs["K"]
    return weight.dims[1] if node.op_type == "Gemm" and attrs.get("transB") else weight.dims[0]


def linears_of(path: Path) -> tuple[onnx.ModelProto, dict]:
    """The graph's weight linears alone (see the module's doc): a graph of those nodes with their
    stored weights, one (1, K) input per width K, and what it holds. A linear's weight is an
    initializer of two or more dims in the weights file (constants under 1 KB stay in the graph:
    a broadcast by ones is arithmetic, not a weight)."""
    model = onnx.load(str(path), load_external_data=False)  # the weights read below, those used only
    inits = {t.name: t for t in model.graph.initializer}
    external = {n for n, t in inits.items() if t.data_location == TensorProto.EXTERNAL and len(t.dims) >= 2}
    nodes, used, widths, counts = [], {}, set(), {}
    for node in model.graph.node:
        if node.op_type not in LINEAR_OPS or len(node.input) < 2 or node.input[1] not in external:
            continue
        if any(x and x not in inits for x in node.input[2:]) or \
                any(a.name == "transA" and a.i for a in node.attribute):
            continue  # reads another activation, or a transposed one: not a weight linear of (1, K)
        k = _width(node, inits[node.input[1]])
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[0], copy.output[:] = f"x{k}", [f"y{len(nodes)}"]
        nodes.append(copy)
        widths.add(k)
        used.update({x: inits[x] for x in node.input[1:] if x})
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    for t in used.values():  # from the shared weights file (not the embedding table the step gathers from)
        if t.data_location == TensorProto.EXTERNAL:
            load_external_data_for_tensor(t, str(path.parent))
            t.data_location = TensorProto.DEFAULT
            del t.external_data[:]
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in sorted(widths)]
    outputs = [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in nodes]
    graph = helper.make_graph(nodes, "linears", inputs, outputs, list(used.values()))
    alone = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return alone, {"linears": len(nodes), "ops": counts,
                   "weights_mb": sum(np.prod(t.dims) * (4 if t.data_type == TensorProto.FLOAT else 1)
                                     for t in used.values()) / 1e6}


def _session(alone: onnx.ModelProto, options: ort.SessionOptions) -> tuple[ort.InferenceSession, object]:
    """A session of the linears alone, read from a temporary folder with its weights in a file
    beside it (a graph holding over 2 GB of weights, Qwen3.5-0.8B's float32 linears, cannot be
    serialised whole), and that folder, to be kept while the session lives."""
    folder = tempfile.TemporaryDirectory(prefix="seqexport-linears-")
    path = Path(folder.name) / "linears.onnx"
    onnx.save_model(alone, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="linears.onnx.data", size_threshold=1024)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), folder


def linears_sessions(folder: Path, baseline: Path, threads: int) -> tuple[dict, dict]:
    """The step's linears alone as two callables, the float32 source's and the int4 copy's (to
    be timed beside the steps themselves, in one `time_paired`), and what they hold."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    graph, _ = one_token_graph(Path(folder))
    meta, calls = {"graph": graph}, {}
    for name, f in (("float32", baseline), ("int4", folder)):
        alone, held = linears_of(one_token_graph(Path(f))[1])
        session, kept = _session(alone, options)
        del alone  # (its weights are in the session now)
        rng = np.random.default_rng(1)
        feeds = {i.name: rng.standard_normal((1, i.shape[1])).astype(np.float32) for i in session.get_inputs()}
        calls[name] = lambda s=session, feeds=feeds, kept=kept: s.run(None, feeds)
        meta[f"{name}_linears"], meta[f"{name}_weights_mb"] = held["linears"], held["weights_mb"]
        if name == "int4":
            meta["linears"], meta["int4_linears"] = held["linears"], held["ops"].get(int4.NBITS, 0)
    if meta["float32_linears"] != meta["linears"]:  # another model, or a graph this cannot read
        raise UsageError(f"{folder}'s {graph} graph has {meta['linears']} weight linears, its float32 source "
                         f"{baseline}'s {meta['float32_linears']}: not the same model's step")
    return meta, calls


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
