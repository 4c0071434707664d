"""The three checks of `validate`, for any family: graphs on seeded inputs, a teacher-forced
decode fed in chunks of mixed lengths, and a free-running greedy decode.

The family says only what differs (`seqexport/families/<name>/parity.py`): the graph cases'
sizes, the module each graph was traced from, how a decode starts, and the prompts.
"""

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from seqexport.errors import ArtifactError
from seqexport.parity.compare import Comparison, compare
from seqexport.parity.float16 import Float16Error
from seqexport.parity.inputs import random_inputs
from seqexport.parity.localize import first_divergence
from seqexport.parity.report import Case
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.session import NP_DTYPES

NEVER = -1  # an eos id that never matches: free-running decodes run all N steps


@dataclass(frozen=True)
class QuantRule:
    """How a quantised export is judged against the float32 eager model: per-output figures are
    reported, not judged (any NaN/Inf still fails); the decodes are judged by agreement, and a
    recurrent model's state by its drift over a long decode (`parity.drift`). The defaults are
    int8's; `for_bits(4)` gives int4's."""

    min_top1: float = 0.95  # teacher-forced: share of positions whose argmax equals eager's
    min_tokens: float = 0.75  # free-running: share of each row's int8 picks that are eager's argmax on that prefix
    max_drift: float = 0.1  # every recurrent state tensor over steps 241-256: ‖q − f‖ / ‖f‖ (worst row)
    bits: int = 8

    @property
    def label(self) -> str:
        return f"int{self.bits}"

    @classmethod
    def for_bits(cls, bits: int, min_top1: float | None = None, min_tokens: float | None = None,
                 max_drift: float | None = None) -> "QuantRule":
        """The rule for int`bits` weights, with the thresholds given (None: the default).

        int4, from validate on the bundled models' int4 copies, seeds 0-4 (docs/quantization.md):
        teacher-forced top-1 over validate's random tokens 0.77-1.00 (a 4-bit weight moves a
        near-flat logit of a date model fed random bytes more than an 8-bit one; int8: 0.95-1.00),
        copies with one layer's in_proj scaled 1.3x / 1.6x 0.68 / 0.41: so 0.7; free-running
        picks 0.80-1.00 (1.6x: 0.65), so 0.7; state drift over steps 241-256 0.09-0.19 (eight
        seeds; the tiny, 130m and 0.1b presets up to 0.19), 1.3x-scaled in_proj 0.36-0.37: so
        0.3. int8: drift 0.001-0.030, so 0.1 (`parity.drift`)."""
        d = cls(min_top1=0.7, min_tokens=0.7, max_drift=0.3, bits=4) if bits == 4 else cls()
        return cls(d.min_top1 if min_top1 is None else min_top1, d.min_tokens if min_tokens is None else min_tokens,
                   d.max_drift if max_drift is None else max_drift, bits)


CHUNKS = (1, 4, 1, 2, 3)  # teacher-forced chunk lengths after the prompt, cycled


def _torch(a: np.ndarray, device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t.float() if t.is_floating_point() else t).to(device)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()


def graph_case(rt, cases, graph: str, label: str, arrays: dict, atol, rtol, device, localize: bool,
               int8: QuantRule | None = None, float16: Float16Error | None = None) -> Case:
    """One graph on one set of inputs, every output compared with the wrapper it was traced from
    (a float16 export's failing outputs again, against float16's own error)."""
    spec = rt.specs[graph]
    feeds = {t.name: arrays[t.name].astype(NP_DTYPES[t.dtype]) for t in spec.inputs}
    got = rt.graphs[graph].run(feeds)
    wrapper = cases.wrapper(graph)
    torch_inputs = tuple(_torch(arrays[n], device) for n in spec.input_names)
    with torch.no_grad():
        ref = dict(zip(spec.output_names, (_numpy(o) for o in wrapper(*torch_inputs))))
    case = Case("graphs", label, [compare(n, got[n], ref[n], atol, rtol) for n in spec.output_names])
    if int8:
        case.ok = all(o.nonfinite == 0 for o in case.outputs)
        case.note = f"{int8.label}: figures reported, not judged"
        return case
    if not case.passed and float16:
        float16.rejudge(case, got, ref, lambda: float16.graph(graph, spec, feeds, device), atol, rtol)
    if not case.passed and localize:
        providers = rt.graphs[graph].session.get_providers()
        case.divergence = first_divergence(rt.graphs[graph].path, wrapper, torch_inputs, feeds, atol, rtol,
                                           providers)
        if case.divergence is None:
            case.note = "; ".join(filter(None, (case.note, "no single module output diverges beyond tolerance "
                                                                "(accumulated error)")))
    return case


