"""Parity of an exported folder with the eager model it came from, in three checks:

1. graphs: every graph on seeded inputs at several shapes drawn from its spec
   (batch 1, past_len 0, seq_len 1, a long length), each output compared;
2. teacher_forced: a decode of N steps through the ONNX graphs, each step's
   logits compared with the eager model's full forward without cache, and the
   final cache/state compared with eager's;
3. free_running: greedy decode of N steps, ONNX vs eager (full forward each
   step): the same tokens, or a first differing step whose eager top-2 margin is
   within tolerance (a near-tie, reported as such).

When a graph check fails, the shipped graph is re-run with every module's output
exposed to name the first diverging eager module (see `localize`).

    report = seqexport.parity.validate.validate("exported/transformer-tiny")
    assert report.passed, report.summary()
"""

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from seqexport import specs as S
from seqexport.checkpoints.io import load_checkpoint
from seqexport.errors import CheckpointError
from seqexport.manifest import MANIFEST, read_manifest
from seqexport.parity.compare import DEFAULT_TOLERANCE, Comparison, compare
from seqexport.parity.localize import Divergence, first_divergence
from seqexport.runtime.generate import SearchOptions, generate
from seqexport.runtime.models import load as rt_load
from seqexport.runtime.session import NP_DTYPES

NEVER = -1  # an eos id that never matches: free-running decodes run all N steps


@dataclass
class Case:
    check: str  # graphs | teacher_forced | free_running
    label: str
    outputs: list[Comparison] = field(default_factory=list)
    divergence: Divergence | None = None
    note: str = ""
    ok: bool | None = None  # set for cases judged otherwise than by outputs

    @property
    def passed(self) -> bool:
        return self.ok if self.ok is not None else all(self.outputs)

    def to_dict(self) -> dict:
        return {"label": self.label, "passed": self.passed, "note": self.note,
                "outputs": [c.to_dict() for c in self.outputs],
                "divergence": self.divergence.to_dict() if self.divergence else None}


@dataclass
class Report:
    folder: str
    family: str
    dtype: str
    provider: str
    eager_device: str
    atol: float
    rtol: float
    steps: int
    batch: int
    seed: int
    checkpoint: str
    cases: list[Case] = field(default_factory=list)
    seconds: float = 0.0

    CHECKS = ("graphs", "teacher_forced", "free_running")

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    def __bool__(self) -> bool:
        return self.passed

    def check_passed(self, check: str) -> bool:
        return all(c.passed for c in self.cases if c.check == check)

    def failures(self) -> list[str]:
        out = []
        for c in self.cases:
            if c.passed:
                continue
            bad = [o.name for o in c.outputs if not o.passed]
            msg = f"{c.check} / {c.label}: " + (f"outputs {', '.join(bad)} out of tolerance" if bad else c.note)
            if c.divergence:
                msg += f"; {c.divergence.describe()}"
            out.append(msg)
        return out

    def summary(self) -> dict:
        return {"passed": self.passed, "provider": self.provider, "eager_device": self.eager_device,
                "atol": self.atol, "rtol": self.rtol, "steps": self.steps,
                "checks": {k: self.check_passed(k) for k in self.CHECKS},
                "failures": self.failures()}

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("folder", "family", "dtype", "provider", "eager_device", "atol",
                                           "rtol", "steps", "batch", "seed", "checkpoint", "seconds")}
        d["passed"] = self.passed
        d["checks"] = {k: {"passed": self.check_passed(k),
                           "cases": [c.to_dict() for c in self.cases if c.check == k]} for k in self.CHECKS}
        d["failures"] = self.failures()
        return d

    def table(self) -> str:
        lines = [f"parity of {self.folder} ({self.family}, {self.dtype}) · ORT {self.provider} vs eager "
                 f"{self.eager_device} · atol {self.atol:g} rtol {self.rtol:g}"]
        for check in self.CHECKS:
            lines.append(f"{check}: {'PASS' if self.check_passed(check) else 'FAIL'}")
            for c in (c for c in self.cases if c.check == check):
                worst = max(c.outputs, key=lambda o: o.needed_atol, default=None)
                detail = (f"max abs {worst.max_abs:.2e} (worst {worst.name}, needs atol {worst.needed_atol:.1e})"
                          if worst else "")
                lines.append(f"  {'ok  ' if c.passed else 'FAIL'} {c.label:44} {detail} {c.note}".rstrip())
                for o in c.outputs:
                    if not o.passed:
                        lines.append(f"         {o.name}: max abs {o.max_abs:.3g}, max rel {o.max_rel:.3g}, "
                                     f"mean abs {o.mean_abs:.3g}, needs atol {o.needed_atol:.3g}"
                                     + (f", {o.nonfinite} NaN/Inf" if o.nonfinite else ""))
                if c.divergence:
                    lines.append(f"         {c.divergence.describe()}")
        lines.append(f"result: {'PASS' if self.passed else 'FAIL'} ({self.seconds:.1f} s)")
        return "\n".join(lines)


