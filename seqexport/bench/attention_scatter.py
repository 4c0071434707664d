"""A probe, not an export: would the fused decoder win if the cache were written in the graph?

`--attention fused` attends over the cache and the new positions concatenated, a copy of the
cache per step. The standard way out is ONNX's `TensorScatter` (opset 24): the new K/V written
into the cache buffer the graph is given, `Attention` then reading the whole buffer under a mask
(slot < past_lengths + j + 1). ONNX Runtime writes it in place when the output is bound to the
input's memory (IO binding). This rewrites a fused export's decoder that way (each
self-attention's Concat -> TensorScatter, its mask over the buffer), runs it with its outputs
bound to the cache buffers, checks its logits against the MatMul export's, and times both bare
sessions in alternating single calls.

    python -m seqexport.bench.attention_scatter --matmul exported/base --fused exported/base-fused \\
        --contexts 16 4096
"""

import argparse
import os
import statistics
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from seqexport.bench.timing import median_ratio, paired_samples
from seqexport.families.transformer import bench as transformer_bench
from seqexport.runtime.models import load

PAST, WHOLE = "past_key_values", "present_whole"  # the cache inputs; the rewritten graph's whole-buffer outputs


def _buffer_mask(nodes: list, cache_input: str) -> str:
    """Nodes computing (b, 1, t, c): slot < past_lengths[b] + j + 1; returns its name."""
    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def const(name, values, shape):
        return node("Constant", [], name, value=helper.make_tensor(name, TensorProto.INT64, shape, values))

    zero, one = const("sc_zero", [0], []), const("sc_one", [1], [])
    axes1, axes13 = const("sc_ax1", [1], [1]), const("sc_ax13", [1, 3], [2])
    c = node("Squeeze", [node("Shape", [cache_input], "sc_c", start=2, end=3)], "sc_cs")
    t = node("Squeeze", [node("Shape", ["input_ids"], "sc_t", start=1, end=2)], "sc_ts")
    slots = node("Range", [zero, c, one], "sc_slots")  # (c,)
    j = node("Range", [one, node("Add", [t, one], "sc_t1"), one], "sc_j")  # (t,) 1 .. t
    limit = node("Add", [node("Unsqueeze", ["past_lengths", axes1], "sc_len"), j], "sc_lim")  # (b, t)
    return node("Less", [slots, node("Unsqueeze", [limit, axes13], "sc_lim4")], "sc_mask")  # (b, 1, t, c)


def scatter_decoder(fused_decoder: Path, out: Path) -> Path:
    """The fused decoder with each self-attention's cache written by TensorScatter (opset 24)."""
    model = onnx.load(str(fused_decoder), load_external_data=False)
    g = model.graph
    made_by = {o: n for n in g.node for o in n.output}
    inputs = {i.name for i in g.input}
    first = next(i.name for i in g.input if i.name.startswith(PAST) and ".decoder." in i.name)
    added: list = []
    mask = _buffer_mask(added, first)
    for n in g.node:
        concat = made_by.get(n.input[1]) if n.op_type == "Attention" else None
        if concat is None or concat.op_type != "Concat" or concat.input[0] not in inputs:
            continue  # a cross-attention: it reads the source's K/V as they are
        for slot in (1, 2):  # K, V
            past, new = made_by[n.input[slot]].input[:2]
            whole = past.replace(PAST, WHOLE)
            added.append(helper.make_node("TensorScatter", [past, new, "past_lengths"], [whole], axis=2))
            g.output.append(helper.make_tensor_value_info(whole, TensorProto.FLOAT, None))
            n.input[slot] = whole
        n.input[3] = mask
    nodes = [x for x in added if x.op_type == "Constant"] + [x for x in added if x.op_type != "Constant"] + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    for o in model.opset_import:
        if o.domain == "":
            o.version = max(o.version, 24)
    onnx.save(model, str(out))  # beside the fused export: its weights file is found there
    return out


def probe(matmul: Path, fused: Path, contexts, threads: int = 2, repeats: int = 31) -> list[dict]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    scatter = ort.InferenceSession(str(scatter_decoder(fused / "decoder.onnx", fused / "decoder_scatter.onnx")),
                                   options, providers=["CPUExecutionProvider"])
    rt = load(matmul, "cpu", threads=threads)
    session = rt.graphs["decoder"].session
    rng = np.random.default_rng(0)
    rows = []
    for past in contexts:
        feeds = transformer_bench._step_feeds(rt, 1, past, rng, transformer_bench.PROMPT_LEN[False])
        key = next(k for k in feeds if k.startswith(PAST) and ".decoder.key" in k)  # layer 0's self-attention K
        want, new_key = session.run(["logits", key.replace(PAST, "present")], feeds)  # (b, v), (b, h, 1, k)
        binding = scatter.io_binding()
        for name, v in feeds.items():
            binding.bind_cpu_input(name, v)
        for o in scatter.get_outputs():
            if o.name.startswith(WHOLE):  # written in place: bound to the cache buffer it updates
                buf = feeds[o.name.replace(WHOLE, PAST)]
                binding.bind_output(o.name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
            else:
                binding.bind_output(o.name, "cpu")
        scatter.run_with_iobinding(binding)
        err = float(np.abs(binding.get_outputs()[0].numpy() - want).max())
        # the buffer itself now holds the new position's K at slot `past`: written in place
        in_place = float(np.abs(feeds[key][:, :, past] - new_key[:, :, 0]).max())
        got = paired_samples({"matmul": lambda feeds=feeds: session.run(["logits"], feeds),
                              "scatter": lambda b=binding: scatter.run_with_iobinding(b)}, repeats)
        rows.append({"context": past, "max_abs_logits_diff": err, "max_abs_written_key_diff": in_place,
                     **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in got.items()},
                     "scatter_over_matmul": median_ratio(got["scatter"], got["matmul"])})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matmul", type=Path, required=True, help="an export with --attention matmul")
    p.add_argument("--fused", type=Path, required=True, help="the same checkpoint exported with --attention fused")
    p.add_argument("--contexts", type=int, nargs="+", default=[16, 4096], help="tokens of context")
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    args = p.parse_args(argv)
    load_start = os.getloadavg()[0]
    rows = probe(args.matmul, args.fused, args.contexts, args.threads)
    print(f"load average {load_start:.2f} -> {os.getloadavg()[0]:.2f}; {args.threads} threads; bare sessions, "
          "alternating single calls (medians)")
    for r in rows:
        print(f"context {r['context']:>5}: matmul {r['matmul_ms']:.2f} ms, scatter+Attention {r['scatter_ms']:.2f} ms, "
              f"ratio {r['scatter_over_matmul']:.2f}; logits differ by {r['max_abs_logits_diff']:.1e}")


if __name__ == "__main__":
    main()