def graph_cases(rt, cases, rng, atol, rtol, device, localize: bool, int8: QuantRule | None = None,
                float16: Float16Error | None = None) -> list[Case]:
    out = []
    for graph, sizes, zero in cases.graph_cases():
        arrays = random_inputs(rt.specs[graph], sizes, rng, zero_state=zero)
        shape = " ".join(f"{k}={v}" for k, v in sizes.items())
        label = f"{graph} {shape}" + (" zero state" if zero else "")
        out.append(graph_case(rt, cases, graph, label, arrays, atol, rtol, device, localize, int8, float16))
    return out


def chunk_lengths(first: int, total: int) -> list[int]:
    """[first, then CHUNKS cycled] cut to sum to `total`: one token and several tokens per
    step, each from a non-empty past, as a user may feed them."""
    out = [min(first, total)]
    for n in itertools.cycle(CHUNKS):
        if sum(out) >= total:
            return out
        out.append(min(n, total - sum(out)))


def teacher_forced(rt, cases, steps: int, atol, rtol, rng, int8: QuantRule | None = None,
                   float16: Float16Error | None = None) -> Case:
    """The ONNX decode fed the target in chunks of mixed lengths, every position's logits
    compared with the eager model's full forward over the whole sequence, and the final
    state with the eager model's after the whole sequence in one call."""
    first = cases.prompt_len
    tokens = rng.integers(1, rt.vocab_size, (cases.batch, first + steps))  # (b, T)
    start = cases.start_args()
    chunks = chunk_lengths(first, tokens.shape[1])
    state, got, pos = rt.start(*start), [], 0
    for n in chunks:
        logits, state = rt.step(tokens[:, pos : pos + n], state)  # (b, n, v)
        got.append(logits)
        pos += n
    reference = cases.eager(cache=False)
    ref_logits, _ = reference.step(tokens, reference.start(*start))  # (b, T, v): one full forward
    logits = np.concatenate(got, 1)  # (b, T, v)
    outs = per_position(logits, ref_logits, atol, rtol)
    cached = cases.eager(cache=True)
    _, ref_state = cached.step(tokens, cached.start(*start))
    used = rt.layout.used if rt.layout else dict  # a KV cache's slots past its rows' length: capacity, not state
    final, ref_final = used(state.numpy().arrays), used(ref_state.arrays)  # host copies of a device's state
    outs += [compare(f"final {name}", final[name], ref_final[name], atol, rtol) for name in ref_final]
    label = f"{first + steps} tokens in chunks {chunks}, batch {cases.batch}"
    case = Case("teacher_forced", label, outs)
    if not case.passed and float16 and not int8:
        def own() -> dict:
            half_logits, half_state = float16.decode(tokens, start)
            return decode_outputs(half_logits, used(half_state))

        float16.rejudge(case, decode_outputs(logits, final), decode_outputs(ref_logits, ref_final), own, atol, rtol)
    if int8:
        agree, decisive, share = int8_agreement(logits, ref_logits)
        case.ok = agree >= int8.min_top1 and all(o.nonfinite == 0 for o in outs)
        case.note = (f"{int8.label}: top-1 agreement {agree:.2%} (>= {int8.min_top1:.0%} required); "
                     f"{decisive:.2%} at the {share:.0%} of positions whose eager top-2 margin exceeds "
                     f"twice the mean {int8.label} logit error")
    return case


def int8_agreement(got: np.ndarray, ref: np.ndarray) -> tuple[float, float, float]:
    """Top-1 agreement of int8 logits `got` with eager `ref` (b, T, v): over all positions, and
    over the decisive ones (eager top-2 margin > 2x the mean abs logit error: a random-weight
    model's near-flat logits make most positions a coin toss for any rounding), with their share."""
    same = got.argmax(-1) == ref.argmax(-1)  # (b, T)
    top2 = np.sort(ref, -1)[..., -2:]  # (b, T, 2)
    decisive = top2[..., 1] - top2[..., 0] > 2 * float(np.mean(np.abs(got - ref)))
    return float(same.mean()), float(same[decisive].mean()) if decisive.any() else 1.0, float(decisive.mean())


def decode_outputs(logits: np.ndarray, state: dict) -> dict[str, np.ndarray]:
    """A teacher-forced decode's logits (b, T, v) and final state under the names its
    comparisons carry (`per_position`'s, then "final <name>")."""
    return ({"logits (all positions)": logits} | {f"logits position {t}": logits[:, t] for t in range(logits.shape[1])}
            | {f"final {name}": a for name, a in state.items()})


