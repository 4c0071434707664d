"""A quantised artifact (`seqexport quantize`, int8 or int4) beside its float32 source, measured
in one run.

`seqexport bench QUANTISED_DIR` adds this table (the source is the manifest's
quantization.source.folder, or `--baseline DIR`): both loaded in one process, then, for
each figure, medians of single calls taken in turn (`timing.time_paired`: a busy machine
slows both alike) and quantised ÷ float32 (the keys and columns say int8 or int4):

- step: the runtime's one-token step (batch 1) from a state as after each context;
- prefill: the runtime's `begin` over a prompt of each context's length (transformer: the
  encoder and the first decoder call; Mamba/RWKV: the prefill graph);
- generation: greedy tokens/s, eos disabled;
- size on disk (graphs + weights file), RSS each model added at load and after its runs;
- int4: the step's linears alone, taken out of the float32 and the int4 step graphs
  (`bench.int4`): the floor ORT's MatMulNBits sets under the step ratio.
"""

import json
from pathlib import Path

import numpy as np

from seqexport import families
from seqexport.bench.cases import advancing_step
from seqexport.bench.int4 import linears_sessions, step_floor
from seqexport.bench.timing import Log, rss_now, time_paired
from seqexport.errors import UsageError
from seqexport.manifest import MANIFEST, read_manifest
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load


def baseline_of(folder: str | Path, baseline: str | Path | None = None) -> Path | None:
    """The float32 folder to time a quantised one against: `baseline`, else its recorded source;
    None for a folder that is not a quantised copy (and no baseline asked for)."""
    q = read_manifest(folder, verify=False).get("quantization")
    if baseline is None:
        return Path(q["source"]["folder"]) if q else None
    if not q:
        raise UsageError(f"--baseline: {folder} is not a quantised (int8 or int4) copy (no quantization in its "
                         f"{MANIFEST})")
    return Path(baseline)


def disk_bytes(folder: Path) -> int:
    m = json.loads((folder / MANIFEST).read_text())
    return sum(g["bytes"] + g.get("data_bytes", 0) for g in m["graphs"].values()) + \
        (m.get("weights") or {}).get("bytes", 0)


# Each figure's calls come in blocks of this many seconds. The functions taken in turn each read
# hundreds of MB of weights of their own, and the first calls after a switch read slowly (Mamba
# 130m, 2026-12-03: blocks of 0.1 s gave the float32 step 26 ms and its linears alone 23-26 ms,
# blocks of 0.5 s 16-19 and 12-15 ms, the int4 step 9-12 against 7-8 ms): a decode repeats one
# step back to back, which the longer blocks measure.
SAMPLE_S = 0.5


