"""Measured comparisons: eager PyTorch vs ONNX Runtime on one exported folder, in one run.

    from seqexport.bench.run import run_bench, format_table
    result = run_bench("exported/transformer-tiny", contexts=(16, 64, 256))
    print(format_table(result))       # result is plain JSON-serialisable data

What is timed (torch and ORT with the same intra-op thread count; warm-up, then
medians of single calls over `repeats` rounds taken in turn, eager then ORT, so
that a busy machine slows both alike; eager is also timed at 1 torch thread and
ratios use the faster eager — see `time_eager_and_ort`):

- transformer: the cached decoder step (tgt_len 1) at each past length. Eager is
  the export wrapper `DecoderGraph` called under `torch.inference_mode()` — the
  very cached step that was exported, fed the same arrays;
- mamba: the one-token step (eager `model.step` vs the step graph) and the prefill
  at each length (eager with the sequential reference scan and with the export's
  scan lowering run eagerly, vs the prefill graph; an `unrolled` export only at its
  fixed length);
- end-to-end greedy generation, tokens/s: eager with cache, eager without cache
  (the full forward over the whole prefix for every token), and the runtime's
  `generate` (eos disabled so every row makes all its tokens);
- session load time, peak RSS, cache/state bytes at each context;
- memory read bandwidth (a large float32 array summed) and the weight-streaming
  bound: the weight bytes one decode step must read ÷ that bandwidth, the least
  time a memory-bound batch-1 step can take.

ORT is timed twice: through the runtime (`model.step`: input checks, state
book-keeping — what an application gets) and as the bare `InferenceSession.run`.
"""

import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from seqexport import specs as S
from seqexport.errors import UsageError
from seqexport.manifest import read_manifest
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import State, load
from seqexport.runtime.session import NP_DTYPES

DEFAULT_CONTEXTS = (16, 64, 256, 1024)
BYTES = {"float32": 4, "float16": 2}
# Per mode: repeats, contexts, new tokens, source / prompt length, seconds per timed sample,
# size of the bandwidth array.
SETTINGS = {
    False: dict(repeats=7, contexts=DEFAULT_CONTEXTS, new_tokens=32, src_len=32, prompt_len=16,
                sample_s=0.05, bandwidth_mb=512),
    True: dict(repeats=2, contexts=(4, 16), new_tokens=4, src_len=8, prompt_len=4,
               sample_s=0.002, bandwidth_mb=64),
}

Log = Callable[[str], None]


# --- timing ------------------------------------------------------------------------------------