def per_position(got: np.ndarray, ref: np.ndarray, atol, rtol) -> list[Comparison]:
    """One comparison over all positions' logits (b, T, v); a failure names its first failing position."""
    whole = compare("logits (all positions)", got, ref, atol, rtol)
    if whole.passed:
        return [whole]
    for t in range(min(got.shape[1], ref.shape[1])):
        c = compare(f"logits position {t}", got[:, t], ref[:, t], atol, rtol)
        if not c.passed:
            return [whole, c]
    return [whole]


def free_running(rt, cases, steps: int, atol, rtol, int8: QuantRule | None = None) -> list[Case]:
    """Greedy ONNX decode of each prompt vs eager greedy with the full forward every step."""
    rows = cases.prompts()
    options = SearchOptions(max_new_tokens=steps, eos_id=NEVER, start_id=cases.start_id)
    try:
        got = generate(rt, rows, options)
    except ArtifactError as e:  # NaN/Inf logits: generation stops loudly, the check fails
        return [Case("free_running", f"row {r}: no tokens", note=str(e), ok=False) for r in range(len(rows))]
    reference = cases.eager(cache=False)
    if int8:
        return [int8_free_case(r, got[r], reference, rows[r], options, int8) for r in range(len(rows))]
    return [free_case(r, got[r], steps, reference, rows[r], cases.start_id, atol, rtol) for r in range(len(rows))]


def int8_free_case(row: int, int8_tokens, reference, prompt, options: SearchOptions, int8: QuantRule) -> Case:
    """An int8 row's greedy decode judged step by step along its own path: the eager model (no
    cache) fed the same prefix, is each int8 pick its argmax? Comparing the two decodes token
    by token instead counted every token after one near-tie as wrong (a pick 0.0096 below
    eager's best on a logit of 10 made 8/12 of a bundled RWKV-7 row "differ"; on AVX-512 VNNI
    hardware, whose int8 products round otherwise, it failed validate), while a broken int8
    model still disagrees at most steps. Eager's own greedy decode is reported beside it."""
    logits, state = reference.begin([list(prompt)], options.start_id)
    agree, worst = 0, 0.0  # worst: the largest eager margin of its argmax over an int8 pick
    for tok in int8_tokens:
        lg = logits[0]
        if not np.isfinite(lg).all():
            return Case("free_running", f"row {row}: eager produced NaN/Inf logits", ok=False)
        best = int(lg.argmax())
        agree += tok == best
        worst = max(worst, float(lg[best] - lg[tok]))
        logits, state = reference.step(np.array([tok], np.int64), state)
    n = len(int8_tokens)
    share = agree / n if n else 1.0
    own = generate(reference, [list(prompt)], options)[0]  # eager's own greedy decode
    same = sum(x == y for x, y in zip(int8_tokens, own))
    note = (f"{int8.label}: {share:.0%} of its picks are eager's argmax on the same prefix (>= {int8.min_tokens:.0%} "
            f"required){f'; the others within {worst:.3g} of it' if agree < n else ''}; {same}/{len(own)} "
            "tokens equal eager's own greedy decode")
    return Case("free_running", f"row {row}: {agree}/{n} {int8.label} picks are eager's", note=note,
                ok=share >= int8.min_tokens)


def free_case(row: int, onnx_tokens, steps: int, reference, prompt, start_id, atol, rtol) -> Case:
    """Eager greedy (no cache) vs the ONNX tokens of one row; a first difference passes only as
    a near-tie (the eager top-2 margin within tolerance)."""
    logits, state = reference.begin([list(prompt)], start_id)
    for t in range(steps):
        lg = logits[0]
        tok = int(lg.argmax())
        if t >= len(onnx_tokens) or onnx_tokens[t] != tok or not np.isfinite(lg).all():
            top2 = np.sort(lg)[-2:]
            margin = float(top2[1] - top2[0])
            bound = atol + rtol * abs(float(top2[1]))
            tie = bool(np.isfinite(lg).all()) and margin <= bound
            other = onnx_tokens[t] if t < len(onnx_tokens) else None
            note = (f"differs at step {t}: ONNX {other}, eager {tok}, eager top-2 margin {margin:.3g} "
                    + ("<= tolerance: a near-tie" if tie else f"> tolerance {bound:.3g}: a real divergence"))
            return Case("free_running", f"row {row}: {t}/{steps} tokens identical", note=note, ok=tie)
        logits, state = reference.step(np.array([tok], np.int64), state)
    return Case("free_running", f"row {row}: {steps}/{steps} tokens identical", ok=True)