def run_int8_bench(folder, baseline, *, contexts=(16, 64), new_tokens: int = 16, threads: int = 2,
                   repeats: int = 5, sample_s: float = SAMPLE_S, log: Log | None = None) -> dict:
    say = log or (lambda msg: None)
    q = read_manifest(folder, verify=False).get("quantization") or {}
    label = q.get("weights", "int8")
    names = ("float32", label)
    folders = dict(zip(names, (Path(baseline), Path(folder))))
    models, rss = {}, {}
    for name, f in folders.items():
        before = rss_now()
        models[name] = load(f, "cpu", threads=threads)
        rss[name] = None if before is None else rss_now() - before
    if models[label].family != models["float32"].family:
        raise UsageError(f"--baseline {baseline} is a {models['float32'].family} export, {folder} a "
                         f"{models[label].family} one")
    bench = families.get(models[label].family).bench
    fp32 = models["float32"]
    contexts = bench.check_contexts(fp32.config, contexts, contexts)
    rng = np.random.default_rng(0)
    rows = []
    # int4: the step's linears alone, timed in the same calls as the first context's steps
    alone, linears = linears_sessions(Path(folder), Path(baseline), threads) if label == "int4" else (None, {})
    for context in contexts:
        say(f"  {label} vs float32: step and prefill at context {context}")
        state = bench.decode_state(fp32, 1, context, rng, bench.PROMPT_LEN[False])
        tokens = rng.integers(1, fp32.vocab_size, 1, dtype=np.int64)
        # each model steps its own copy as in a decode (stepping a shared state would copy its cache every call)
        fns = {n: advancing_step(m, tokens, state) for n, m in models.items()}
        beside = {f"linears_{n}": fn for n, fn in linears.items()} if context == contexts[0] else {}
        step = time_paired(fns | beside, repeats, sample_s, log=log)
        if beside:
            alone |= {"context": context, "float32_ms": step["linears_float32"] * 1e3,
                      "int4_ms": step["linears_int4"] * 1e3, "ratio": step["linears_int4"] / step["linears_float32"]}
            alone |= step_floor(step["float32"] * 1e3, step[label] * 1e3, alone)
        prompt = [list(map(int, bench.generation_prompts(fp32, 1, context, rng)[0]))]
        prefill = time_paired({n: (lambda m=m, p=prompt: m.begin(p)) for n, m in models.items()}, repeats, sample_s,
                              log=log)
        rows.append({"context": context, **{f"step_{n}_ms": step[n] * 1e3 for n in names},
                     "step_ratio": step[label] / step["float32"],
                     **{f"prefill_{n}_ms": prefill[n] * 1e3 for n in names},
                     "prefill_ratio": prefill[label] / prefill["float32"]})
    say(f"  {label} vs float32: generation of {new_tokens} tokens")
    prompts = bench.generation_prompts(fp32, 1, bench.PROMPT_LEN[True], rng)
    options = SearchOptions(max_new_tokens=new_tokens, eos_id=-1)
    gen = time_paired({n: (lambda m=m: generate(m, prompts, options)) for n, m in models.items()}, repeats, sample_s,
                      log=log)
    out = {
        "weights": label,
        "quantization": {k: q[k] for k in ("bits", "mode", "block_size", "accuracy_level", "include_head") if k in q},
        "folders": {n: str(f) for n, f in folders.items()},
        "family": fp32.family,
        "threads": threads,
        "rows": rows,
        "generation": {"new_tokens": new_tokens, **{f"{n}_tps": new_tokens / gen[n] for n in names},
                       "ratio": gen["float32"] / gen[label]},
        "disk_bytes": {n: disk_bytes(f) for n, f in folders.items()},
        "rss_load_bytes": rss,
        "rss_after_bytes": rss_now(),
    }
    if alone is not None:
        out["linears_alone"] = alone
    return out


def format_int8_table(r: dict) -> str:
    """The table of `run_int8_bench` (int8 or int4: `r["weights"]`)."""
    mb = lambda b: "n/a" if b is None else f"{b / 1e6:.1f} MB"  # noqa: E731
    q = r.get("weights", "int8")
    lines = [f"{q} {r['folders'][q]} vs its float32 source {r['folders']['float32']} "
             f"({r['family']}, {r['threads']} threads, medians, measured side by side)",
             f"  context   step fp32 ms   step {q} ms   {q}/fp32   prefill fp32 ms   prefill {q} ms   {q}/fp32"]
    for row in r["rows"]:
        lines.append(f"  {row['context']:>7}   {row['step_float32_ms']:>12.3f}   {row[f'step_{q}_ms']:>12.3f}   "
                     f"{row['step_ratio']:>9.2f}   {row['prefill_float32_ms']:>15.3f}   {row[f'prefill_{q}_ms']:>15.3f}"
                     f"   {row['prefill_ratio']:>9.2f}")
    g = r["generation"]
    lines.append(f"  generation ({g['new_tokens']} tokens, batch 1): fp32 {g['float32_tps']:.1f} tok/s, "
                 f"{q} {g[f'{q}_tps']:.1f} tok/s ({q} {g['ratio']:.2f}x as fast)")
    if "linears_alone" in r:
        a = r["linears_alone"]
        lines.append(f"  the step's linears alone (its {a['linears']} weight linears taken out of both step graphs as "
                     f"they are, stored weights and all, as independent GEMVs at batch 1, no other operator): "
                     f"fp32 {a['float32_ms']:.3f} ms, {q} {a['int4_ms']:.3f} ms ({q}/fp32 "
                     f"{a['ratio']:.2f}), timed beside the steps at context {a['context']}")
        lines.append(f"  the step outside its linears: fp32 {a['rest_float32_ms']:.3f} ms, {q} {a['rest_int4_ms']:.3f} ms; "
                     f"floor under the step ratio, ({q} linears + fp32 rest) / fp32 step: {a['floor_ratio']:.2f}")
    lines.append(f"  size on disk: fp32 {mb(r['disk_bytes']['float32'])}, {q} {mb(r['disk_bytes'][q])}; "
                 f"RSS added at load: fp32 {mb(r['rss_load_bytes']['float32'])}, {q} {mb(r['rss_load_bytes'][q])}"
                 f"; process RSS after the runs {mb(r['rss_after_bytes'])}")
    return "\n".join(lines)
