"""Seeded inputs for a graph, built from its spec alone (as Polygraphy's data loader does):
token ids within the spec's vocabulary, 0/1 masks (later rows padded), random states.
Export traces with them, validate and bench feed them. numpy only."""

import numpy as np

from seqexport.runtime.session import NP_DTYPES
from seqexport.specs import GraphSpec


def shape_of(dims, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[d] if isinstance(d, str) else d for d in dims)


def random_inputs(spec: GraphSpec, sizes: dict[str, int], rng: np.random.Generator, *, pad_rows: bool = True,
                  state_scale: float = 1.0, zero_state: bool = False) -> dict[str, np.ndarray]:
    """One array per input of `spec`; `sizes` gives every symbolic dim (batch, src_len, ...).

    Token ids are drawn from [1, vocab_size) (0 is the transformer's pad id); with `pad_rows`,
    row r of a mask hides its last 2r positions (at least one stays visible) and row r of a
    lengths input counts 3r fewer valid slots than past_len (at least 0); states are
    standard normal times `state_scale`, or zeros (a fresh sequence).
    """
    out = {}
    for t in spec.inputs:
        shape = shape_of(t.dims, sizes)
        if t.role == "tokens":
            out[t.name] = rng.integers(min(1, t.vocab_size - 1), t.vocab_size, shape).astype(np.int64)
        elif t.role == "mask":
            mask = np.ones(shape, np.int64)  # (b, length)
            if pad_rows:
                for r in range(1, shape[0]):
                    mask[r, max(1, shape[1] - 2 * r):] = 0
            out[t.name] = mask
        elif t.role == "lengths":  # valid slots per row: all of past_len, later rows 3r fewer (pad_rows)
            past = sizes["past_len"]
            rows = np.arange(shape[0])
            out[t.name] = np.maximum(past - 3 * rows, 0).astype(np.int64) if pad_rows else np.full(shape, past, np.int64)
        elif t.role == "keep":  # every position's logits: what validate compares
            out[t.name] = np.zeros(shape, np.int64)
        elif zero_state:
            out[t.name] = np.zeros(shape, NP_DTYPES[t.dtype])
        else:
            out[t.name] = (rng.standard_normal(shape) * state_scale).astype(NP_DTYPES[t.dtype])
    return out
