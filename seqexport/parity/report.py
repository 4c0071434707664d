"""The parity report: cases grouped by check, judged per output, printable and JSON-ready."""

from dataclasses import dataclass, field

from seqexport.parity.compare import Comparison
from seqexport.parity.localize import Divergence


@dataclass
class Case:
    check: str  # graphs | teacher_forced | free_running | state_drift
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
    rule: str = "float: every element within atol + rtol * |eager|"  # how outputs are judged
    runtime: str = "onnxruntime"  # what ran the graphs, with its release (validate --runtime)

    CHECKS = ("graphs", "teacher_forced", "free_running")
    OPTIONAL = ("state_drift",)  # reported when run (quantised recurrent models)
    # What each check compares ONNX Runtime with (stated in the report).
    REFERENCES = {
        "graphs": "the eager export wrapper each graph was traced from (the model's own "
                  "decode_step / step / forward with the sequential reference scan), on the same inputs",
        "teacher_forced": "the unmodified eager model's full forward over the whole sequence (logits at "
                          "every position); final state: the eager model fed the whole sequence in one call",
        "free_running": "eager greedy decoding with the full forward over the whole prefix at every step",
        "state_drift": "the float32 eager model's recurrent state over the last 16 of the same 256 one-token "
                       "steps; per tensor ||quantised - eager|| / ||eager||, worst row",
    }

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def checks(self) -> tuple[str, ...]:
        """The checks this report holds: the three always, state_drift when it ran."""
        return self.CHECKS + tuple(k for k in self.OPTIONAL if any(c.check == k for c in self.cases))

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
        return {"passed": self.passed, "runtime": self.runtime, "provider": self.provider,
                "eager_device": self.eager_device,
                "atol": self.atol, "rtol": self.rtol, "rule": self.rule, "steps": self.steps,
                "checks": {k: self.check_passed(k) for k in self.checks},
                "failures": self.failures()}

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("folder", "family", "dtype", "runtime", "provider", "eager_device", "atol",
                                           "rtol", "rule", "steps", "batch", "seed", "checkpoint", "seconds")}
        d["passed"] = self.passed
        d["checks"] = {k: {"passed": self.check_passed(k), "reference": self.REFERENCES[k],
                           "cases": [c.to_dict() for c in self.cases if c.check == k]} for k in self.checks}
        d["failures"] = self.failures()
        return d

    def table(self) -> str:
        runs = "ORT" if self.runtime.startswith("onnxruntime") else self.runtime
        lines = [f"parity of {self.folder} ({self.family}, {self.dtype}) · {runs} {self.provider} vs eager "
                 f"{self.eager_device} · atol {self.atol:g} rtol {self.rtol:g} · {self.rule}"]
        for check in self.checks:
            lines.append(f"{check}: {'PASS' if self.check_passed(check) else 'FAIL'} "
                         f"(reference: {self.REFERENCES[check]})")
            for c in (c for c in self.cases if c.check == check):
                worst = max(c.outputs, key=lambda o: o.needed_atol, default=None)
                detail = (f"max abs {worst.max_abs:.2e} (worst {worst.name}, needs atol {worst.needed_atol:.1e})"
                          if worst is not None else "")
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
