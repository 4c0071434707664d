"""Sampling and beam search against references computed here, independently of the runtime.

Sampling: `pick_tokens` draws N seeded samples from a batch of N identical logit rows; the
empirical frequencies are compared with the distribution the options define, written out
below in float64 (softmax(z / T), top-k, top-p, min-p, renormalised).

Beam search: on a transformer whose target vocabulary is so small that every hypothesis of
at most L tokens can be listed, each hypothesis is scored with the eager model's full
forward, and a beam search wide enough to be exhaustive must return the best of them.
"""

import itertools

import numpy as np
import pytest
import torch
from seqexport.models.transformer import Transformer, TransformerConfig, generate_mask, padding_mask

import seqexport.runtime as rt
from seqexport.checkpoints.io import load_checkpoint, save_checkpoint
from seqexport.export import export_model
from seqexport.runtime.generate import SearchOptions, beam_search, pick_tokens

# --------------------------------------------------------------------------- sampling

N = 20_000  # samples per distribution
# Distinct logits (no ties), not in sorted order, so that a sort or an index mix-up shows.
LOGITS = np.array([0.3, 2.1, -1.0, 1.2, 0.0, 1.7, -0.4, 0.8])


def reference(z, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The sampling distribution, in float64: softmax(z / T); top-k keeps the k largest;
    top-p then keeps the smallest set of most likely tokens whose probability reaches p (the
    most likely token always); min-p then keeps those at least min_p x the most likely one's
    probability; what is kept is renormalised."""
    z = np.asarray(z, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.ones(len(p), bool)
    if top_k:
        keep[:] = False
        keep[order[:top_k]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if top_p < 1.0:
        cum = np.cumsum(p[order])
        # not near a boundary, so the reference cannot hinge on rounding
        assert np.min(np.abs(cum - top_p)) > 1e-3, "choose another top_p"
        n_keep = int(np.searchsorted(cum, top_p)) + 1  # first prefix whose sum reaches p
        kept = np.zeros(len(p), bool)
        kept[order[:n_keep]] = True
        p = np.where(kept, p, 0.0)
        p /= p.sum()
    if min_p > 0:
        ratio = p / p.max()
        assert np.min(np.abs(ratio - min_p)) > 1e-3, "choose another min_p"
        p = np.where(ratio >= min_p, p, 0.0)
        p /= p.sum()
    return p


def tolerance(p: np.ndarray, n: int = N) -> np.ndarray:
    """Four binomial standard deviations plus 1e-3, per token."""
    return 4 * np.sqrt(p * (1 - p) / n) + 1e-3


def frequencies(rows: np.ndarray, options: SearchOptions, seed: int) -> np.ndarray:
    tokens = pick_tokens(rows, options, np.random.default_rng(seed))
    assert tokens.shape == (rows.shape[0],)
    return np.bincount(tokens, minlength=rows.shape[1]) / rows.shape[0]


def check_sampling(z, options: SearchOptions, seed: int = 0) -> np.ndarray:
    expected = reference(z, options.temperature, options.top_k, options.top_p, options.min_p)
    rows = np.tile(np.asarray(z, np.float32), (N, 1))
    freq = frequencies(rows, options, seed)
    dropped = expected == 0
    assert (freq[dropped] == 0).all(), f"tokens outside the kept set drawn: {np.flatnonzero(freq * dropped)}"
    bad = np.abs(freq - expected) > tolerance(expected)
    assert not bad.any(), f"frequencies {freq.round(4)} vs expected {expected.round(4)}"
    return expected


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_reshapes_the_distribution(temperature):
    opts = SearchOptions(do_sample=True, temperature=temperature, seed=0)
    expected = check_sampling(LOGITS, opts, seed=1)
    # the test can tell: at T=1 some token's probability is far outside the tolerance
    assert np.max(np.abs(reference(LOGITS) - expected) - tolerance(expected)) > 0.05


def test_plain_sampling_is_the_softmax():
    check_sampling(LOGITS, SearchOptions(do_sample=True), seed=2)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_keeps_exactly_k(k):
    expected = check_sampling(LOGITS, SearchOptions(do_sample=True, top_k=k), seed=3)
    assert (expected > 0).sum() == k
    assert expected[expected > 0].min() > 0.01  # each kept token is drawn often: k - 1 would show


@pytest.mark.parametrize("top_p", [0.55, 0.8, 0.97])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p):
    expected = check_sampling(LOGITS, SearchOptions(do_sample=True, top_p=top_p), seed=4)
    assert 1 < (expected > 0).sum() < len(LOGITS)  # something cut, something kept besides the top


def test_top_p_below_the_top_probability_keeps_only_the_top():
    expected = check_sampling(LOGITS, SearchOptions(do_sample=True, top_p=0.05), seed=5)
    assert expected[int(np.argmax(LOGITS))] == 1.0


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.8, 5, 0.9), (1.3, 6, 0.9), (2.5, 6, 0.85)])
def test_temperature_top_k_top_p_together(temperature, top_k, top_p):
    opts = SearchOptions(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    expected = check_sampling(LOGITS, opts, seed=6)
    # each filter matters here: without temperature, top-k or top-p the distribution differs
    for other in (reference(LOGITS, 1.0, top_k, top_p), reference(LOGITS, temperature, 0, top_p),
                  reference(LOGITS, temperature, top_k, 1.0)):
        assert np.max(np.abs(other - expected) - tolerance(expected)) > 0.01


@pytest.mark.parametrize("temperature, top_k, min_p", [(1.0, 0, 0.3), (2.0, 6, 0.45), (0.7, 0, 0.1)])
def test_min_p_keeps_the_tokens_within_its_share_of_the_most_likely(temperature, top_k, min_p):
    opts = SearchOptions(do_sample=True, temperature=temperature, top_k=top_k, min_p=min_p)
    expected = check_sampling(LOGITS, opts, seed=7)
    assert 1 < (expected > 0).sum() < len(LOGITS)  # something cut, something kept besides the top
    without = reference(LOGITS, temperature, top_k)
    assert np.max(np.abs(without - expected) - tolerance(expected)) > 0.01  # min-p matters here


def test_rows_of_a_batch_are_sampled_from_their_own_logits():
    """Two different rows interleaved in one batch: each half follows its own distribution."""
    other = LOGITS[::-1] * 1.5 + np.arange(8) * 0.1
    rows = np.empty((2 * N, 8), np.float32)
    rows[0::2], rows[1::2] = LOGITS, other
    opts = SearchOptions(do_sample=True, temperature=0.8, top_k=5, top_p=0.9)
    tokens = pick_tokens(rows, opts, np.random.default_rng(7))
    for z, drawn in ((LOGITS, tokens[0::2]), (other, tokens[1::2])):
        expected = reference(z, 0.8, 5, 0.9)
        freq = np.bincount(drawn, minlength=8) / N
        assert (freq[expected == 0] == 0).all()
        assert (np.abs(freq - expected) <= tolerance(expected)).all(), (freq.round(4), expected.round(4))


def test_greedy_is_the_argmax_of_each_row():
    rows = np.random.default_rng(8).normal(size=(50, 11)).astype(np.float32)
    got = pick_tokens(rows, SearchOptions(), np.random.default_rng(0))
    assert got.tolist() == [int(np.argmax(r)) for r in rows]


def test_same_seed_same_draws():
    rows = np.tile(LOGITS, (200, 1))
    opts = SearchOptions(do_sample=True, temperature=1.3)
    a = pick_tokens(rows, opts, np.random.default_rng(11))
    b = pick_tokens(rows, opts, np.random.default_rng(11))
    c = pick_tokens(rows, opts, np.random.default_rng(12))
    assert (a == b).all() and (a != c).any()


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 0), (0.9, 40), (1.2, 50_000)])
def test_a_large_vocabulary_draws_what_numpys_own_choice_draws_seed_for_seed(temperature, top_k):
    """A 50,000-token row: the same tokens, draw for draw, as `Generator.choice(v, p=...)` on the
    distribution written out in `reference` (the draw is choice's inverse CDF, without its
    checks; the k-th largest logit comes from a partition instead of a sort)."""
    rng = np.random.default_rng(20)
    rows = (rng.standard_normal((40, 50_000)) * 3).astype(np.float32)
    opts = SearchOptions(do_sample=True, temperature=temperature, top_k=top_k)
    got = [int(pick_tokens(row[None], opts, np.random.default_rng(i))[0]) for i, row in enumerate(rows)]
    want = [int(np.random.default_rng(i).choice(row.size, p=reference(row, temperature, top_k)))
            for i, row in enumerate(rows)]
    assert got == want


@pytest.mark.parametrize("spread", [0.05, 1.0, 4.0])  # near-uniform (most tokens kept) .. peaked (a few)
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_over_a_large_vocabulary_keeps_what_a_full_sort_keeps(spread, top_p):
    """Top-p sorts only the most likely tokens, more of them until the cut falls inside: the kept
    set is the one a sort of the whole row gives (its smallest prefix whose sum reaches p)."""
    from seqexport.runtime.generate import _nucleus

    rng = np.random.default_rng(21)
    z = rng.standard_normal(5000) * spread
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
    want = np.zeros(p.size, bool)
    want[order[:n_keep]] = True
    got = _nucleus(p, top_p)
    assert ((got > 0) == want).all(), (int((got > 0).sum()), n_keep)
    assert np.allclose(got[want], p[want] / p[want].sum(), rtol=1e-12)


# ------------------------------------------------------------------------ beam search

V = 5  # target vocabulary
EOS, START = 2, 1
PROMPTS = [[3, 5, 7], [1, 6], [4, 4, 2, 6, 7], [7], [2, 3], [6, 6, 6], [5, 1, 3, 7]]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on one torch thread: on a busy 2-core machine two threads run much slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_tf(tmp_path_factory):
    """(eager model, runtime model) of a transformer with a 5-token target vocabulary."""
    config = TransformerConfig(src_vocab_size=8, tgt_vocab_size=V, d_model=16, n_heads=2, d_ff=32,
                               num_layers=1, max_len=16)
    torch.manual_seed(2)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.decoder.fc_out.weight.mul_(3.0)  # sharper next-token distributions: scores far apart
        model.decoder.fc_out.bias[EOS] -= 0.5  # eos less often first: not every best is empty
        attn = model.decoder.layers[0].self_attn  # the past tokens matter: a cache of the wrong
        for lin in (attn.W_q, attn.W_k, attn.W_v):  # hypothesis (beams not reordered) shows
            lin.weight.mul_(3.0)
    folder = tmp_path_factory.mktemp("beam")
    ckpt = load_checkpoint(save_checkpoint(model, config, "transformer", folder / "ckpt"))
    export_model(ckpt, None, folder / "export")
    return ckpt.model, rt.load(folder / "export", provider="cpu", threads=1)


def hypotheses(max_len: int) -> list[list[int]]:
    """Every output beam search can return: non-eos tokens, ended by eos (not part of the
    output) before max_len tokens, or max_len tokens long."""
    tokens = [t for t in range(V) if t != EOS]
    return [list(h) for n in range(max_len + 1) for h in itertools.product(tokens, repeat=n)]


def eager_scores(model, src: list[int], hyps: list[list[int]], max_len: int, length_penalty: float):
    """sum(log p) of each hypothesis (its tokens, plus eos when shorter than max_len) from the
    eager model's full forward, divided by (number of scored tokens) ** length_penalty."""
    tgt = torch.tensor([[START] + h + [0] * (max_len - len(h)) for h in hyps])  # padding: after, unseen
    s = torch.tensor([src] * len(hyps))
    with torch.no_grad():
        logits = model(s, tgt, src_mask=padding_mask(s), tgt_mask=generate_mask(tgt.shape[1]),
                       memory_mask=padding_mask(s))
    logp = torch.log_softmax(logits.double(), -1).numpy()  # (n, max_len + 1, v)
    scored = [h + ([EOS] if len(h) < max_len else []) for h in hyps]  # the tokens whose log p count
    ids = np.array([t + [0] * (max_len + 1 - len(t)) for t in scored])
    counted = np.array([[j < len(t) for j in range(max_len + 1)] for t in scored])
    picked = np.take_along_axis(logp, ids[:, :, None], -1)[:, :, 0]
    total = np.where(counted, picked, 0.0).sum(-1)
    return total / counted.sum(-1) ** length_penalty


def eager_greedy(model, src: list[int], max_len: int) -> list[int]:
    out = []
    s = torch.tensor([src])
    with torch.no_grad():
        for _ in range(max_len):
            tgt = torch.tensor([[START] + out])
            logits = model(s, tgt, src_mask=padding_mask(s), tgt_mask=generate_mask(tgt.shape[1]),
                           memory_mask=padding_mask(s))
            tok = int(logits[0, -1].argmax())
            if tok == EOS:
                break
            out.append(tok)
    return out


@pytest.mark.parametrize("max_len", [3, 4])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_exhaustive_beam_search_finds_the_best_hypothesis(tiny_tf, max_len, length_penalty):
    model, m = tiny_tf
    hyps = hypotheses(max_len)
    # V ** max_len beams hold every live hypothesis at every step: the search is exhaustive
    opts = SearchOptions(max_new_tokens=max_len, num_beams=V ** max_len, length_penalty=length_penalty,
                         eos_id=EOS, start_id=START)
    got = rt.generate(m, PROMPTS, opts)
    bests = []
    for src, beam in zip(PROMPTS, got):
        scores = eager_scores(model, src, hyps, max_len, length_penalty)
        order = np.argsort(-scores)
        best = hyps[order[0]]
        assert scores[order[0]] - scores[order[1]] > 1e-4, "a near tie: the best is not well defined"
        assert beam == best, (src, beam, best, scores[order[:3]])
        bests.append(best)
    # no degenerate case: plain greedy decoding would not pass
    assert any(b != eager_greedy(model, s, max_len) for s, b in zip(PROMPTS, bests))
    if length_penalty == 0.0:  # sum log p: not merely the shortest
        assert min(len(b) for b in bests) < max_len  # some best ended at eos before max_len
        assert max(len(b) for b in bests) > 1  # and some is longer than one token


def test_one_beam_is_greedy(tiny_tf):
    model, m = tiny_tf
    for max_len in (1, 3, 6):
        opts = SearchOptions(max_new_tokens=max_len, num_beams=1, eos_id=EOS, start_id=START)
        expected = [eager_greedy(model, s, max_len) for s in PROMPTS]
        assert beam_search(m, PROMPTS, opts) == expected  # beam_search itself, not generate's shortcut
        assert rt.generate(m, PROMPTS, opts) == expected
