"""The gated delta rule's prefill lowering alone, against transformers' own chunked rules (their
torch paths) on the same inputs, paired rounds in one process, every side at the same thread
count: one layer's op at a real shape, decay per head (Qwen3.5's Gated DeltaNet:
`torch_chunk_gated_delta_rule`) or per head and key channel (Kimi-Linear's KDA:
`chunk_kimi_delta_attention`), unbounded or bounded (Ling 3's, g = -5 σ(·): the op told the
bound, its factored form).

    .venv/bin/python scripts/bench_delta_rule_op.py [--heads 32] [--dim 128] [--length 1024]
        [--rounds 5] [--threads 2]

Prints, per decay form, the medians and ORT ÷ transformers as the median of per-round ratios,
and the largest difference of the outputs (y and the final state) from transformers'.
Kimi-Linear-48B's KDA layers: 32 heads of 128; Qwen3.5-0.8B's DeltaNets: 16 of 128.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from seqexport.families.hybrid.delta_rule import gated_delta_chunked, translation_table

BOUND = -5.0  # Ling 3's kda_lower_bound


class Rule(nn.Module):
    def __init__(self, lower_bound: float | None = None):
        super().__init__()
        self.lower_bound = lower_bound

    def forward(self, q, k, v, g, beta, s0):
        return gated_delta_chunked(q, k, v, g, beta, s0, lower_bound=self.lower_bound)


def inputs(heads: int, dim: int, length: int, per_channel: bool, bounded: bool = False):
    """As the layers hand them over: q, k L2-normed (q times dim^-0.5), β in (0, 1), log decays
    as the models' initialisations give them (A up to 16: e^g down to e^-16 a token; bounded,
    BOUND σ(A x), x ~ N(0, 1): most near 0 or the bound)."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(1, length, heads, dim, generator=gen), dim=-1)
            for _ in range(2))
    v = torch.randn(1, length, heads, dim, generator=gen)
    beta = torch.rand(1, length, heads, generator=gen)
    shape = (1, length, heads, dim) if per_channel else (1, length, heads)
    g = -torch.rand(shape, generator=gen) * torch.rand(shape[2:], generator=gen) * 16
    if bounded:
        g = BOUND * torch.sigmoid(torch.randn(shape, generator=gen) * (1 + 15 * torch.rand(heads, 1, generator=gen)))
    return q * dim ** -0.5, k, v, g, beta, torch.zeros(1, heads, dim, dim)


def theirs(per_channel: bool):
    if per_channel:
        from transformers.models.kimi_linear.modeling_kimi_linear import (
            chunk_kimi_delta_attention as rule,
        )
        return lambda q, k, v, g, beta, s0: rule(q * q.shape[-1] ** 0.5, k, v, g, beta, initial_state=s0,
                                                 output_final_state=True)
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        torch_chunk_gated_delta_rule as rule,
    )
    return lambda q, k, v, g, beta, s0: rule(q * q.shape[-1] ** 0.5, k, v, g, beta, initial_state=s0,
                                             output_final_state=True, use_qk_l2norm_in_kernel=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    report = {"heads": args.heads, "dim": args.dim, "length": args.length, "threads": args.threads,
              "load_avg": os.getloadavg()}
    for name, per_channel, bounded in (("per_head", False, False), ("per_channel", True, False),
                                       ("per_channel_bounded", True, True)):
        x = inputs(args.heads, args.dim, args.length, per_channel, bounded)
        proto = torch.onnx.export(Rule(BOUND if bounded else None).eval(), x, input_names=["q", "k", "v", "g", "beta", "s0"],
                                  output_names=["y", "s"], custom_translation_table=translation_table(),
                                  dynamo=True, verbose=False).model_proto
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = {n: t.numpy() for n, t in zip(["q", "k", "v", "g", "beta", "s0"], x, strict=True)}
        rule = theirs(per_channel)
        ours_out, their_out = session.run(None, feeds), None
        times = {"ort": [], "transformers": []}
        for _ in range(args.rounds):
            start = time.perf_counter()
            session.run(None, feeds)
            times["ort"].append(time.perf_counter() - start)
            start = time.perf_counter()
            with torch.no_grad():
                their_out = rule(*x)
            times["transformers"].append(time.perf_counter() - start)
        report[name] = {
            "median_ms": {k: round(1000 * statistics.median(v), 1) for k, v in times.items()},
            "ort_over_transformers": round(statistics.median(a / b for a, b in zip(*times.values())), 3),
            "max_abs_diff": {n: float(np.abs(o - t.numpy()).max()) for n, o, t in zip(("y", "state"), ours_out,
                                                                                     their_out)},
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
