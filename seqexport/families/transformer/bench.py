"""What `seqexport bench` times of a transformer export (see `seqexport.bench.cases`): the
cached decoder step (tgt_len 1) at each past length — eager `decode_step_cached` vs the
decoder graph — and greedy generation from random sources. It has no prefill to time: the encoder
runs once per source."""

import numpy as np
import torch

from seqexport.bench.cases import Case, advancing_step, bare_session, branch_step, split_feeds
from seqexport.bench.gemv_floor import linear_chain_ms
from seqexport.bench.tables import StepTable
from seqexport.errors import UsageError
from seqexport.families.transformer.specs import (
    ATTENTION_MASK,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    KV,
    PAST_LENGTHS,
    past_kv,
)
from seqexport.parity.inputs import random_inputs
from seqexport.runtime.base import State
from seqexport.runtime.session import NP_DTYPES
from seqexport.state import appended as kv_buffer

PROMPT_LEN = {False: 32, True: 8}  # source tokens: behind the step's cross K/V, and generation's prompts
TABLE = StepTable("decoder step (tgt_len 1), ms", (("past", "context"),))


def max_context(config: dict) -> int:
    return config["max_len"] - 1  # the step at past T holds position T


def check_contexts(config: dict, contexts, defaults=(), notes: list[str] | None = None) -> tuple[int, ...]:
    """The past lengths to time: the defaults that fit the positional table (noted), or the
    given ones (UsageError for one that does not fit)."""
    limit = max_context(config)
    if contexts is None:
        keep = tuple(c for c in defaults if c <= limit)
        if len(keep) < len(defaults) and notes is not None:
            notes.append(f"contexts above {limit} skipped: the positional table has {config['max_len']} rows")
        return keep
    too_long = [c for c in contexts if c > limit]
    if too_long:
        raise UsageError(f"--context {too_long[0]}: the decoder's positional table allows a past of at most {limit}")
    return tuple(contexts)


def _self_kv(rt) -> set[str]:
    """The decoder's own state: the self-attention K/V, the part of the state that grows
    (appended into a buffer, or fed back whole by a decoder that concatenates)."""
    spec = rt.specs["decoder"]
    return {inp for _, inp in spec.appends + spec.feeds}


def _step_feeds(rt, batch: int, past: int, rng: np.random.Generator, prompt_len: int) -> dict[str, np.ndarray]:
    """Every decoder input as after `past` steps: the real mask and cross K/V of a random source
    of `prompt_len` tokens, random self K/V (the step costs the same whatever they hold) — in a
    buffer of the capacity the runtime would hold, `past` slots valid, for a decoder that
    appends; exactly `past` positions for an older one that concatenates."""
    appends = rt.specs["decoder"].lengths is not None
    capacity = kv_buffer.capacity_for(past + 1, rt.config["max_len"]) if appends else past
    sizes = dict(batch=batch, src_len=prompt_len, past_len=capacity, tgt_len=1)
    src = random_inputs(rt.specs["encoder"], sizes, rng, pad_rows=False)
    start = rt.start(src[INPUT_IDS], src[ATTENTION_MASK]).numpy()  # host copies (IO binding)
    grows = _self_kv(rt)
    feeds = random_inputs(rt.specs["decoder"], sizes, rng, pad_rows=False)
    if appends:
        feeds[PAST_LENGTHS] = np.full(batch, past, np.int64)
    return feeds | {k: v for k, v in start.arrays.items() if k not in grows and k != PAST_LENGTHS}


def decode_state(rt, batch: int, context: int, rng: np.random.Generator, prompt_len: int = 32) -> State:
    """A decoder state as after `context` steps (see `_step_feeds`)."""
    return split_feeds(_step_feeds(rt, batch, context, rng, prompt_len), context)[1]


def _eager_step(model, feeds: dict[str, np.ndarray]):
    """The model's own cached step on the same arrays (as torch tensors, made once)."""
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
    n = model.config.num_layers
    cross = [tuple(t[past_kv(i, "encoder", x)] for x in KV) for i in range(n)]
    cache = [tuple(t[past_kv(i, "decoder", x)] for x in KV) for i in range(n)]
    ids, mask = t[INPUT_IDS], t[ENCODER_ATTENTION_MASK]
    if PAST_LENGTHS in t:
        return lambda: model.decode_step_cached(ids, mask, cross, cache, t[PAST_LENGTHS])
    return lambda: model.decode_step(ids, mask, cross, cache)


def step_cases(rt, model, batches, contexts, prompt_len: int, rng: np.random.Generator):
    """The decoder step at each batch and past length: eager, the runtime's step as in a decode
    (advancing: the cache written in place) and from an earlier state (a branch: the cache
    copied first), the bare session.
    `self_kv_bytes` counts the valid self K/V (what a step must read), not the buffer's spare
    slots; `state_moved_bytes` all a step must read of the state (valid cache + cross K/V)."""
    grows = _self_kv(rt)
    for batch in batches:
        for past in contexts:
            feeds = _step_feeds(rt, batch, past, rng, prompt_len)
            tokens, state = split_feeds(feeds, past)
            kv = State({k: state.arrays[k] for k in grows})
            slots = next(iter(kv.arrays.values())).shape[2]  # (b, h, past_len, k)
            valid = kv.nbytes * past // max(slots, 1)
            # a step reads the valid cache and the cross K/V once; its new slots are negligible
            row = {"batch": batch, "context": past, "state_bytes": state.nbytes, "self_kv_bytes": valid,
                   "state_moved_bytes": state.nbytes - kv.nbytes + valid}
            fns = {"eager": _eager_step(model, feeds), "ort": advancing_step(rt, tokens, state),
                   "ort_branch": branch_step(rt, tokens, state), "ort_session": bare_session(rt, "decoder", feeds)}
            yield Case(f"decoder step: batch {batch}, past {past}", row, fns)


