"""The checks of a foreign artifact against its transformers reference, the same as ours
(`seqexport.parity.checks`) where the artifact allows:

- teacher_forced: the artifact fed a random target in chunks of mixed lengths (the prompt, then
  1, 4, 1, 2, 3 ... tokens, each cut to what its graph takes), every position's logits against
  the reference's one full forward without cache; then every state tensor after the decode,
  through its layout, against the reference's cache after the whole sequence;
- free_running: greedy decodes of both, tie-aware (a first differing token passes only where
  the reference's top-2 margin is within tolerance).
A quantised artifact is judged by `QuantRule` (top-1 agreement, its picks being the reference's
argmax on its own prefix), its figures reported.
"""

import numpy as np

from seqexport.foreign.localize import locate
from seqexport.parity.checks import QuantRule, chunk_lengths, int8_agreement, per_position
from seqexport.parity.compare import compare
from seqexport.parity.report import Case

PROMPT = 3  # tokens of the first call (an encoder-decoder's: the start token + 2)


def target(ref, rng, batch: int, length: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(tokens (b, length), src (b, 7) or None): random ids in [1, vocab); an encoder-decoder's
    target starts with its decoder start token."""
    tokens = rng.integers(1, ref.vocab_size, (batch, length))
    src = None
    if ref.encoder_decoder:
        tokens[:, 0] = ref.start_id
        src = rng.integers(1, ref.vocab_size, (batch, 7))
    return tokens, src


def calls(model, first: int, total: int) -> list[int]:
    """Chunk lengths of the teacher-forced decode, each cut to what its graph takes."""
    out, past = [], 0
    for n in chunk_lengths(first, total):
        while n:
            take = min(n, model.max_tokens(past) or n)
            out.append(take)
            past, n = past + take, n - take
    return out


def teacher_forced(model, ref, rng, steps: int, batch: int, atol, rtol, quant: QuantRule | None = None) -> Case:
    tokens, src = target(ref, rng, batch, PROMPT + steps)
    chunks = calls(model, PROMPT, tokens.shape[1])
    ctx, got, pos = model.begin(batch, src), [], 0
    for n in chunks:
        got.append(model.step(tokens[:, pos: pos + n], ctx))  # (b, n, vocab)
        pos += n
    got = np.concatenate(got, 1)
    ref_logits = ref.logits(tokens, src)  # (b, T, vocab)
    outs = per_position(got, ref_logits, atol, rtol)
    cache = ref.cache(tokens, src)
    layers = {}  # layer -> whether all its state tensors passed
    unmatched = []  # state tensors the reference has nothing to compare with: each fails (NaN)
    for name, role in model.roles.items():
        if (role.layer, role.part) not in cache:
            outs.append(compare(f"final {name}", ctx.state[name], np.full_like(ctx.state[name], np.nan), atol, rtol))
            unmatched.append(f"{name} (layer {role.layer} {role.part})")
            continue
        a, b = role.as_compared(ctx.state[name], cache[(role.layer, role.part)])
        c = compare(f"final {name}", a, b, atol, rtol)
        outs.append(c)
        layers[role.layer] = layers.get(role.layer, True) and c.passed
    label = f"{tokens.shape[1]} tokens in calls {chunks}, batch {batch}"
    case = Case("teacher_forced", label, outs)
    notes = [f"the reference has no state to compare {', '.join(unmatched)} with (it holds layers "
             f"{sorted({layer for layer, _ in cache})}, parts {sorted({part for _, part in cache})})"] if unmatched else []
    # where it diverges (a quantised copy's elements differ everywhere: its rule says enough)
    bad = None if quant else next((o for o in outs if not o.passed and o.name.startswith("logits position")), None)
    if bad is not None:  # a Comparison is falsy when it failed
        t = int(bad.name.rsplit(" ", 1)[1])
        k = next(i for i, end in enumerate(np.cumsum(chunks)) if t < end)
        notes.append(f"first diverging position {t}: call {k} ({chunks[k]} tokens after {sum(chunks[:k])})")
        notes.append(locate(model, ref, tokens, src, chunks, k, atol, rtol))
    failed = [] if quant else sorted(layer for layer, ok in layers.items() if not ok)
    if failed:
        names = [o.name[6:] for o in outs if not o.passed and o.name.startswith("final ")]
        notes.append(f"first layer whose state diverges: layer {failed[0]} ({', '.join(names[:4])})")
    if quant:
        agree, decisive, share = int8_agreement(got, ref_logits)
        case.ok = agree >= quant.min_top1 and all(o.nonfinite == 0 for o in outs)
        notes.insert(0, f"{quant.label}: top-1 agreement {agree:.2%} (>= {quant.min_top1:.0%} required); "
                        f"{decisive:.2%} at the {share:.0%} of positions whose reference top-2 margin exceeds twice "
                        "the mean logit error")
    case.note = "; ".join(notes)
    return case


def free_running(model, ref, rng, steps: int, batch: int, atol, rtol, quant: QuantRule | None = None) -> list[Case]:
    """Greedy decode of `steps` tokens after a prompt, the artifact batched, the reference row by
    row with a full forward over the whole prefix every step."""
    prompt, src = target(ref, rng, batch, PROMPT)
    ctx = model.begin(batch, src)
    logits, picks = model.step(prompt, ctx)[:, -1], []
    for _ in range(steps):
        if not np.isfinite(logits).all():
            break  # NaN/Inf: the rows stop here, the check fails below
        tok = logits.argmax(-1)  # (b,)
        picks.append(tok)
        logits = model.step(tok[:, None], ctx)[:, -1]
    got = np.stack(picks, 1) if picks else np.zeros((batch, 0), np.int64)  # (b, steps)
    rows = [src[r: r + 1] if src is not None else None for r in range(batch)]
    if quant:
        return [quant_case(r, got[r], ref, prompt[r], rows[r], quant) for r in range(batch)]
    return [free_case(r, got[r], steps, ref, prompt[r], rows[r], atol, rtol) for r in range(batch)]


def free_case(row: int, tokens, steps: int, ref, prompt, src, atol, rtol) -> Case:
    seq = list(prompt)
    for t in range(steps):
        lg = ref.logits(np.array([seq]), src)[0, -1]
        best = int(lg.argmax())
        if t >= len(tokens) or tokens[t] != best:
            top2 = np.sort(lg)[-2:]
            margin, bound = float(top2[1] - top2[0]), atol + rtol * abs(float(top2[1]))
            tie = t < len(tokens) and margin <= bound
            other = int(tokens[t]) if t < len(tokens) else "NaN/Inf logits"
            note = (f"differs at step {t}: artifact {other}, reference {best}, reference top-2 margin {margin:.3g} "
                    + ("<= tolerance: a near-tie" if tie else f"> tolerance {bound:.3g}: a real divergence"))
            return Case("free_running", f"row {row}: {t}/{steps} tokens identical", note=note, ok=tie)
        seq.append(best)
    return Case("free_running", f"row {row}: {steps}/{steps} tokens identical", ok=True)


def quant_case(row: int, tokens, ref, prompt, src, quant: QuantRule) -> Case:
    """A quantised row judged along its own path: is each pick the reference's argmax on the
    artifact's own prefix?"""
    seq, agree = list(prompt), 0
    for tok in tokens:
        agree += int(ref.logits(np.array([seq]), src)[0, -1].argmax()) == int(tok)
        seq.append(int(tok))
    n = len(tokens)
    share = agree / n if n else 0.0
    return Case("free_running", f"row {row}: {agree}/{n} {quant.label} picks are the reference's", ok=share >= quant.min_tokens,
                note=f"{quant.label}: {share:.0%} of its picks are the reference's argmax on the same prefix "
                     f"(>= {quant.min_tokens:.0%} required)")
