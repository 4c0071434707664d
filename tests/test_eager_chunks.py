"""The eager model behind the runtime's step API (the one eager decoder bench, the demo and
training evaluation drive): with its cache, a prompt fed in chunks — each chunk from the state the
last one left — gives the logits the no-cache reference gives over the whole prompt at once."""

import numpy as np
import pytest
import torch

from seqexport import families
from seqexport.checkpoints import build_preset

FAMILIES = ["mamba", "mamba2", "rwkv", "hybrid"]


def eager_pair(family: str):
    """(the eager model with its cache, the no-cache reference, vocab size) of a tiny random preset."""
    torch.manual_seed(0)
    model = build_preset(family, "tiny", seed=0).model
    eager = families.get(family).eager.Eager
    return eager(model, cache=True), eager(model, cache=False), model.config.vocab_size


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_fed_in_chunks_equals_the_whole_prompt_at_once(family):
    cached, reference, vocab = eager_pair(family)
    ids = np.random.default_rng(0).integers(1, vocab, (2, 11))  # (b, l)
    state, got = cached.start(2), []
    for chunk in (ids[:, :4], ids[:, 4:5], ids[:, 5:]):  # several tokens, one, several: from a used state
        logits, state = cached.step(chunk, state)
        got.append(logits.reshape(2, chunk.shape[1], -1))  # one token comes back (b, v)
    want, _ = reference.step(ids, reference.start(2))  # (b, l, v)
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_prompts_of_unequal_length_begin_together_as_each_alone(family):
    """`begin` on the eager model with prompts of 1, 3 and 7 tokens (right-padded where the family
    prefills rows together): each row's logits are the reference's after that prompt alone."""
    cached, reference, vocab = eager_pair(family)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, vocab, n).tolist() for n in (3, 7, 1)]
    logits, _ = cached.begin(prompts)  # (k, v)
    for row, prompt in zip(logits, prompts, strict=True):
        want, _ = reference.step(np.array([prompt]), reference.start(1))  # (1, l, v)
        np.testing.assert_allclose(row, want[0, -1], rtol=1e-4, atol=1e-4)
