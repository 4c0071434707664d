"""Prefill time of each scan lowering in ORT CPU vs the eager sequential reference loop.

    .venv/bin/python scripts/bench_scan.py [--d-inner 128 1536] [--length 1024] [--repeats 7]

2 threads on both sides, batch 1, d_state 16; medians of paired repeats
(eager, then each lowering, per repeat). Nodes are counted inside bodies too.
"""

import argparse
import statistics
import time

import onnx
import onnxruntime as ort
import torch
from seqexport.models.mamba import selective_scan_ref
from torch import nn

from seqexport.export.scan import LOWERINGS, custom_translation_table, scan_for

NAMES = ["u", "delta", "B", "C", "h0"]


class ScanModule(nn.Module):
    def __init__(self, lowering: str, A: torch.Tensor, D: torch.Tensor):
        super().__init__()
        self.A, self.D, self.scan = nn.Parameter(A), nn.Parameter(D), scan_for(lowering)

    def forward(self, u, delta, B, C, h0):
        return self.scan(u, delta, self.A, B, C, self.D, h0)


def eager_vectorised(u, delta, A, B, C, D, h0):
    """DESIGN §5's baseline: exp(ΔA) and ΔBu for all steps at once, then the step loop."""
    dA = torch.exp(delta.unsqueeze(-1) * A)  # (b, l, d_in, n)
    dBu = (delta * u).unsqueeze(-1) * B.unsqueeze(2)  # (b, l, d_in, n)
    h, ys = h0, []
    for t in range(u.shape[1]):
        h = dA[:, t] * h + dBu[:, t]
        ys.append((h * C[:, t, None, :]).sum(-1))
    return torch.stack(ys, dim=1) + u * D, h


def count_nodes(graph: onnx.GraphProto) -> int:
    return sum(
        1 + sum(count_nodes(a.g) for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
        for node in graph.node
    )


def session_for(lowering, A, D, inputs) -> tuple[ort.InferenceSession, int, float]:
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch} if lowering == "unrolled" else {0: batch, 1: length}
    start = time.perf_counter()
    model = torch.onnx.export(
        ScanModule(lowering, A, D).eval(),
        inputs,
        dynamo=True,
        verbose=False,
        input_names=NAMES,
        dynamic_shapes=(dims, dims, dims, dims, {0: batch}),
        custom_translation_table=custom_translation_table(lowering),
    ).model_proto
    export_s = time.perf_counter() - start
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return session, count_nodes(model.graph), export_s


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def bench(d_in: int, n: int, length: int, repeats: int, lowerings: list[str]) -> None:
    A, D = -torch.exp(torch.rand(d_in, n) * 2), torch.randn(d_in)
    u, delta, B, C, h0 = x = (
        torch.randn(1, length, d_in), torch.rand(1, length, d_in) * 0.5,
        torch.randn(1, length, n), torch.randn(1, length, n), torch.randn(1, d_in, n),
    )  # fmt: skip
    feeds = dict(zip(NAMES, (t.numpy() for t in x), strict=True))
    sessions = {low: session_for(low, A, D, x) for low in lowerings}
    eagers = {"reference": selective_scan_ref, "vectorised": eager_vectorised}
    times = {name: [] for name in [*eagers, *sessions]}
    with torch.no_grad():
        for _ in range(repeats + 1):  # the first round warms up
            for name, fn in eagers.items():
                times[name].append(timed(fn, u, delta, A, B, C, D, h0))
            for low, (sess, _, _) in sessions.items():
                times[low].append(timed(sess.run, None, feeds))
    ms = {name: statistics.median(ts[1:]) * 1e3 for name, ts in times.items()}
    print(
        f"d_inner {d_in}, d_state {n}, b 1, L {length}: eager reference loop "
        f"{ms['reference']:.1f} ms, eager vectorised loop {ms['vectorised']:.1f} ms"
    )
    for low, (_, nodes, export_s) in sessions.items():
        ratios = [
            statistics.median(o / e for o, e in zip(times[low][1:], times[name][1:], strict=True))
            for name in eagers
        ]
        print(
            f"  {low:9s} ORT {ms[low]:8.1f} ms  ÷ reference {ratios[0]:5.2f}  ÷ vectorised "
            f"{ratios[1]:5.2f}  nodes {nodes:5d}  export {export_s:5.1f} s"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-inner", type=int, nargs="+", default=[128, 1536])
    p.add_argument("--d-state", type=int, default=16)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--lowerings", nargs="+", default=list(LOWERINGS), choices=LOWERINGS)
    args = p.parse_args()
    torch.set_num_threads(2)
    for d_in in args.d_inner:
        bench(d_in, args.d_state, args.length, args.repeats, args.lowerings)


if __name__ == "__main__":
    main()
