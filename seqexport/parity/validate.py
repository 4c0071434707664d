"""Parity of an exported folder with the eager model it came from, in three checks:

1. graphs: every graph on seeded inputs at several shapes drawn from its spec
   (batch 1, past_len 0, seq_len 1, a long length), each output compared;
2. teacher_forced: a decode through the ONNX graphs fed in chunks of mixed
   lengths (one token and several, from a non-empty past), every position's
   logits compared with the eager model's full forward without cache, and the
   final cache/state compared with eager's;
3. free_running: greedy decode of N steps, ONNX vs eager (full forward each
   step): the same tokens, or a first differing step whose eager top-2 margin is
   within tolerance (a near-tie, reported as such);
4. state_drift (quantised copies of recurrent models only): every replaced state
   tensor over the last 16 of 256 one-token steps against the float32 eager
   model's (`drift`).

When a graph check fails, the shipped graph is re-run with every module's output
exposed to name the first diverging eager module (see `localize`).

    report = seqexport.parity.validate.validate("exported/transformer-tiny")
    assert report.passed, report.summary()
"""

import time
import warnings
from pathlib import Path

import numpy as np
import torch

import seqexport.parity.checks as checks
from seqexport import families
from seqexport.checkpoints.io import load_checkpoint
from seqexport.errors import CheckpointError
from seqexport.manifest import MANIFEST, read_manifest, update_manifest
from seqexport.parity import drift
from seqexport.parity.compare import DEFAULT_TOLERANCE
from seqexport.parity.float16 import Float16Error
from seqexport.parity.report import Report
from seqexport.runtime.models import load as rt_load
from seqexport.runtime.runners import runtime_version

# --- the eager model --------------------------------------------------------------------------


def eager_checkpoint(folder: Path, manifest: dict, checkpoint: str | None):
    """The eager model the manifest names (sha256-checked), or the one --checkpoint names
    (which must have the exported model's shape: same config)."""
    if checkpoint:
        ckpt = load_checkpoint(checkpoint, family=manifest["family"])
        ours = ckpt.config.to_dict()
        differ = [f"{k} {ours.get(k)!r} (the export has {v!r})" for k, v in manifest["config"].items()
                  if k in ours and ours[k] != v and k != "dropout"]
        if differ:
            raise CheckpointError(f"checkpoint {checkpoint} does not match the export {folder}: " + ", ".join(differ))
        return ckpt
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


def validate(folder, checkpoint: str | None = None, provider: str = "auto", atol: float | None = None,
             rtol: float | None = None, steps: int = 20, batch: int = 2, seed: int = 0,
             localize: bool = True, write_summary: bool = True, log=None, min_top1: float | None = None,
             min_tokens: float | None = None, max_drift: float | None = None,
             runtime: str = "onnxruntime") -> Report:
    """Run the three checks; the report is truthy when everything passed.

    `runtime` runs the graphs: onnxruntime, or openvino (`seqexport.runtime.runners`). The layer
    of a failing graph is localised on ONNX Runtime only (`localize` exposes every module's
    output, which changes what OpenVINO fuses): with another runtime a failing graph case says so.

    `log` (e.g. stderr) hears each check as it ends, with its counts and the time taken.
    A quantised export (`seqexport quantize`) is judged by `checks.QuantRule` for its bits:
    `min_top1`, `min_tokens` and `max_drift` override its thresholds.
    """
    log = log or (lambda msg: None)
    started = time.perf_counter()
    folder = Path(folder)
    manifest = read_manifest(folder)
    ckpt = eager_checkpoint(folder, manifest, checkpoint)
    d_atol, d_rtol = DEFAULT_TOLERANCE[manifest["dtype"]]
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    rt = rt_load(folder, provider=provider, manifest=manifest, runtime=runtime)
    on_ort = runtime == "onnxruntime"
    device = "cuda" if rt.provider == "CUDAExecutionProvider" and torch.cuda.is_available() else "cpu"
    model = ckpt.model.to(device).float().eval()
    rng = np.random.default_rng(seed)
    cases = families.get(manifest["family"]).parity.Cases(model, rt, rng, batch, device)
    report = Report(str(folder), manifest["family"], manifest["dtype"], rt.provider, device, atol, rtol,
                    steps, batch, seed, str(ckpt.path), runtime=f"{runtime} {runtime_version(runtime)}")
    log(f"validating {folder} ({manifest['family']}, {manifest['dtype']}) on {'' if on_ort else runtime + ' '}"
        f"{rt.provider} "
        f"against {ckpt.path or 'the preset weights'}")
    int8 = None  # the quantised copy's rule (int8 or int4)
    q = manifest.get("quantization")
    if q:
        int8 = checks.QuantRule.for_bits(q.get("bits", 8), min_top1, min_tokens, max_drift)
        report.rule = (f"{int8.label}: top-1 >= {int8.min_top1:g}, free-running tokens >= {int8.min_tokens:g}, "
                       f"recurrent state drift over steps {drift.DRIFT_STEPS - drift.WINDOW + 1}-{drift.DRIFT_STEPS} "
                       f"<= {int8.max_drift:g}")
    # a float16 export's output past the tolerance is judged again against float16's own error
    float16 = Float16Error(cases) if manifest["dtype"] == "float16" else None
    runs = (("graphs", lambda: _not_localized(
                 checks.graph_cases(rt, cases, rng, atol, rtol, device, localize and on_ort, int8, float16),
                 on_ort or not localize)),
            ("teacher_forced", lambda: [checks.teacher_forced(rt, cases, steps, atol, rtol, rng, int8, float16)]),
            ("free_running", lambda: checks.free_running(rt, cases, steps, atol, rtol, int8)))
    if int8 and drift.recurrent_states(rt):
        runs += (("state_drift", lambda: drift.state_drift(rt, cases, rng, int8.max_drift)),)
    for check, run in runs:
        t = time.perf_counter()
        found = run()
        report.cases += found
        failed = sum(not c.passed for c in found)
        log(f"  {check}: {len(found) - failed}/{len(found)} cases passed ({time.perf_counter() - t:.1f} s)")
    report.seconds = round(time.perf_counter() - started, 2)
    if write_summary:
        summary = {"summary": report.summary(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            update_manifest(folder, parity=summary)
        except OSError as e:  # a read-only artifact still gets its report
            warnings.warn(f"parity summary not written into {folder / MANIFEST}: {e}", stacklevel=2)
    return report


def _not_localized(found: list, localized: bool) -> list:
    """Failing graph cases of a runtime other than ONNX Runtime: why no layer is named."""
    for case in found if not localized else ():
        if not case.passed and not case.note:
            case.note = "layer not localised: localisation runs on ONNX Runtime only (validate --runtime onnxruntime)"
    return found
