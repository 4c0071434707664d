"""Prompts of unequal length in one prefill run (seqexport.export.ragged): right-padded rows
with an attention mask. Each row's logits after its own last token and its state after its
own tokens must be those of the unmodified eager model's full forward over that prompt alone,
and the whole batch must take one prefill run (one-token prompts: one step run)."""

import collections

import numpy as np
import pytest
import torch

import seqexport.runtime as rt
from seqexport.specs import ATTENTION_MASK, INPUT_IDS, LOGITS, LOGITS_TO_KEEP

LENGTHS = (5, 1, 17, 2, 9, 33, 16, 1, 9)


@pytest.fixture(params=["mamba-loop", "mamba-parallel", "rwkv"])
def exported(request, mamba_exports):
    if request.param == "rwkv":
        return request.getfixturevalue("rwkv_tiny")
    return mamba_exports(request.param.split("-")[1])


def prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, n).tolist() for n in LENGTHS]


def eager_alone(model, prompt: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The eager model's full forward over one prompt: its last logits (v,) and its state,
    flattened in the graphs' order (per layer, as the model returns them)."""
    with torch.no_grad():
        logits, state = model(torch.tensor([prompt]))
    return logits[0, -1].numpy(), [t[0].float().numpy() for layer in state for t in layer]


def test_rows_of_unequal_length_are_each_the_eager_prompt_alone(exported):
    ckpt, folder = exported
    model = rt.load(folder, provider="cpu", threads=1)
    assert model.ragged_prefill
    runs = collections.Counter()
    run = model._run
    model._run = lambda graph, feeds: (runs.update([graph]), run(graph, feeds))[1]
    rows = prompts(model.vocab_size)
    logits, state = model.begin(rows)
    assert runs == {"prefill": 1, "step": 1}  # every prompt of 2+ tokens in one run
    names = [t.name for t in model.specs["step"].state_inputs]
    for i, row in enumerate(rows):
        want_logits, want_state = eager_alone(ckpt.model.eval(), row)
        np.testing.assert_allclose(logits[i], want_logits, atol=1e-4, rtol=1e-4, err_msg=f"row {i}, {len(row)} tokens")
        for name, want in zip(names, want_state, strict=True):
            np.testing.assert_allclose(state.arrays[name][i], want, atol=1e-4, rtol=1e-4,
                                       err_msg=f"row {i} ({len(row)} tokens): {name}")


def test_a_padded_row_continues_as_the_prompt_alone(exported):
    """A row's state after the ragged run, stepped on, gives the eager model's logits: the
    padding past its end left the state exactly as its own tokens made it."""
    ckpt, folder = exported
    model = rt.load(folder, provider="cpu", threads=1)
    rows = prompts(model.vocab_size, seed=1)
    _, state = model.begin(rows)
    more = np.random.default_rng(2).integers(1, model.vocab_size, len(rows))  # (b,) one token each
    logits, _ = model.step(more, state)
    for i, row in enumerate(rows):
        want, _ = eager_alone(ckpt.model.eval(), [*row, int(more[i])])
        np.testing.assert_allclose(logits[i], want, atol=1e-4, rtol=1e-4, err_msg=f"row {i}, {len(row)} tokens")


def test_the_graph_keeps_each_rows_last_positions(exported):
    """The prefill graph itself: logits_to_keep N gives each row's own last N tokens' logits."""
    ckpt, folder = exported
    model = rt.load(folder, provider="cpu", threads=1)
    rows = [r for r in prompts(model.vocab_size, seed=3) if len(r) >= 3][:4]
    longest = max(map(len, rows))
    ids = np.zeros((len(rows), longest), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    out = model.graphs["prefill"].run({INPUT_IDS: ids, ATTENTION_MASK: mask, **model.start(len(rows)).arrays,
                                       LOGITS_TO_KEEP: np.array([3], np.int64)})
    assert out[LOGITS].shape == (len(rows), 3, model.vocab_size)
    for i, r in enumerate(rows):
        with torch.no_grad():
            want, _ = ckpt.model.eval()(torch.tensor([r]))  # (1, len, v)
        np.testing.assert_allclose(out[LOGITS][i], want[0, -3:].numpy(), atol=1e-4, rtol=1e-4)


def test_generate_over_unequal_prompts_gives_each_its_tokens_alone(exported):
    _, folder = exported
    model = rt.load(folder, provider="cpu", threads=1)
    rows = prompts(model.vocab_size, seed=5)
    options = rt.SearchOptions(max_new_tokens=8, eos_id=-1)
    together = rt.generate(model, rows, options)
    assert [list(t) for t in together] == [list(rt.generate(model, [r], options)[0]) for r in rows]
