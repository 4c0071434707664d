"""Beam search on the recurrent-state families: reordering beams is a gather along the batch
for every kind of state, so beams need nothing family-specific.

Judged against references independent of the runtime: transformers' own
`generate(num_beams=4, length_penalty=1.0)` (no eos: every hypothesis runs to the fixed length)
on random Hugging Face checkpoints (Mamba, Mamba-2, and the hybrids Bamba, LFM2 and Jamba, whose
beams reorder an appended KV cache and replaced conv/SSM state together), and for RWKV-7 a beam search written here
over the eager model's full forward (no cache, no state: the whole sequence each step), with
transformers' semantics. Prompts are chosen where the beams differ from greedy decoding.
"""

from collections import Counter

import numpy as np
import pytest
import torch

import seqexport.runtime as rt
from seqexport.checkpoints.io import load_checkpoint
from seqexport.checkpoints.presets import build_preset
from seqexport.export import export_model

BEAMS, NEW = 4, 8
NO_EOS = -1  # an eos id that never matches: every hypothesis has NEW tokens, as transformers' with no eos


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sharpen(model, seed: int):
    """Random weights whose next-token distributions are peaked and depend on the context (at
    their default init the tied head makes the model repeat its last token)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "out_proj" in name or name.endswith("att.output.weight"):  # the mixers' outputs count
                p.mul_(4.0)
            elif name.endswith("embeddings.weight") or name.endswith("embedding.weight"):
                p.normal_(0, 1.0, generator=g)
            elif name == "lm_head.weight":
                p.normal_(0, 0.5, generator=g)


def _hf_beams(model, prompts, beams: int) -> list[list[int]]:
    model.generation_config.eos_token_id = None
    out = []
    for p in prompts:  # one at a time: no padding in transformers' batch either
        ids = torch.tensor([p])
        with torch.no_grad():
            seq = model.generate(ids, num_beams=beams, max_new_tokens=NEW, do_sample=False, length_penalty=1.0,
                                 early_stopping=False, pad_token_id=0)
        out.append(seq[0, len(p):].tolist())
    return out


def _runtime_beams(folder, prompts, beams: int) -> list[list[int]]:
    m = rt.load(folder, provider="cpu", threads=1)
    return rt.generate(m, prompts, rt.SearchOptions(max_new_tokens=NEW, num_beams=beams, eos_id=NO_EOS,
                                                    length_penalty=1.0))


def _check(ours, reference, greedy):
    assert ours == reference
    assert any(r != g for r, g in zip(reference, greedy)), "no prompt where the beams differ from greedy"


PROMPTS = [[3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13], [20], [30, 31, 5, 40, 41, 2, 9, 9, 17]]


def _hf_case(tmp_path, family: str):
    from transformers import Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    if family == "mamba":
        cfg = MambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                          conv_kernel=4, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None,
                          pad_token_id=None)
        model = MambaForCausalLM(cfg).eval()
    else:
        cfg = Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                           head_dim=16, num_heads=4, n_groups=1, conv_kernel=4, chunk_size=8,
                           tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None)
        model = Mamba2ForCausalLM(cfg).eval()
    _sharpen(model, 0)
    model.save_pretrained(tmp_path / "hf")
    export_model(load_checkpoint(tmp_path / "hf"), None, tmp_path / "export")
    return model


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_beam_search_equals_transformers_generate(tmp_path, family):
    model = _hf_case(tmp_path, family)
    reference = _hf_beams(model, PROMPTS, BEAMS)
    greedy = _hf_beams(model, PROMPTS, 1)
    _check(_runtime_beams(tmp_path / "export", PROMPTS, BEAMS), reference, greedy)


@pytest.mark.parametrize("name", ["bamba", "lfm2", "jamba", "qwen3_5", "olmo_hybrid", "lfm3", "zamba2", "kimi_linear",
                                  "ling3"])
def test_a_hybrid_beam_search_equals_transformers_generate(tmp_path, name):
    """Bamba (attention beside Mamba-2 layers), LFM2 (beside short convolutions), Jamba (beside
    Mamba-1 layers), Qwen3.5 (gated attention beside Gated DeltaNets) and OLMo-hybrid (post-norm
    attention beside Gated DeltaNets whose writes may reflect the state) and LFM3 (sliding-window
    and full attention beside short convolutions) and Zamba2 (shared attention blocks called by
    hybrid layers, each with its own cache rows) and Kimi-Linear (latent attention, its cached
    latents, beside KDA layers, and experts) and Ling 3 (the same with RoPE turning the cached
    key parts): each beam's KV cache rows are reordered with its conv / SSM state rows."""
    from tests.test_hybrid_model import _hf

    model = _hf(name, seed=1)
    model.save_pretrained(tmp_path / "hf")
    export_model(load_checkpoint(tmp_path / "hf"), None, tmp_path / "export")
    reference = _hf_beams(model, PROMPTS, BEAMS)
    greedy = _hf_beams(model, PROMPTS, 1)
    _check(_runtime_beams(tmp_path / "export", PROMPTS, BEAMS), reference, greedy)