def time_paired(fns: dict[str, Callable[[], object]], repeats: int, sample_s: float,
                torch_threads: dict[str, int] | None = None, budget_s: float = 30.0) -> dict[str, float]:
    """Median seconds per call of each function.

    Each function is warmed up (twice; once if slower than 1 s); then, for `repeats` rounds,
    each in turn is called enough times to fill `sample_s` (at least once). Every call is timed on its own and
    the median is over all calls: on a shared machine a call that lost its core to
    another process is an outlier, not the norm. A function whose samples have taken
    `budget_s` stops after 3 rounds. `torch_threads` sets torch's intra-op thread count
    before a function's calls (untimed).
    """
    torch_threads = torch_threads or {}
    default = torch.get_num_threads()

    def threads_for(name):
        n = torch_threads.get(name, default)
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

    calls = {}
    for name, fn in fns.items():
        threads_for(name)
        t = time.perf_counter()
        fn()
        once = time.perf_counter() - t
        if once < 1.0:  # a slow function is warm after one call
            t = time.perf_counter()
            fn()
            once = time.perf_counter() - t
        calls[name] = max(1, int(sample_s / max(once, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter
    try:
        for r in range(repeats):
            for name, fn in fns.items():
                got = samples[name]
                if r >= 3 and sum(got) > budget_s:
                    continue
                threads_for(name)
                for _ in range(calls[name]):
                    t = clock()
                    fn()
                    got.append(clock() - t)
    finally:
        torch.set_num_threads(default)
    return {name: statistics.median(v) for name, v in samples.items()}


def time_eager_and_ort(fns: dict[str, Callable[[], object]], threads: int, repeats: int,
                       sample_s: float) -> dict[str, float]:
    """`time_paired`, every `eager*` function timed at `threads` torch threads and at 1.

    On a busy 2-core machine torch's OpenMP threads can stall at each barrier while a
    core runs someone else (seen here: a 0.5 ms step taking 60 ms at 2 threads and
    0.45 ms at 1). `<name>_best` is the faster of the two: ORT is compared with the
    best eager time, never with a stalled one. Returns seconds, None where not timed.
    """
    timed, per_fn = dict(fns), {}
    if threads > 1:
        for name, fn in fns.items():
            if name.startswith("eager"):
                timed[name + "_1t"], per_fn[name + "_1t"] = fn, 1
    med = time_paired(timed, repeats, sample_s, per_fn)
    out: dict[str, float] = {}
    for name in fns:
        out[name] = med[name]
        if name.startswith("eager"):
            out[name + "_1t"] = med.get(name + "_1t")
            out[name + "_best"] = min(med[name], med.get(name + "_1t", med[name]))
    return out


def measure_bandwidth(mb: int = 512, repeats: int = 9, threads: int = 2) -> dict:
    """Memory read bandwidth, GB/s: a float32 array of `mb` MB summed by numpy (1 thread) and
    by torch at 1 and at `threads` threads; medians of single sums.

    `gbs`, the one the bound uses, is the highest of the three: the bound must be a time
    that reading the weights cannot beat. (numpy's pairwise sum reads ≈ 25 GB/s here,
    torch's ≈ 35 GB/s.)
    """
    a = np.full(mb * (1 << 20) // 4, 1.0, np.float32)  # written, so every page is real
    t = torch.from_numpy(a)
    med = time_paired({"numpy": lambda: np.add.reduce(a), "torch_1t": lambda: t.sum(),
                       "torch": lambda: t.sum()}, repeats, 0.0, {"torch_1t": 1, "torch": threads})
    out = {"bytes": a.nbytes, "torch_threads": threads,
           **{f"{k}_gbs": a.nbytes / v / 1e9 for k, v in med.items()}}
    out["gbs"] = max(out["numpy_gbs"], out["torch_1t_gbs"], out["torch_gbs"])
    return out


def _rss_now() -> int | None:
    """Resident set size now, bytes (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss() -> int:
    """High-water mark of the resident set, bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024


# --- what one decode step reads ------------------------------------------------------------------


def step_weight_bytes(family: str, model: torch.nn.Module, dtype: str) -> int:
    """Bytes of weights one decode step reads (each shared tensor once).

    Transformer: every decoder layer's self-attention, cross-attention W_q and fc (the
    cross K/V are cached, so W_k and W_v are not read), feed-forward and norms, plus
    fc_out; the embedding row and the positional row are negligible. Mamba: every layer,
    the final norm and lm_head (tied or not); the embedding row is negligible.
    """
    if family == "transformer":
        dec = model.decoder
        params = {id(p): p for n, p in dec.named_parameters()
                  if not n.startswith("embedding.") and ".cross_attn.W_k." not in n and ".cross_attn.W_v." not in n}
    else:
        params = {id(p): p for n, p in model.named_parameters() if not n.startswith("backbone.embedding.")}
        params[id(model.lm_head.weight)] = model.lm_head.weight
    return sum(p.numel() for p in params.values()) * BYTES[dtype]


# --- inputs --------------------------------------------------------------------------------------


def random_source(config: dict, batch: int, src_len: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(1, config["src_vocab_size"], (batch, src_len), dtype=np.int64)


def transformer_state(rt, batch: int, past: int, src_len: int, rng: np.random.Generator) -> State:
    """A decoder state as after `past` steps: real cross K/V of a random source, random self K/V."""
    state = rt.start(random_source(rt.config, batch, src_len, rng)).numpy()  # host copies (IO binding)
    arrays = dict(state.arrays)
    for t in rt.specs["decoder"].inputs:
        if t.name.startswith("past_key_values.") and ".decoder." in t.name:
            arrays[t.name] = rng.standard_normal((batch, t.dims[1], past, t.dims[3])).astype(NP_DTYPES[t.dtype])
    return State(arrays, past)


def mamba_state(rt, batch: int, rng: np.random.Generator) -> State:
    """A conv/SSM state of the right shapes with random contents (a step costs the same at any context)."""
    state = rt.start(batch).numpy()
    return State({k: (rng.standard_normal(v.shape) * 0.1).astype(v.dtype) for k, v in state.arrays.items()}, 1)


def self_kv_bytes(state: State) -> int:
    return State({k: v for k, v in state.arrays.items() if ".decoder." in k}).nbytes


def _torch_inputs(spec, arrays: dict) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in spec.input_names]


def _bare(rt, graph: str, feeds: dict) -> Callable[[], object]:
    session = rt.graphs[graph].session
    return lambda: session.run(None, feeds)


# --- per family ----------------------------------------------------------------------------------


def transformer_step(rt, wrapper, batch: int, past: int, src_len: int, rng) -> tuple[dict[str, Callable], State]:
    """The decoder step at past length `past`: eager (the DecoderGraph wrapper), runtime step, bare session."""
    state = transformer_state(rt, batch, past, src_len, rng)
    tokens = rng.integers(1, rt.vocab_size, batch, dtype=np.int64)
    feeds = {S.INPUT_IDS: tokens[:, None], **state.arrays}
    args = _torch_inputs(rt.specs["decoder"], feeds)
    return {"eager": lambda: wrapper(*args), "ort": lambda: rt.step(tokens, state),
            "ort_session": _bare(rt, "decoder", feeds)}, state


def mamba_step(rt, model, batch: int, rng) -> tuple[dict[str, Callable], State]:
    """The one-token step: eager `model.step`, runtime step, bare session."""
    state = mamba_state(rt, batch, rng)
    tokens = rng.integers(0, rt.vocab_size, batch, dtype=np.int64)
    feeds = {S.INPUT_IDS: tokens[:, None], **state.arrays}
    names = rt.specs["step"].input_names[1:]
    tstate = [(torch.from_numpy(state.arrays[names[2 * i]]), torch.from_numpy(state.arrays[names[2 * i + 1]]))
              for i in range(len(names) // 2)]
    ttokens = torch.from_numpy(tokens)
    return {"eager": lambda: model.step(ttokens, tstate), "ort": lambda: rt.step(tokens, state),
            "ort_session": _bare(rt, "step", feeds)}, state


def mamba_prefill(rt, model, scan, batch: int, length: int, rng) -> dict[str, Callable[[], object]]:
    """The prefill of `length` tokens from a fresh state: eager with the reference scan and with
    the export's lowering, runtime step (the prefill graph), bare session."""
    ids = rng.integers(0, rt.vocab_size, (batch, length), dtype=np.int64)
    fresh = rt.start(batch)
    feeds = {S.INPUT_IDS: ids, **fresh.arrays}
    tids = torch.from_numpy(ids)
    return {"eager": lambda: model(tids), "eager_lowering": lambda: model(tids, scan=scan),
            "ort": lambda: rt.step(ids, fresh), "ort_session": _bare(rt, "prefill", feeds)}


def _transformer_steps(rt, model, batch, contexts, cfg, threads, repeats, rng, log) -> list[dict]:
    from seqexport.families.transformer.export import DecoderGraph

    wrapper = DecoderGraph(model).eval()
    rows = []
    for past in contexts:
        log(f"  decoder step: batch {batch}, past {past}")
        fns, state = transformer_step(rt, wrapper, batch, past, cfg["src_len"], rng)
        with torch.inference_mode():
            med = time_eager_and_ort(fns, threads, repeats, cfg["sample_s"])
        rows.append({"batch": batch, "context": past, "state_bytes": state.nbytes,
                     "self_kv_bytes": self_kv_bytes(state), **_ms(med)})
    return rows


def _mamba_steps(rt, model, batch, cfg, threads, repeats, rng, log) -> list[dict]:
    log(f"  step: batch {batch}")
    fns, state = mamba_step(rt, model, batch, rng)
    with torch.inference_mode():
        med = time_eager_and_ort(fns, threads, repeats, cfg["sample_s"])
    return [{"batch": batch, "context": None, "state_bytes": state.nbytes, **_ms(med)}]


def _mamba_prefills(rt, model, lowering, batch, lengths, cfg, threads, repeats, rng, log) -> list[dict]:
    from seqexport.export.scan import scan_for

    rows = []
    for length in lengths:
        log(f"  prefill: batch {batch}, length {length}")
        fns = mamba_prefill(rt, model, scan_for(lowering), batch, length, rng)
        with torch.inference_mode():
            med = time_eager_and_ort(fns, threads, repeats, cfg["sample_s"])
        row = {"batch": batch, "length": length, "lowering": lowering, **_ms(med)}
        row["ort_over_eager_lowering"] = med["ort"] / med["eager_lowering_best"]
        rows.append(row)
    return rows


def _ms(med: dict[str, float | None]) -> dict:
    """Seconds -> `<name>_ms`, and ORT ÷ the best eager time."""
    out = {f"{k}_ms": None if v is None else v * 1e3 for k, v in med.items()}
    out["ort_over_eager"] = med["ort"] / med["eager_best"]
    out["ort_session_over_eager"] = med["ort_session"] / med["eager_best"]
    return out


# --- end-to-end generation -----------------------------------------------------------------------


def _transformer_eager_gen(model, src: torch.Tensor, start: int, n: int, cache: bool) -> torch.Tensor:
    """Greedy ids (b, n): encoder once, then the cached DecoderGraph step, or the full decoder."""
    from seqexport.families.transformer.export import DecoderGraph, EncoderGraph
    from seqexport.models.transformer import generate_mask

    mask = (src != model.config.pad_id).long()
    enc = EncoderGraph(model)(src, mask)
    tok = torch.full((src.shape[0], 1), start, dtype=torch.long)
    out = []
    if cache:
        step = DecoderGraph(model)
        b, h, k = src.shape[0], model.config.n_heads, model.config.head_dim
        past = [torch.zeros(b, h, 0, k)] * (2 * model.config.num_layers)
        for _ in range(n):
            logits, *past = step(tok, mask, *enc[1:], *past)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            out.append(tok)
    else:
        memory, memory_mask = enc[0], mask[:, None, None, :].bool()
        tgt = tok
        for _ in range(n):
            logits = model.decoder(tgt, memory, generate_mask(tgt.shape[1]), memory_mask)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            out.append(tok)
            tgt = torch.cat([tgt, tok], dim=1)
    return torch.cat(out, dim=1)


def _mamba_eager_gen(model, prompt: torch.Tensor, n: int, cache: bool) -> torch.Tensor:
    """Greedy ids (b, n): prefill then model.step, or the full forward over the prefix each token."""
    out = []
    if cache:
        logits, state = model(prompt)
        tok = logits[:, -1].argmax(-1)
        out.append(tok)
        for _ in range(n - 1):
            logits, state = model.step(tok, state)
            tok = logits.argmax(-1)
            out.append(tok)
    else:
        seq = prompt
        for _ in range(n):
            logits, _ = model(seq)
            tok = logits[:, -1].argmax(-1)
            out.append(tok)
            seq = torch.cat([seq, tok[:, None]], dim=1)
    return torch.stack(out, dim=1)


def _generation(family, rt, model, batch, cfg, new_tokens, threads, repeats, rng, log) -> dict:
    log(f"  generation: batch {batch}, {new_tokens} new tokens")
    if family == "transformer":
        prompts = random_source(rt.config, batch, cfg["src_len"], rng)
        start = rt.tokenizer.bos_id if rt.tokenizer else 1
        options = SearchOptions(max_new_tokens=new_tokens, eos_id=-1, start_id=start)
        src = torch.from_numpy(prompts)
        eager = {"eager_cache": lambda: _transformer_eager_gen(model, src, start, new_tokens, True),
                 "eager_nocache": lambda: _transformer_eager_gen(model, src, start, new_tokens, False)}
    else:
        prompts = rng.integers(0, rt.vocab_size, (batch, cfg["prompt_len"]), dtype=np.int64)
        options = SearchOptions(max_new_tokens=new_tokens, eos_id=-1)
        prompt = torch.from_numpy(prompts)
        eager = {"eager_cache": lambda: _mamba_eager_gen(model, prompt, new_tokens, True),
                 "eager_nocache": lambda: _mamba_eager_gen(model, prompt, new_tokens, False)}
    with torch.inference_mode():
        med = time_eager_and_ort({**eager, "ort": lambda: generate(rt, prompts, options)}, threads, repeats,
                                 cfg["sample_s"])
    made = batch * new_tokens
    row = {"batch": batch, "new_tokens": new_tokens, "prompt_len": prompts.shape[1],
           **{f"{k}_tps": None if v is None else made / v for k, v in med.items()}}
    row["ort_over_eager_cache"] = row["ort_tps"] / row["eager_cache_best_tps"]
    row["ort_over_eager_nocache"] = row["ort_tps"] / row["eager_nocache_best_tps"]
    return row


# --- the run -------------------------------------------------------------------------------------


def _check_sizes(name: str, values) -> tuple[int, ...]:
    values = tuple(values)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{name}: expected positive integers, got {v!r}")
    if not values:
        raise UsageError(f"{name}: expected at least one value")
    return values


def _contexts_for(family: str, config: dict, contexts, fast: bool, notes: list[str]) -> tuple[int, ...]:
    if family != "transformer":
        return contexts or SETTINGS[fast]["contexts"]
    limit = config["max_len"] - 1  # the step at past T holds position T
    if contexts is None:
        keep = tuple(c for c in SETTINGS[fast]["contexts"] if c <= limit)
        if len(keep) < len(SETTINGS[fast]["contexts"]):
            notes.append(f"contexts above {limit} skipped: the positional table has {config['max_len']} rows")
        return keep
    too_long = [c for c in contexts if c > limit]
    if too_long:
        raise UsageError(f"--context {too_long[0]}: the decoder's positional table allows a past of at most {limit}")
    return contexts


def run_bench(folder, provider: str = "auto", batches=(1,), contexts=None, new_tokens: int | None = None,
              threads: int = 2, repeats: int | None = None, fast: bool = False,
              log: Log | None = None) -> dict:
    """Benchmark an exported folder against its eager model; returns JSON-serialisable results.

    contexts: transformer past lengths of the decoder step, Mamba prefill lengths
    [16 64 256 1024; fast: 4 16]. new_tokens: tokens generated end to end [32; fast: 4].
    repeats: timed samples per figure, medians reported [7; fast: 2].
    """
    from seqexport.parity.validate import eager_checkpoint

    log = log or (lambda msg: None)
    folder = Path(folder)
    cfg = dict(SETTINGS[bool(fast)])
    batches = _check_sizes("batches", batches)
    contexts = None if contexts is None else _check_sizes("contexts", contexts)
    repeats = _check_sizes("repeats", [repeats or cfg["repeats"]])[0]
    new_tokens = _check_sizes("new_tokens", [new_tokens or cfg["new_tokens"]])[0]
    threads = _check_sizes("threads", [threads])[0]
    manifest = read_manifest(folder, verify=False)
    family, dtype = manifest["family"], manifest["dtype"]
    notes: list[str] = []
    contexts = _contexts_for(family, manifest["config"], contexts, fast, notes)
    if dtype != "float32":
        notes.append(f"the graphs are {dtype}; the eager model runs in float32")
    rng = np.random.default_rng(0)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        log(f"bench {folder}: {family}, {threads} threads")
        rss0 = _rss_now()
        t = time.perf_counter()
        rt = load(folder, provider, threads=threads)
        loads = [time.perf_counter() - t]
        rss_loaded = _rss_now()
        while not fast and len(loads) < 3 and loads[0] < 2.0:  # small models: a median of three loads
            del rt
            t = time.perf_counter()
            rt = load(folder, provider, threads=threads)
            loads.append(time.perf_counter() - t)
        model = eager_checkpoint(folder, manifest, None).model.float().eval()
        if rt.provider != "CPUExecutionProvider":
            notes.append(f"ORT runs on {rt.provider}; the eager model on the CPU")
        result = {
            "folder": str(folder), "family": family, "dtype": dtype,
            "preset": (manifest.get("source") or {}).get("preset"),
            "export_options": manifest.get("export_options", {}),
            "provider": rt.provider, "threads": {"torch": torch.get_num_threads(), "ort": threads},
            "fast": bool(fast), "repeats": repeats,
            "versions": {"torch": torch.__version__, "onnxruntime": ort.__version__,
                         "numpy": np.__version__, "python": platform.python_version()},
            "machine": {"cpus": os.cpu_count(), "load_average_start": list(os.getloadavg())},
            "load_seconds": statistics.median(loads),
            "session_rss_bytes": (rss_loaded - rss0) if rss0 is not None and rss_loaded is not None else None,
            "notes": notes,
        }
        if family == "transformer":
            result["steps"] = [r for b in batches
                               for r in _transformer_steps(rt, model, b, contexts, cfg, threads, repeats, rng, log)]
            result["prefills"] = []
        else:
            lowering = manifest.get("export_options", {}).get("scan", "loop")
            lengths = contexts
            if rt.prefill_len is not None:
                lengths = (rt.prefill_len,)
                notes.append(f"unrolled export: prefill timed at its fixed length {rt.prefill_len} only")
            result["steps"] = [r for b in batches for r in _mamba_steps(rt, model, b, cfg, threads, repeats, rng, log)]
            result["state_bytes"] = {str(c): mamba_state(rt, 1, rng).nbytes for c in contexts}
            result["prefills"] = [r for b in batches
                                  for r in _mamba_prefills(rt, model, lowering, b, lengths, cfg, threads, repeats, rng, log)]
        result["generation"] = [_generation(family, rt, model, b, cfg, new_tokens, threads, repeats, rng, log)
                                for b in batches]
        result["peak_rss_bytes"] = _peak_rss()  # before the bandwidth array
        log("  memory bandwidth")
        bw = measure_bandwidth(cfg["bandwidth_mb"], repeats=max(3, repeats) if fast else 9, threads=threads)
    finally:
        torch.set_num_threads(old_threads)
    result["machine"]["load_average_end"] = list(os.getloadavg())
    result["bandwidth"] = bw
    weights = step_weight_bytes(family, model, dtype)
    result["step_weights"] = {"bytes": weights, "bound_ms": weights / (bw["gbs"] * 1e9) * 1e3}
    for row in result["steps"]:
        # Weights are read once for the whole batch. With the state: it is read, and the new
        # state written (a fresh array every step).
        moved = weights + 2 * row["state_bytes"]
        row["bound_ms"] = result["step_weights"]["bound_ms"]
        row["bound_with_state_ms"] = moved / (bw["gbs"] * 1e9) * 1e3
        row["ort_over_bound"] = row["ort_ms"] / row["bound_ms"]
        row["ort_session_over_bound"] = row["ort_session_ms"] / row["bound_ms"]
    return result


# --- the table -----------------------------------------------------------------------------------


def _table(headers: list[str], rows: list[list]) -> list[str]:
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return [line(headers)] + [line(r) for r in cells]


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def format_table(result: dict) -> str:
    """A readable summary of `run_bench`'s result."""
    r, bw, sw = result, result["bandwidth"], result["step_weights"]
    n = r["threads"]["torch"]
    mb = lambda b: None if b is None else b / 1e6  # noqa: E731
    lines = [
        f"{r['folder']}: {r['family']} ({r['preset'] or 'checkpoint'}, {r['dtype']}) on {r['provider']}, "
        f"threads torch {n} / ORT {r['threads']['ort']}, {r['repeats']} repeats (medians of single calls)",
        f"session load {r['load_seconds']:.3f} s, +{_cell(mb(r['session_rss_bytes']))} MB RSS; "
        f"peak RSS {r['peak_rss_bytes'] / 1e6:.0f} MB; load average {r['machine']['load_average_start'][0]:.1f} "
        f"-> {r['machine']['load_average_end'][0]:.1f} on {r['machine']['cpus']} CPUs",
        f"memory read bandwidth {bw['gbs']:.1f} GB/s (sum of {bw['bytes'] / 2**20:.0f} MB: numpy {bw['numpy_gbs']:.1f}, "
        f"torch 1t {bw['torch_1t_gbs']:.1f}, {n}t {bw['torch_gbs']:.1f}); "
        f"weights read per step {sw['bytes'] / 1e6:.2f} MB -> bound {sw['bound_ms']:.3f} ms",
        f"ratios: ORT (runtime step) ÷ the faster eager of torch at {n} thread(s) and at 1",
        "",
    ]
    eager = [f"eager {n}t", "eager 1t"]
    if r["family"] == "transformer":
        lines.append("decoder step (tgt_len 1), ms")
        head = ["batch", "past", "state MB"]
        first = lambda s: [s["batch"], s["context"], mb(s["state_bytes"])]  # noqa: E731
    else:
        lines.append("step (one token), ms")
        head = ["batch", "state MB"]
        first = lambda s: [s["batch"], mb(s["state_bytes"])]  # noqa: E731
    lines += _table(
        head + eager + ["ORT", "ORT bare", "ORT/eager", "bare/eager", "bound", "ORT/bound"],
        [first(s) + [s["eager_ms"], s["eager_1t_ms"], s["ort_ms"], s["ort_session_ms"], s["ort_over_eager"],
                     s["ort_session_over_eager"], s["bound_ms"], s["ort_over_bound"]] for s in r["steps"]])
    if r["prefills"]:
        lines += ["", f"prefill, ms (ref: the sequential reference scan; {r['prefills'][0]['lowering']}: "
                      "the export's lowering run eagerly)"]
        lines += _table(
            ["batch", "length", f"ref {n}t", "ref 1t", f"lowering {n}t", "lowering 1t", "ORT", "ORT bare",
             "ORT/ref", "ORT/lowering"],
            [[p["batch"], p["length"], p["eager_ms"], p["eager_1t_ms"], p["eager_lowering_ms"],
              p["eager_lowering_1t_ms"], p["ort_ms"], p["ort_session_ms"], p["ort_over_eager"],
              p["ort_over_eager_lowering"]] for p in r["prefills"]])
    lines += ["", "end-to-end greedy generation, tokens/s (no cache: the full forward over the prefix per token)"]
    lines += _table(
        ["batch", "prompt", "new", f"cache {n}t", "cache 1t", f"no cache {n}t", "no cache 1t", "ORT",
         "ORT/cache", "ORT/no cache"],
        [[g["batch"], g["prompt_len"], g["new_tokens"], g["eager_cache_tps"], g["eager_cache_1t_tps"],
          g["eager_nocache_tps"], g["eager_nocache_1t_tps"], g["ort_tps"], g["ort_over_eager_cache"],
          g["ort_over_eager_nocache"]] for g in r["generation"]])
    for note in r["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
