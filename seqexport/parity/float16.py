"""float16's own error: how far the eager model itself lands from its float32 self when run in
float16, on a case's inputs. A float16 export's output beyond validate's float16 tolerance is
judged again against that error, within FACTOR of it.

Why: rounding to float16's 10-bit mantissa grows with a model's depth and a sequence's length,
and no fixed atol suits every model. The bundled hybrid's float16 export needs atol 0.021
(tolerance 0.02) on one key of its 256-token prefill, and so does the eager model in float16,
to the same figure: the export is as exact as float16 allows, and failing it said nothing. A
damaged weight moves an output far past twice float16's own error, so it still fails.
"""

import copy
from collections.abc import Callable

import numpy as np
import torch

from seqexport.export.common import model_in_dtype
from seqexport.parity.compare import compare

FACTOR = 2.0  # the export may err up to twice what float16 itself does (measured: at most 1x)


class Float16Error:
    """The eager model converted to float16 as the export converts it (a copy, made on first
    use), run on a case's inputs: a graph's export wrapper, or the decode's eager model."""

    def __init__(self, cases):
        self._cases, self._half = cases, None

    def _half_cases(self):
        if self._half is None:  # the family's cases over the float16 copy (its rng and sources shared)
            self._half = copy.copy(self._cases)
            self._half.model = model_in_dtype(self._cases.model, "float16")
        return self._half

    def graph(self, graph: str, spec, feeds: dict, device) -> dict[str, np.ndarray]:
        """The graph's outputs from its export wrapper over the float16 model, on the graph's
        own inputs (float16 where it takes float16, as the export traced it)."""
        inputs = tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])).to(device) for n in spec.input_names)
        with torch.no_grad():
            outs = self._half_cases().wrapper(graph)(*inputs)
        return {n: o.detach().float().cpu().numpy() for n, o in zip(spec.output_names, outs)}

    def decode(self, tokens: np.ndarray, start: tuple) -> tuple[np.ndarray, dict]:
        """The float16 model's logits at every position (its full forward) and its state after
        the whole sequence in one call: the teacher-forced check's two references."""
        cases = self._half_cases()
        full, cached = cases.eager(cache=False), cases.eager(cache=True)
        logits, _ = full.step(tokens, full.start(*start))
        _, state = cached.step(tokens, cached.start(*start))
        return logits, state.arrays

    def rejudge(self, case, got: dict, ref: dict, own: Callable[[], dict], atol: float, rtol: float) -> None:
        """Judge `case`'s failing outputs again within FACTOR x float16's own error (`own()`: the
        float16 model's outputs, by comparison name; never tighter than `atol`), and say so in
        its note; an output still failing is named with both figures."""
        try:
            half = own()
        except Exception as e:  # an op without a float16 kernel here, or an eager path that takes float32 only
            case.note = f"float16's own error not measured (the eager model in float16 failed: {e})"
            return
        failing = [i for i, o in enumerate(case.outputs) if not o.passed]
        needs = {}
        for i in failing:
            name = case.outputs[i].name
            needs[name] = compare(name, half[name], ref[name], 0.0, rtol).needed_atol
            case.outputs[i] = compare(name, got[name], ref[name], max(atol, FACTOR * needs[name]), rtol)
        figures = ", ".join(f"{need:.3g} on {name}" for name, need in needs.items())
        still = [case.outputs[i].name for i in failing if not case.outputs[i].passed]
        if still:
            case.note = (f"beyond {FACTOR:g}x float16's own error: {', '.join(still)} (the eager model in "
                         f"float16 needs atol {figures})")
        else:
            case.note = (f"float16's own error: the eager model in float16 needs atol {figures}; "
                         f"the export is within {FACTOR:g}x of it")
