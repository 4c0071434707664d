"""Feeds checked against a graph's spec before any runtime sees them, for every runner.

A runner (`Graph` for ONNX Runtime, `runners.openvino.OpenVINOGraph`) subclasses `CheckedGraph`
and calls `check(feeds)` first: inputs of the wrong rank, shape or dtype, and symbolic dims that
disagree between inputs (e.g. a batch of 2 tokens with a state of batch 3), are refused with one
message naming the input, whatever runs the graph.
"""

from pathlib import Path

import numpy as np

from seqexport.errors import InputError
from seqexport.specs import GraphSpec
from seqexport.state.arrays import NP_DTYPES, shape_and_dtype


class CheckedGraph:
    """A graph's spec and the input checks every runner makes; subclasses add `run(feeds)`."""

    def __init__(self, path: Path, spec: GraphSpec):
        self.spec = spec
        self.path = Path(path)
        # What check() compares against, prepared once: a decode step is a hot path.
        self._expected = [(t.name, np.dtype(NP_DTYPES[t.dtype]), t.dims) for t in spec.inputs]
        self._order = [t.name for t in spec.inputs]
        self._names = frozenset(spec.input_names)
        # (shape, dtype) of every input, in spec order, of feeds that passed: whether feeds
        # pass depends on nothing else, and a decode feeds the same ones step after step
        self._passed: set[tuple] = set()

    def check(self, feeds: dict) -> bool:
        """Check feeds against the spec (fast); on any mismatch `explain` raises the message.
        Returns whether every feed is a numpy array."""
        if feeds.keys() != self._names:
            self.explain(feeds)
        try:  # numpy arrays whose shapes and dtypes passed before: the decode loop's case
            key = tuple([(a.shape, a.dtype) for a in map(feeds.__getitem__, self._order)])
            if key in self._passed:
                return True
        except (AttributeError, TypeError):  # an OrtValue or not an array: checked below
            key = None
        self._check_each(feeds)
        if key is None or not all(type(a) is np.ndarray for a in feeds.values()):
            return False
        if len(self._passed) > 256:  # e.g. a long decode's growing cache: keep it small
            self._passed.clear()
        self._passed.add(key)
        return True

    def _check_each(self, feeds: dict) -> None:
        sizes: dict[str, int] = {}
        for name, dtype, dims in self._expected:
            a = feeds[name]
            if type(a) is np.ndarray:
                if a.dtype != dtype or a.ndim != len(dims):
                    self.explain(feeds)
                shape = a.shape
            else:
                shape, dt = shape_and_dtype(name, a)
                if dt != dtype.name or len(shape) != len(dims):
                    self.explain(feeds)
            for size, dim in zip(shape, dims):
                if type(dim) is int:
                    if size != dim:
                        self.explain(feeds)
                elif sizes.setdefault(dim, size) != size:
                    self.explain(feeds)

    def explain(self, feeds: dict) -> None:
        """Raise an InputError naming the input, what was given and what was expected."""
        sizes: dict[str, tuple[int, str]] = {}
        missing = [n for n in self.spec.input_names if n not in feeds]
        if missing:
            raise InputError(f"{self.spec.name}: missing inputs {missing}")
        extra = sorted(set(feeds) - set(self.spec.input_names))
        if extra:
            raise InputError(f"{self.spec.name}: unknown inputs {extra}; expected {self.spec.input_names}")
        for t in self.spec.inputs:
            shape, dtype = shape_and_dtype(t.name, feeds[t.name])
            if dtype != t.dtype:
                raise InputError(f"{t.name}: dtype {dtype} given, {t.dtype} expected")
            if len(shape) != len(t.dims):
                raise InputError(f"{t.name}: shape {shape} has rank {len(shape)}, expected rank {len(t.dims)} {list(t.dims)}")
            for axis, (size, dim) in enumerate(zip(shape, t.dims)):
                if isinstance(dim, int):
                    if size != dim:
                        raise InputError(f"{t.name}: shape {shape}, expected {dim} on axis {axis} ({list(t.dims)})")
                elif dim in sizes and sizes[dim][0] != size:
                    other_size, other = sizes[dim]
                    raise InputError(
                        f"{t.name}: {dim} = {size} on axis {axis}, but {other} has {dim} = {other_size}"
                    )
                else:
                    sizes.setdefault(dim, (size, t.name))
        raise InputError(f"{self.spec.name}: inputs do not match the graph spec")  # not reached