# --- the eager model --------------------------------------------------------------------------


def eager_checkpoint(folder: Path, manifest: dict, checkpoint: str | None):
    """The eager model the manifest names (sha256-checked), or the one --checkpoint names."""
    if checkpoint:
        return load_checkpoint(checkpoint, family=manifest["family"])
    source = manifest.get("source") or {}
    path = Path(source.get("checkpoint", ""))
    if not source.get("checkpoint"):
        raise CheckpointError(f"{folder}/{MANIFEST} names no source checkpoint; pass --checkpoint")
    if not path.is_absolute():
        path = folder / path
    ckpt = load_checkpoint(path, family=manifest["family"])
    if source.get("sha256") and ckpt.sha256 != source["sha256"]:
        raise CheckpointError(
            f"checkpoint {path} changed since export (sha256 {ckpt.sha256[:12]}…, manifest {source['sha256'][:12]}…); "
            "pass --checkpoint to validate against it anyway"
        )
    return ckpt


def _torch(a: np.ndarray, device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t.float() if t.is_floating_point() else t).to(device)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()


# --- family adapters: what to feed and what the eager reference is ------------------------------


class _Family:
    def __init__(self, model, config, rt, device, rng, batch):
        self.model, self.config, self.rt, self.device, self.rng, self.batch = model, config, rt, device, rng, batch

    def feeds(self, graph: str, arrays: dict) -> dict:
        spec = self.rt.specs[graph]
        return {t.name: arrays[t.name].astype(NP_DTYPES[t.dtype]) for t in spec.inputs}

    def eager_graph(self, graph: str, wrapper, arrays: dict) -> dict:
        spec = self.rt.specs[graph]
        with torch.no_grad():
            outs = wrapper(*[_torch(arrays[n], self.device) for n in spec.input_names])
        return dict(zip(spec.output_names, (_numpy(o) for o in outs)))


class _TransformerFamily(_Family):
    def wrapper(self, graph):
        from seqexport.families.transformer.export import DecoderGraph, EncoderGraph

        return (EncoderGraph if graph == "encoder" else DecoderGraph)(self.model)

    def _src(self, batch, length):
        ids = self.rng.integers(1, self.config.src_vocab_size, (batch, length))
        mask = np.ones_like(ids)
        for r in range(1, batch):  # later rows padded, to check the masks
            n = max(1, length - 2 * r)
            ids[r, n:], mask[r, n:] = self.config.pad_id, 0
        return ids, mask

    def graph_cases(self):
        c, b = self.config, self.batch
        long = min(96, c.max_len - 1)
        for bs, s in ((1, 1), (b, 7), (1, long)):
            ids, mask = self._src(bs, s)
            yield "encoder", f"encoder batch={bs} src_len={s}", {S.INPUT_IDS: ids, S.ATTENTION_MASK: mask}
        for bs, s, past, t in ((1, 1, 0, 1), (b, 7, 5, 1), (b, 7, 0, 4), (1, 9, long - 1, 1)):
            _, mask = self._src(bs, s)
            arrays = {S.INPUT_IDS: self.rng.integers(1, c.tgt_vocab_size, (bs, t)), S.ENCODER_ATTENTION_MASK: mask}
            for spec in self.rt.specs["decoder"].inputs[2:]:
                n = s if ".encoder." in spec.name else past
                arrays[spec.name] = self.rng.standard_normal((bs, c.n_heads, n, c.head_dim)).astype(np.float32)
            yield "decoder", f"decoder batch={bs} past_len={past} tgt_len={t}", arrays

    def teacher_forced(self, steps, atol, rtol) -> Case:
        from seqexport.models.transformer import generate_mask, padding_mask

        src, mask = self._src(self.batch, 9)
        tgt = self.rng.integers(1, self.config.tgt_vocab_size, (self.batch, steps))
        state = self.rt.start(src, mask)
        got = []
        for t in range(steps):
            logits, state = self.rt.step(tgt[:, t], state)
            got.append(logits)
        captured = {}
        hooks = [layer.self_attn.register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(i, a[0]))
                 for i, layer in enumerate(self.model.decoder.layers)]
        s, tt = _torch(src, self.device), _torch(tgt, self.device)
        pm = padding_mask(s, self.config.pad_id)
        try:
            with torch.no_grad():
                ref = self.model(s, tt, src_mask=pm, tgt_mask=generate_mask(steps).to(self.device), memory_mask=pm)
                kv = {}
                for i, layer in enumerate(self.model.decoder.layers):
                    sa = layer.self_attn
                    kv[S.past_kv(i, "decoder", "key")] = _numpy(sa.split_heads(sa.W_k(captured[i])))
                    kv[S.past_kv(i, "decoder", "value")] = _numpy(sa.split_heads(sa.W_v(captured[i])))
        finally:
            for h in hooks:
                h.remove()
        outs = _per_step(np.stack(got, 1), _numpy(ref), atol, rtol)
        state = state.numpy()  # host copies when the cache lives on the device
        outs += [compare(f"final {k}", state.arrays[k], v, atol, rtol) for k, v in kv.items()]
        return Case("teacher_forced", f"{steps} steps, batch {self.batch}, padded sources", outs)

    def free_running(self, steps, atol, rtol) -> list[Case]:
        from seqexport.models.transformer import generate_mask, padding_mask

        src, mask = self._src(self.batch, 9)
        start = self.rt.tokenizer.bos_id if self.rt.tokenizer else 1
        rows = [list(r[m.astype(bool)]) for r, m in zip(src, mask)]
        got = generate(self.rt, rows, SearchOptions(
            max_new_tokens=steps, eos_id=NEVER, start_id=start))

        def eager_logits(r, prefix):
            s = _torch(np.array([rows[r]]), self.device)
            t = _torch(np.array([[start] + prefix]), self.device)
            with torch.no_grad():
                return _numpy(self.model(s, t, src_mask=padding_mask(s), memory_mask=padding_mask(s),
                                         tgt_mask=generate_mask(t.shape[1]).to(self.device))[0, -1])

        return [_free_case(r, got[r], steps, lambda prefix, r=r: eager_logits(r, prefix), atol, rtol)
                for r in range(len(rows))]


