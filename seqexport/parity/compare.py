"""Elementwise comparison of an ONNX Runtime output with its eager reference.

Pass rule, per element: |ort - eager| <= atol + rtol * |eager|. NaN or Inf on
either side is a failure. Each result carries max abs, max rel and mean abs
error and the smallest atol that would pass at the given rtol.
"""

from dataclasses import asdict, dataclass

import numpy as np

# (atol, rtol) by export dtype
DEFAULT_TOLERANCE = {"float32": (1e-4, 1e-3), "float16": (2e-2, 2e-2)}


@dataclass(frozen=True)
class Comparison:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    mean_abs: float
    needed_atol: float  # smallest atol that passes at this rtol
    nonfinite: int  # NaN/Inf elements on either side
    passed: bool

    def __bool__(self) -> bool:
        return self.passed

    def to_dict(self) -> dict:
        return asdict(self) | {"shape": list(self.shape)}


def compare(name: str, got, ref, atol: float, rtol: float) -> Comparison:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return Comparison(name, tuple(got.shape), float("inf"), float("inf"), float("inf"), float("inf"), 0, False)
    bad = ~np.isfinite(got) | ~np.isfinite(ref)
    nonfinite = int(bad.sum())
    if got.size == 0:
        return Comparison(name, got.shape, 0.0, 0.0, 0.0, 0.0, 0, True)
    diff = np.where(bad, 0.0, np.abs(got - ref))
    mag = np.where(bad, 0.0, np.abs(ref))
    needed = float(np.max(np.maximum(diff - rtol * mag, 0.0)))
    rel = diff / np.maximum(mag, 1e-12)
    passed = nonfinite == 0 and bool(np.all(diff <= atol + rtol * mag))
    return Comparison(name, tuple(got.shape), float(diff.max()), float(rel.max()), float(diff.mean()),
                      needed, nonfinite, passed)