def prefill_cases(rt, model, batches, contexts, rng, notes: list[str]):
    return ()  # the encoder runs once per source: nothing to time per token


def extra_results(rt, model, contexts, rng, threads: int = 2, repeats: int = 7, sample_s: float = 0.3) -> dict:
    """The step's linears alone, timed as independent Gemms at batch 1 (`bench.gemv_floor`):
    the floor ORT's GEMV sets under the step, beside the bandwidth bound."""
    return {"linears_only_ms": linear_chain_ms(step_linear_shapes(model), threads, repeats, sample_s)}


def step_weight_bytes(model, dtype: str) -> int:
    """Bytes of weights one decode step reads (each shared tensor once): every decoder layer's
    self-attention, cross-attention W_q and fc (the cross K/V are cached, so W_k and W_v are
    not read), feed-forward and norms, plus fc_out; the embedding and positional rows are
    negligible."""
    params = {id(p): p for n, p in model.decoder.named_parameters()
              if not n.startswith("embedding.") and ".cross_attn.W_k." not in n and ".cross_attn.W_v." not in n}
    return sum(p.numel() for p in params.values()) * np.dtype(NP_DTYPES[dtype]).itemsize


def generation_prompts(rt, batch: int, prompt_len: int, rng: np.random.Generator) -> np.ndarray:
    """Random sources (b, prompt_len), no padding; decoding starts from the tokenizer's bos (else 1)."""
    return random_inputs(rt.specs["encoder"], dict(batch=batch, src_len=prompt_len), rng)[INPUT_IDS]


def compare_cache_layouts(folders: dict[str, str], contexts, threads: int = 2, repeats: int = 7,
                          sample_s: float = 0.3, seed: int = 0) -> dict:
    """The runtime's decoder step of several exports of one model side by side (e.g. a decoder
    that appends to its cache in place vs one that concatenates), timed in turn at each
    context, with the bound of reading the weights and the valid cache once, and the floor of
    the step's linears alone (timed) plus its state's bytes read once at the measured bandwidth.

    Returns {"bandwidth": ..., "rows": [{context, <label>_ms, <label>_over_bound, ...}]}; the
    first label is the reference of the `ratio_*` columns.
    """
    from seqexport.bench.timing import measure_bandwidth, time_paired
    from seqexport.runtime import load

    models = {label: load(folder, provider="cpu", threads=threads) for label, folder in folders.items()}
    first = next(iter(models.values()))
    eager = _weights_model(first)
    weights = step_weight_bytes(eager, first.manifest["dtype"])
    rng = np.random.default_rng(seed)
    rows = []
    before = measure_bandwidth(512, repeats=9, threads=threads)
    for past in contexts:
        fns, moved = {}, {}
        for label, rt in models.items():
            feeds = _step_feeds(rt, 1, past, rng, PROMPT_LEN[False])
            tokens, state = split_feeds(feeds, past)
            fns[label] = advancing_step(rt, tokens, state)
            kv = State({k: state.arrays[k] for k in _self_kv(rt)})
            slots = next(iter(kv.arrays.values())).shape[2]
            moved[label] = state.nbytes - kv.nbytes + kv.nbytes * past // max(slots, 1)
        times = time_paired(fns, repeats, sample_s)
        rows.append({"context": past, **{f"{k}_ms": v * 1e3 for k, v in times.items()}, "moved_bytes": moved})
    # measured before and after the steps (it drifts by a fifth on this machine): the higher,
    # so that the bound stays a time reading the bytes cannot beat
    bw = max(before, measure_bandwidth(512, repeats=9, threads=threads), key=lambda b: b["gbs"])
    floor_ms = linear_chain_ms(step_linear_shapes(eager), threads, repeats, sample_s)
    ref = next(iter(models))
    for row in rows:
        for label in models:
            bound = (weights + row["moved_bytes"][label]) / (bw["gbs"] * 1e9) * 1e3
            row[f"{label}_bound_ms"] = bound
            row[f"{label}_over_bound"] = row[f"{label}_ms"] / bound
            row[f"ratio_{label}"] = row[f"{label}_ms"] / row[f"{ref}_ms"]
            row[f"{label}_over_linears"] = row[f"{label}_ms"] / floor_ms  # ÷ the floor ORT's GEMV sets
            # ... plus reading what the step must read of its state (valid cache, cross K/V) once
            row[f"{label}_floor_ms"] = floor_ms + row["moved_bytes"][label] / (bw["gbs"] * 1e9) * 1e3
            row[f"{label}_over_floor"] = row[f"{label}_ms"] / row[f"{label}_floor_ms"]
    return {"bandwidth": bw, "weights_bytes": weights, "labels": list(models), "rows": rows,
            "linears_only_ms": floor_ms, "linears_only_over_weights_bound": floor_ms / (weights / (bw["gbs"] * 1e9) * 1e3)}


def step_linear_shapes(model) -> list[tuple[int, int]]:
    """(out, in) of every linear one decode step runs: the weights of `step_weight_bytes`."""
    return [tuple(m.weight.shape) for n, m in model.decoder.named_modules()
            if isinstance(m, torch.nn.Linear) and ".cross_attn.W_k" not in n and ".cross_attn.W_v" not in n]


def _weights_model(rt):
    """The eager model an export was made from (its weights' sizes give the step's bound)."""
    from seqexport.parity.validate import eager_checkpoint

    return eager_checkpoint(rt.folder, rt.manifest, None).model
