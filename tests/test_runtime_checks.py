"""The runtime's input check on the decode hot path (`Graph.check` remembers the shapes and
dtypes that passed): a decode still matches the eager model step after step, and inputs that
differ from what passed before (a dtype, a rank, a batch that disagrees, a name, an OrtValue)
are still refused, or run, exactly as without the memory."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
from seqexport.models.transformer import generate_mask, padding_mask

import seqexport.runtime as rt
from seqexport.errors import InputError


@pytest.fixture(scope="module")
def tiny(transformer_tiny):
    ckpt, out = transformer_tiny
    return ckpt.model, rt.load(out, provider="cpu", threads=1)


def test_a_remembered_decode_matches_eager_greedy(tiny):
    model, m = tiny
    src = np.array([[5, 6, 7, 8, 2]])
    state = m.start(src)
    tok, got = np.array([1]), []
    for _ in range(8):  # every step after the first passes check() from its memory
        logits, state = m.step(tok, state)
        tok = logits.argmax(-1)
        got.append(int(tok[0]))
    with torch.no_grad():  # the unmodified eager model, full forward over the prefix each step
        ids = [1]
        for _ in range(8):
            out = model(torch.tensor(src), torch.tensor([ids]), src_mask=padding_mask(torch.tensor(src)),
                        tgt_mask=generate_mask(len(ids)))
            ids.append(int(out[0, -1].argmax()))
    assert got == ids[1:]


@pytest.mark.parametrize("corrupt, message", [
    (lambda a: a.astype(np.float64), "dtype float64 given, float32 expected"),
    (lambda a: a[0], "has rank 3, expected rank 4"),
    (lambda a: np.concatenate([a, a]), "batch = 2"),
    (lambda a: a.tolist(), "expected a numpy array, got list"),
])
def test_feeds_unlike_those_that_passed_are_still_refused(tiny, corrupt, message):
    _, m = tiny
    g = m.graphs["decoder"]
    state = m.start(np.array([[5, 6, 2]]))
    _, state = m.step(np.array([1]), state)
    feeds = {"input_ids": np.array([[4]]), **state.arrays}
    g.run(dict(feeds))  # passes, and is remembered
    g.run(dict(feeds))
    name = "past_key_values.0.decoder.key"
    with pytest.raises(InputError, match=message):
        g.run(feeds | {name: corrupt(feeds[name])})
    with pytest.raises(InputError, match="missing inputs"):
        g.run({k: v for k, v in feeds.items() if k != name})


def test_ortvalue_feeds_run_and_equal_numpy_feeds(tiny):
    _, m = tiny
    g = m.graphs["decoder"]
    state = m.start(np.array([[5, 6, 2]]))
    feeds = {"input_ids": np.array([[1]]), **state.arrays}
    want = g.run(dict(feeds))
    got = g.run({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
