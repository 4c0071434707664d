"""The README's main job: export the bundled models, validate them, and decode the
held-out split with eager PyTorch and with ONNX Runtime side by side.

Without bundled models (a checkout without models/pretrained) it exports and
validates the tiny presets instead.
"""

import time
from pathlib import Path

import click
import torch

from seqexport import families
from seqexport.checkpoints import checkpoint_extra, resolve_model
from seqexport.export import export_model
from seqexport.export.naming import default_name
from seqexport.parity.validate import validate
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load
from seqexport.runtime.tokenizer import ByteTokenizer, encode_prompt

MAX_NEW = 16  # the date task's answers are 10 bytes + eos
BATCH = 50  # prompts decoded together


def _decode(model, prompts) -> tuple[list[list[int]], float, int]:
    """Greedy decode in batches; returns the tokens, seconds and tokens generated."""
    opts = SearchOptions(max_new_tokens=MAX_NEW)
    start = time.perf_counter()
    out = []
    for i in range(0, len(prompts), BATCH):
        out += generate(model, prompts[i : i + BATCH], opts)
    seconds = time.perf_counter() - start
    return out, seconds, sum(len(o) + 1 for o in out)


def held_out_comparison(family, ckpt, folder, record, n, threads) -> dict:
    from seqexport.training.dates import make_split

    tok = ByteTokenizer.from_dict(record)
    pairs = make_split("test", n, seed=0)
    torch.set_num_threads(threads)
    eager = families.eager_model(ckpt, tok)
    ort_model = load(folder, provider="auto", threads=threads)
    prompts = [encode_prompt(tok, ort_model.prompt_frame, x, record) for x, _ in pairs]
    e_out, e_s, e_n = _decode(eager, prompts)
    o_out, o_s, o_n = _decode(ort_model, prompts)
    e_text = [tok.decode(o) for o in e_out]
    o_text = [tok.decode(o) for o in o_out]
    return {
        "family": family, "n": n, "provider": ort_model.provider,
        "recorded": _recorded(ckpt),
        "acc_eager": sum(p == y for p, (_, y) in zip(e_text, pairs)) / n,
        "acc_ort": sum(p == y for p, (_, y) in zip(o_text, pairs)) / n,
        "identical": sum(a == b for a, b in zip(e_out, o_out)),
        "tps_eager": e_n / e_s, "tps_ort": o_n / o_s,
        "examples": [(x, y, e, o) for (x, y), e, o in list(zip(pairs, e_text, o_text))[:4]],
    }


def _recorded(ckpt):
    return (checkpoint_extra(ckpt, "eval") or {}).get("exact_match")


def run_demo(out: str = "exported", n: int = 200, threads: int = 2) -> bool:
    """Export, validate and compare both families; returns True when every check passed."""
    rows, ok = [], True
    for family in families.names():
        ckpt, preset = resolve_model(family, None, None)
        folder = Path(out) / default_name(family, ckpt, preset)
        record = checkpoint_extra(ckpt, "tokenizer")
        click.echo(f"[{family}] exporting {ckpt.path or 'preset ' + preset} -> {folder}", err=True)
        export_model(ckpt, preset, folder, overwrite=True, tokenizer=record)
        click.echo(f"[{family}] validating (ONNX Runtime vs eager, 3 checks) …", err=True)
        report = validate(folder, steps=16)
        ok &= report.passed
        click.echo(f"[{family}] parity {'PASS' if report.passed else 'FAIL'}: "
                   + ", ".join(f"{k} {'ok' if report.check_passed(k) else 'FAIL'}" for k in report.CHECKS), err=True)
        if not report.passed:
            click.echo(report.table(), err=True)
        if record is not None:
            click.echo(f"[{family}] decoding {n} held-out examples, eager and ONNX Runtime …", err=True)
            rows.append(held_out_comparison(family, ckpt, folder, record, n, threads))
    if rows:
        click.echo(format_table(rows))
    click.echo(f"demo: {'all parity checks passed' if ok else 'PARITY FAILED'}")
    return ok


def format_table(rows) -> str:
    lines = ["", f"held-out date normalisation (greedy, batches of {BATCH})",
             f"{'model':12} {'recorded':>9} {'eager acc':>10} {'ORT acc':>9} {'identical':>10} "
             f"{'eager tok/s':>12} {'ORT tok/s':>10} {'ORT/eager':>10}"]
    for r in rows:
        rec = f"{100 * r['recorded']:.1f}%" if r["recorded"] is not None else "-"
        lines.append(f"{r['family']:12} {rec:>9} {100 * r['acc_eager']:9.1f}% {100 * r['acc_ort']:8.1f}% "
                     f"{r['identical']:>5}/{r['n']:<4} {r['tps_eager']:12.0f} {r['tps_ort']:10.0f} "
                     f"{r['tps_ort'] / r['tps_eager']:9.1f}x")
    lines.append("")
    lines.append("examples (input -> expected | eager | ONNX Runtime):")
    for r in rows:
        for x, y, e, o in r["examples"][:3]:
            lines.append(f"  {r['family']:12} {x!r:34} -> {y} | {e} | {o}")
    return "\n".join(lines)
