"""`seqexport validate DIR --reference CHECKPOINT` for a folder another tool made: the adapter's
map (or --io-map's), the artifact run through a runner, judged against transformers' model.

    report = validate_foreign("optimum-marian", "tiny-marian")
    assert report.passed, report.summary()
"""

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqexport.foreign import checks
from seqexport.foreign.adapters import choose
from seqexport.foreign.decode import ForeignModel
from seqexport.foreign.reference import Reference
from seqexport.parity.checks import QuantRule
from seqexport.parity.compare import DEFAULT_TOLERANCE
from seqexport.parity.report import Report


@dataclass
class ForeignReport(Report):
    """Our report, for an artifact whose graphs we did not trace: no graphs check (there is no
    export wrapper to run them against), the two decodes against transformers."""

    adapter: str = ""
    CHECKS = ("teacher_forced", "free_running")
    REFERENCES = Report.REFERENCES | {
        "teacher_forced": "transformers' model from --reference: one full forward over the whole sequence "
                          "without cache (logits at every position); final state: its cache after the whole "
                          "sequence in one call, compared through the adapter's layout",
        "free_running": "transformers' greedy decoding with a full forward over the whole prefix at every step",
    }
    roles: dict | None = None  # the adapter's map (ModelMap.to_dict)

    def to_dict(self) -> dict:
        return super().to_dict() | {"adapter": self.adapter, "map": self.roles}


def validate_foreign(folder, reference, io_map=None, runtime: str = "onnxruntime", provider: str = "auto",
                     atol: float | None = None, rtol: float | None = None, steps: int = 20, batch: int = 2,
                     seed: int = 0, log=None, min_top1: float | None = None,
                     min_tokens: float | None = None) -> ForeignReport:
    log = log or (lambda msg: None)
    started = time.perf_counter()
    folder = Path(folder)
    model_map = choose(folder, io_map)
    ref = Reference.load(reference)
    model = ForeignModel(folder, model_map, runtime, provider)
    d_atol, d_rtol = DEFAULT_TOLERANCE.get(model.dtype, DEFAULT_TOLERANCE["float32"])
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    quant = QuantRule.for_bits(model.quant_bits, min_top1, min_tokens) if model.quant_bits else None
    dtype = quant.label if quant else model.dtype
    from seqexport.runtime.runners import runtime_version

    report = ForeignReport(str(folder), f"{model_map.adapter}: {type(ref.model).__name__}", dtype, model.provider,
                           "cpu", atol, rtol, steps, batch, seed, str(ref.path), adapter=model_map.adapter,
                           roles=model_map.to_dict())
    report.runtime = f"{runtime} {runtime_version(runtime)}"
    if quant:
        report.rule = (f"{quant.label}: top-1 >= {quant.min_top1:g}, free-running picks on the artifact's own "
                       f"prefix >= {quant.min_tokens:g}; figures reported, not judged")
    log(f"validating {folder} (adapter {model_map.adapter}, {dtype}) on {runtime} {model.provider} "
        f"against {type(ref.model).__name__} from {ref.path}")
    rng = np.random.default_rng(seed)
    for check, run in (("teacher_forced", lambda: [checks.teacher_forced(model, ref, rng, steps, batch, atol,
                                                                         rtol, quant)]),
                       ("free_running", lambda: checks.free_running(model, ref, rng, steps, batch, atol, rtol,
                                                                    quant))):
        t = time.perf_counter()
        found = run()
        report.cases += found
        log(f"  {check}: {sum(c.passed for c in found)}/{len(found)} cases passed ({time.perf_counter() - t:.1f} s)")
    report.seconds = round(time.perf_counter() - started, 2)
    return report