# ------------------------------------------------------------------ RWKV-7: a reference search here


def _full_forward_logp(model, seqs: list[list[int]]) -> np.ndarray:
    """log p of the next token after each sequence, from the eager model's forward over the
    whole sequence from a zero state (the sequential reference recurrence)."""
    out = []
    with torch.no_grad():
        for s in seqs:
            logits, _ = model(torch.tensor([s]))
            out.append(torch.log_softmax(logits[0, -1].double(), -1).numpy())
    return np.stack(out)


def reference_beam_search(model, prompt: list[int], beams: int, new: int) -> list[int]:
    """Transformers' beam search without eos, written plainly: keep the `beams` best (sum of
    log p) continuations at each step; at the end the best of them (all of one length, so the
    length penalty does not reorder them)."""
    live = [(0.0, [])]
    for _ in range(new):
        logp = _full_forward_logp(model, [prompt + h for _, h in live])  # (beams, v)
        cand = [(score + logp[i, t], h + [t]) for i, (score, h) in enumerate(live) for t in range(logp.shape[1])]
        cand.sort(key=lambda c: -c[0])
        assert cand[beams - 1][0] - cand[beams][0] > 1e-6, "a near tie at the beam's edge"
        live = cand[:beams]
    return live[0][1]


def test_rwkv7_beam_search_equals_a_reference_search_over_the_eager_forward(tmp_path):
    ckpt = build_preset("rwkv", "tiny", seed=0)
    _sharpen(ckpt.model, 1)
    with torch.no_grad():
        ckpt.model.head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    export_model(ckpt, "tiny", tmp_path / "export")
    ours = _runtime_beams(tmp_path / "export", PROMPTS, BEAMS)
    reference = [reference_beam_search(ckpt.model, p, BEAMS, NEW) for p in PROMPTS]
    greedy = [reference_beam_search(ckpt.model, p, 1, NEW) for p in PROMPTS]
    _check(ours, reference, greedy)


def test_beam_search_with_an_eos_ends_where_transformers_early_stopping_says(tmp_path):
    """With an eos some hypotheses finish early, and when a prompt's search stops decides the
    answer: `early_stopping` True (at num_beams finished), False (transformers' default: once no
    running beam can beat them at its length) and "never" (at the longest length) each give
    transformers' tokens, over the eos tokens the beams produce, beam widths and length
    penalties; and somewhere True and False disagree, and False and "never" (else this would not
    tell the rules apart)."""
    hf = _hf_case(tmp_path, "mamba")
    m = rt.load(tmp_path / "export", provider="cpu", threads=1)
    new = 16
    plain = rt.generate(m, PROMPTS, rt.SearchOptions(max_new_tokens=new, num_beams=BEAMS, eos_id=NO_EOS))
    counts = np.bincount([t for row in plain for t in row[1:]])
    apart = Counter()
    for eos in np.flatnonzero(counts).tolist():  # tokens the beams produce: hypotheses end at them
        for length_penalty, beams in [(1.0, 2), (0.3, 4), (2.0, 4)]:
            answers = {}
            for early in (True, False, "never"):
                ours = rt.generate(m, PROMPTS, rt.SearchOptions(max_new_tokens=new, num_beams=beams, eos_id=eos,
                                                                length_penalty=length_penalty, early_stopping=early))
                reference = []
                for p in PROMPTS:
                    with torch.no_grad():
                        seq = hf.generate(torch.tensor([p]), num_beams=beams, max_new_tokens=new, do_sample=False,
                                          length_penalty=length_penalty, early_stopping=early, eos_token_id=eos,
                                          pad_token_id=eos)[0, len(p):].tolist()
                    reference.append(seq[: seq.index(eos)] if eos in seq else seq)  # ours: no eos, no padding
                assert ours == reference, (early, eos, length_penalty, beams)
                answers[early] = ours
                apart["ended"] += sum(len(r) < new for r in ours)
            apart["true/false"] += answers[True] != answers[False]
            apart["false/never"] += answers[False] != answers["never"]
    assert min(apart.values()) > 0, apart