class _MambaFamily(_Family):
    def wrapper(self, graph):
        from seqexport.families.mamba.export import PrefillGraph, StepGraph

        return PrefillGraph(self.model) if graph == "prefill" else StepGraph(self.model)

    def _states(self, batch, zero=False):
        arrays = {}
        for spec in self.rt.specs["step"].inputs[1:]:
            shape = (batch, *spec.dims[1:])
            arrays[spec.name] = np.zeros(shape, np.float32) if zero else \
                self.rng.standard_normal(shape).astype(np.float32)
        return arrays

    def graph_cases(self):
        b, v = self.batch, self.config.vocab_size
        fixed = self.rt.prefill_len
        shapes = ((b, fixed, True), (1, fixed, False)) if fixed else ((1, 1, True), (b, 7, False), (1, 256, False))
        for bs, n, zero in shapes:
            arrays = {S.INPUT_IDS: self.rng.integers(0, v, (bs, n)), **self._states(bs, zero)}
            yield "prefill", f"prefill batch={bs} seq_len={n} {'zero' if zero else 'random'} state", arrays
        for bs in (1, b):
            yield "step", f"step batch={bs} random state", {S.INPUT_IDS: self.rng.integers(0, v, (bs, 1)),
                                                           **self._states(bs)}

    def teacher_forced(self, steps, atol, rtol) -> Case:
        prompt = self.rt.prefill_len or 8
        ids = self.rng.integers(0, self.config.vocab_size, (self.batch, prompt + steps))
        logits, state = self.rt.step(ids[:, :prompt], self.rt.start(self.batch))
        got = [logits]
        for t in range(prompt, prompt + steps):
            lg, state = self.rt.step(ids[:, t], state)
            got.append(lg[:, None])
        with torch.no_grad():
            ref, ref_state = self.model(_torch(ids, self.device))
        outs = [compare(f"prefill logits ({prompt} tokens)", got[0], _numpy(ref[:, :prompt]), atol, rtol)]
        outs += _per_step(np.concatenate(got[1:], 1), _numpy(ref[:, prompt:]), atol, rtol)
        state = state.numpy()  # host copies when the state lives on the device
        for i, (conv, ssm) in enumerate(ref_state):
            outs.append(compare(f"final {S.past_conv(i)}", state.arrays[S.past_conv(i)], _numpy(conv), atol, rtol))
            outs.append(compare(f"final {S.past_ssm(i)}", state.arrays[S.past_ssm(i)], _numpy(ssm), atol, rtol))
        return Case("teacher_forced", f"prefill {prompt} + {steps} steps, batch {self.batch}", outs)

    def free_running(self, steps, atol, rtol) -> list[Case]:
        v = self.config.vocab_size
        rows = [list(self.rng.integers(0, v, 3 + 2 * r)) for r in range(self.batch)]
        got = generate(self.rt, rows, SearchOptions(max_new_tokens=steps, eos_id=NEVER))

        def eager_logits(r, prefix):
            with torch.no_grad():
                logits, _ = self.model(_torch(np.array([rows[r] + prefix]), self.device))
            return _numpy(logits[0, -1])

        return [_free_case(r, got[r], steps, lambda prefix, r=r: eager_logits(r, prefix), atol, rtol)
                for r in range(len(rows))]


def _per_step(got: np.ndarray, ref: np.ndarray, atol, rtol) -> list[Comparison]:
    """One comparison over all steps' logits; a failure names its first failing step."""
    whole = compare("logits (all steps)", got, ref, atol, rtol)
    if whole.passed:
        return [whole]
    for t in range(got.shape[1]):
        c = compare(f"logits step {t}", got[:, t], ref[:, t], atol, rtol)
        if not c.passed:
            return [whole, c]
    return [whole]


def _free_case(row, onnx_tokens, steps, eager_logits, atol, rtol) -> Case:
    """Eager greedy with a full forward each step vs the ONNX tokens of one row."""
    prefix = []
    for t in range(steps):
        logits = eager_logits(prefix)
        tok = int(logits.argmax())
        if t >= len(onnx_tokens) or onnx_tokens[t] != tok:
            top2 = np.sort(logits)[-2:]
            margin = float(top2[1] - top2[0])
            bound = atol + rtol * abs(float(top2[1]))
            tie = margin <= bound
            other = onnx_tokens[t] if t < len(onnx_tokens) else None
            note = (f"differs at step {t}: ONNX {other}, eager {tok}, eager top-2 margin {margin:.3g} "
                    + ("<= tolerance: a near-tie" if tie else f"> tolerance {bound:.3g}: a real divergence"))
            return Case("free_running", f"row {row}: {t}/{steps} tokens identical", note=note, ok=tie)
        prefix.append(tok)
    return Case("free_running", f"row {row}: {steps}/{steps} tokens identical", ok=True)


# --- the driver ---------------------------------------------------------------------------------


def validate(folder, checkpoint: str | None = None, provider: str = "auto", atol: float | None = None,
             rtol: float | None = None, steps: int = 20, batch: int = 2, seed: int = 0,
             localize: bool = True, write_summary: bool = True) -> Report:
    """Run the three checks; the report is truthy when everything passed."""
    started = time.perf_counter()
    folder = Path(folder)
    manifest = read_manifest(folder)
    ckpt = eager_checkpoint(folder, manifest, checkpoint)
    d_atol, d_rtol = DEFAULT_TOLERANCE[manifest["dtype"]]
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    rt = rt_load(folder, provider=provider, verify=False)
    device = "cuda" if rt.provider == "CUDAExecutionProvider" and torch.cuda.is_available() else "cpu"
    model = ckpt.model.to(device).float().eval()
    rng = np.random.default_rng(seed)
    family = (_TransformerFamily if manifest["family"] == "transformer" else _MambaFamily)(
        model, ckpt.config, rt, device, rng, batch)
    report = Report(str(folder), manifest["family"], manifest["dtype"], rt.provider, device, atol, rtol,
                    steps, batch, seed, str(ckpt.path))
    providers = rt.graphs[next(iter(rt.graphs))].session.get_providers()
    for graph, label, arrays in family.graph_cases():
        feeds = family.feeds(graph, arrays)
        got = rt.graphs[graph].run(feeds)
        wrapper = family.wrapper(graph)
        ref = family.eager_graph(graph, wrapper, arrays)
        case = Case("graphs", label, [compare(n, got[n], ref[n], atol, rtol) for n in rt.specs[graph].output_names])
        if not case.passed and localize:
            torch_inputs = tuple(_torch(arrays[n], device) for n in rt.specs[graph].input_names)
            case.divergence = first_divergence(rt.graphs[graph].path, wrapper, torch_inputs, feeds, atol, rtol,
                                               providers)
            if case.divergence is None:
                case.note = "no single module output diverges beyond tolerance (accumulated error)"
        report.cases.append(case)
    report.cases.append(family.teacher_forced(steps, atol, rtol))
    report.cases.extend(family.free_running(steps, atol, rtol))
    report.seconds = round(time.perf_counter() - started, 2)
    if write_summary:
        try:
            write_parity_summary(folder, report)
        except OSError as e:  # a read-only artifact still gets its report
            warnings.warn(f"parity summary not written into {folder / MANIFEST}: {e}", stacklevel=2)
    return report


def write_parity_summary(folder: Path, report: Report) -> None:
    """Record the parity summary in manifest.json (atomically: temp file + rename)."""
    path = folder / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["parity"] = {"summary": report.summary(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)
