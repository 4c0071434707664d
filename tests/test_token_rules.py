"""transformers' token rules — sequence_bias, bad_words_ids, no_repeat_ngram_size, min_length,
forced_bos_token_id, forced_eos_token_id, suppress_tokens, begin_suppress_tokens — in every
decode, against transformers itself.

- A checkpoint's generation_config.json that sets a rule: `seqexport generate` with no options,
  the Python API and a served request decode what transformers' `generate()` decodes from the
  same folder (greedy and beam search), and the rule bites (the plain greedy tokens differ).
- `Seen.apply` against transformers' own LogitsProcessorList on random scores and histories,
  bit for bit in float32 (and in float64, as beam search applies them to log-probabilities).
- An encoder-decoder (no transformers class for it): the exported decode against the eager
  model's full forward with transformers' processors on its logits, the decoder start leading
  the ids the rules read (transformers' decoder_input_ids).
"""

import json

import numpy as np
import openai
import pytest
import torch
import transformers
from click.testing import CliRunner
from seqexport.models.transformer import generate_mask, padding_mask
from transformers.generation import logits_process as lp

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import UsageError
from seqexport.manifest import read_manifest
from seqexport.runtime.engine import Engine
from seqexport.runtime.penalties import Seen
from tests.test_generation_config import PROMPT, checkpoint, cli_ids, hf_generate, with_generation  # noqa: F401
from tests.test_search import START, V, tiny_tf  # noqa: F401
from tests.test_serve import plain_server

NEW = 12


@pytest.fixture(scope="module")
def greedy(checkpoint):  # noqa: F811
    """The plain greedy tokens transformers decodes from the checkpoint: each rule is aimed at them."""
    return hf_generate_with(checkpoint, PROMPT, max_new_tokens=NEW)


def hf_generate_with(folder, prompt, **kwargs) -> list[int]:
    hf = transformers.MambaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]), **kwargs)[0, len(prompt):].tolist()


# each rule aimed at the plain greedy tokens g, so that it changes them
RULES = {
    "ngram": lambda g: {"no_repeat_ngram_size": 2},
    "ngram-beams": lambda g: {"no_repeat_ngram_size": 3, "num_beams": 3},
    "bad-words": lambda g: {"bad_words_ids": [[g[2], g[3]], [g[6]]]},
    "sequence-bias": lambda g: {"sequence_bias": [[[g[1], g[2]], -4.5], [[(g[5] + 1) % 97], 2.5]]},
    "suppress": lambda g: {"suppress_tokens": [g[4]], "begin_suppress_tokens": [g[0]]},
    "forced-eos": lambda g: {"forced_eos_token_id": (g[-1] + 1) % 97},
    "beams-bad-words": lambda g: {"num_beams": 3, "bad_words_ids": [[g[1]], [g[3], g[4]]], "suppress_tokens": [g[7]]},
}


@pytest.mark.parametrize("rule", list(RULES))
def test_a_checkpoints_token_rules_decode_as_transformers_generate(checkpoint, greedy, tmp_path, rule):  # noqa: F811
    config = RULES[rule](greedy) | {"max_new_tokens": NEW}
    folder, out = with_generation(checkpoint, tmp_path, **config)
    expected = hf_generate(folder, PROMPT)  # the folder's generation config decides
    assert len(expected) == NEW and expected != greedy  # the rule bites
    assert read_manifest(out)["generation"] == {"file": "generation_config.json", "defaults": config,
                                                "not_applied": {}}
    ours, log = cli_ids(out)
    assert ours == expected
    assert "does not apply" not in log
    taken = log.split("using the model's generation defaults")[1].split("\n")[0]
    assert all(f"{key} " in taken for key in config), taken  # each rule said to be taken
    model = rt.load(out)
    assert rt.generate(model, [PROMPT])[0] == expected
    if "num_beams" not in config:  # the engine (what serves requests) too
        engine = Engine(model)
        req = engine.submit(PROMPT)
        engine.run_until_done()
        assert req.tokens == expected


def test_served_requests_take_the_models_token_rules(checkpoint, greedy, tmp_path, tmp_path_factory):  # noqa: F811
    config = {"no_repeat_ngram_size": 2, "bad_words_ids": [[greedy[2], greedy[3]]], "suppress_tokens": [greedy[5]]}
    folder, out = with_generation(checkpoint, tmp_path, **config)
    expected = hf_generate_with(folder, PROMPT, max_new_tokens=NEW)
    assert expected != greedy
    with plain_server(out, tmp_path_factory) as server:
        assert "no_repeat_ngram_size 2" in server.log_path.read_text()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=out.name, prompt=PROMPT, max_tokens=NEW, temperature=0)
        assert answer.choices[0].token_ids == expected
    with plain_server(out, tmp_path_factory, "--generation-config", "none") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=out.name, prompt=PROMPT, max_tokens=NEW, temperature=0)
        assert answer.choices[0].token_ids == greedy


def test_min_length_forced_bos_and_the_begin_index_follow_transformers(checkpoint, greedy):  # noqa: F811
    """min_length counts the prompt (a language model); forced_bos_token_id applies to a one-token
    prompt only, and moves begin_suppress_tokens to the second new token, as transformers' generate."""
    out = checkpoint.parent / "plain-export"
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(checkpoint), "--out", str(out)])
    assert result.exit_code == 0, result.output
    model = rt.load(out)
    eos = greedy[1]

    def ours(prompt, **options):
        return rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=NEW, **options))[0]

    def theirs(prompt, **kwargs):
        seq = hf_generate_with(checkpoint, prompt, max_new_tokens=NEW, pad_token_id=0, **kwargs)
        return seq[: seq.index(kwargs["eos_token_id"])] if kwargs.get("eos_token_id") in seq else seq

    assert ours(PROMPT, eos_id=eos) == theirs(PROMPT, eos_token_id=eos) == greedy[:1]
    # `seqexport generate --no-repeat-ngram-size`
    flagged, _ = cli_ids(out, "--no-repeat-ngram-size", "2", "--max-new-tokens", str(NEW))
    assert flagged == hf_generate_with(checkpoint, PROMPT, max_new_tokens=NEW, no_repeat_ngram_size=2) != greedy
    for length in (len(PROMPT) + 4, len(PROMPT) + 7):
        got = ours(PROMPT, eos_id=eos, min_length=length)
        assert got == theirs(PROMPT, eos_token_id=eos, min_length=length) and len(got) >= length - len(PROMPT)
    short = greedy[:1]
    plain = ours(short)
    forced = ours(short, forced_bos_token_id=40)
    assert forced == theirs(short, forced_bos_token_id=40) and forced[0] == 40 != plain[0]
    assert ours(PROMPT, forced_bos_token_id=40) == greedy  # a longer prompt: no first token forced
    # begin_suppress_tokens after a forced bos: the second new token (the one it would take) suppressed
    rules = {"forced_bos_token_id": 40, "begin_suppress_tokens": [forced[1]]}
    got = ours(short, **rules)
    assert got == theirs(short, **rules) and got[0] == 40 and got[1] != forced[1]
    # and min_new_tokens beside them, with a forced eos at the last new token winning, as transformers orders them
    got = ours(PROMPT, eos_id=eos, min_new_tokens=NEW, forced_eos_token_id=eos)
    assert got == theirs(PROMPT, eos_token_id=eos, min_new_tokens=NEW, forced_eos_token_id=eos)
    assert len(got) == NEW - 1


def transformers_processors(options: rt.SearchOptions, eos: list[int], begin: int) -> lp.LogitsProcessorList:
    """transformers' processors for `options`, in the order its generate builds them."""
    procs = []
    bias = [[list(s), b] for s, b in options.sequence_bias] + [[[t], b] for t, b in options.logit_bias]
    if bias:
        procs.append(lp.SequenceBiasLogitsProcessor(bias))
    if options.repetition_penalty != 1:
        procs.append(lp.RepetitionPenaltyLogitsProcessor(options.repetition_penalty))
    if options.no_repeat_ngram_size:
        procs.append(lp.NoRepeatNGramLogitsProcessor(options.no_repeat_ngram_size))
    if options.bad_words_ids:
        procs.append(lp.NoBadWordsLogitsProcessor([list(w) for w in options.bad_words_ids], eos))
    if options.min_length:
        procs.append(lp.MinLengthLogitsProcessor(options.min_length, eos))
    if options.min_new_tokens:
        procs.append(lp.MinNewTokensLengthLogitsProcessor(begin, options.min_new_tokens, eos))
    if options.forced_bos_token_id is not None:
        procs.append(lp.ForcedBOSTokenLogitsProcessor(options.forced_bos_token_id))
    if options.forced_eos_token_id is not None:
        procs.append(lp.ForcedEOSTokenLogitsProcessor(begin + options.max_new_tokens, options.forced_eos_token_id))
    if options.suppress_tokens:
        procs.append(lp.SuppressTokensLogitsProcessor(options.suppress_tokens))
    if options.begin_suppress_tokens:
        at = begin + (1 if begin == 1 and options.forced_bos_token_id is not None else 0)
        procs.append(lp.SuppressTokensAtBeginLogitsProcessor(options.begin_suppress_tokens, at))
    return lp.LogitsProcessorList(procs)


def random_rules(rng, v: int, history: list[int]) -> dict:
    """Rules that touch this history: sequences taken from it (so that some end it), ids in it."""
    pick = lambda n: [int(t) for t in rng.choice(history, n)]  # noqa: E731
    tail = history[-3:]
    return {
        "sequence_bias": [[tail[-1:] + [int(rng.integers(v))], float(rng.normal() * 3)],
                          [tail[-2:] + [int(rng.integers(v))], float(rng.normal() * 3)],
                          [[int(rng.integers(v))], float(rng.normal() * 3)], [pick(1), -np.inf]],
        # ([2]: an eos, which transformers leaves out of the bad words)
        "bad_words_ids": [tail[-1:] + [int(rng.integers(v))], pick(1), [int(rng.integers(v))], tail + [3], [2]],
        "no_repeat_ngram_size": int(rng.integers(1, 4)),
        "repetition_penalty": float(rng.choice([1.0, 1.3, 0.8])),
        "suppress_tokens": pick(2),
        "begin_suppress_tokens": pick(2),
        "min_length": int(rng.integers(0, len(history) + 3)),
    }


@pytest.mark.parametrize("seed", range(6))
def test_seen_applies_the_rules_as_transformers_processors_bit_for_bit(seed):
    """Random histories and rules: float32 scores equal, bit for bit; float64 ones (beam search's
    log-probabilities) within float32 rounding of the biases."""
    rng = np.random.default_rng(seed)
    v, eos = 30, [2, 29]
    prompt = [int(t) for t in rng.integers(0, v, int(rng.integers(1, 8)))]
    generated = [int(t) for t in rng.integers(0, 12, int(rng.integers(0, 10)))]  # repeats: n-grams recur
    history = prompt + generated
    for extra in [{}, {"forced_bos_token_id": 7}, {"forced_eos_token_id": (5, 9)}, {"min_new_tokens": 3}]:
        max_new = len(generated) + int(rng.integers(1, 3))  # the forced eos: now, or one later
        options = rt.SearchOptions(max_new_tokens=max_new, **random_rules(rng, v, history), **extra)
        seen = Seen(options, prompt, eos=tuple(eos))
        for t in generated:
            seen.add(t)
        procs = transformers_processors(options, eos, len(prompt))
        for dtype in (np.float32, np.float64):
            scores = (rng.standard_normal(v) * 4).astype(dtype)
            want = procs(torch.tensor([history]), torch.from_numpy(scores[None].copy()))[0].numpy()
            got = seen.apply(scores)
            assert got.dtype == dtype
            if dtype == np.float32:
                np.testing.assert_array_equal(got, want, err_msg=str(options))
            else:  # (transformers' bias tensor is float32 whatever the scores' dtype; ours is theirs)
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=str(options))
            assert not np.array_equal(got, scores)  # something applied
        twin = seen.copy()  # a beam that splits: the copy goes on alone
        twin.add(int(rng.integers(v)))
        again = seen.apply(np.zeros(v, np.float32))
        np.testing.assert_array_equal(again, procs(torch.tensor([history]), torch.zeros(1, v))[0].numpy())


def test_an_encoder_decoders_rules_read_its_decoder_start_first(tiny_tf):  # noqa: F811
    """Greedy decoding of an exported transformer with rules against the eager model's full
    forward and transformers' processors on [start] + the tokens so far (decoder_input_ids)."""
    model, exported = tiny_tf
    eos = 2
    options = rt.SearchOptions(max_new_tokens=8, eos_id=eos, start_id=START, no_repeat_ngram_size=2,
                               bad_words_ids=[[START, 3]], min_length=4, suppress_tokens=[0])
    procs = transformers_processors(options, [eos], 1)
    for src in ([3, 5, 7], [4, 4, 2, 6, 7], [6, 6, 6]):
        out, s = [], torch.tensor([src])
        with torch.no_grad():
            for _ in range(options.max_new_tokens):
                tgt = torch.tensor([[START] + out])
                logits = model(s, tgt, src_mask=padding_mask(s), tgt_mask=generate_mask(tgt.shape[1]),
                               memory_mask=padding_mask(s))[0, -1:]
                tok = int(procs(tgt, logits).argmax())
                if tok == eos:
                    break
                out.append(tok)
        assert rt.generate(exported, [src], options)[0] == out
    plain = rt.SearchOptions(max_new_tokens=8, eos_id=eos, start_id=START)
    assert rt.generate(exported, [[3, 5, 7], [4, 4, 2, 6, 7], [6, 6, 6]], options) != \
        rt.generate(exported, [[3, 5, 7], [4, 4, 2, 6, 7], [6, 6, 6]], plain)


def test_an_encoder_decoders_repetition_penalty_counts_its_decoder_start(tiny_tf):  # noqa: F811
    """transformers' repetition penalty reads the decoder's input_ids, the decoder start among
    them (not the source): greedy decoding of the export against the eager model's full forward
    with transformers' RepetitionPenaltyLogitsProcessor on [start] + the tokens so far. A penalty
    below 1 lifts the tokens seen, so counting the start or not decides tokens."""
    model, exported = tiny_tf
    options = rt.SearchOptions(max_new_tokens=8, eos_id=-1, start_id=START, repetition_penalty=0.3)
    penalty = lp.RepetitionPenaltyLogitsProcessor(0.3)
    sources = ([3, 5, 7], [4, 4, 2, 6, 7], [6, 6, 6], [1, 6], [7])
    want, without_start = [], []
    for src in sources:
        for lead, out in ((1, []), (0, [])):
            s = torch.tensor([src])
            with torch.no_grad():
                for _ in range(options.max_new_tokens):
                    tgt = torch.tensor([[START] + out])
                    logits = model(s, tgt, src_mask=padding_mask(s), tgt_mask=generate_mask(tgt.shape[1]),
                                   memory_mask=padding_mask(s))[0, -1:]
                    out.append(int(penalty(tgt[:, 1 - lead:], logits).argmax()))
            (want if lead else without_start).append(out)
    assert rt.generate(exported, list(sources), options) == want
    assert want != without_start  # (the start decides a token)


@pytest.mark.parametrize("options, message", [
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be >= 0, got -1"),
    ({"bad_words_ids": [[]]}, "bad_words_ids[0] must be a list of token ids (at least one)"),
    ({"bad_words_ids": [3]}, "bad_words_ids[0] must be a list of token ids"),
    ({"sequence_bias": [[[1, 2], "high"]]}, "sequence_bias[0] bias must be a number"),
    ({"sequence_bias": [[[1], 1.0], [[1], 2.0]]}, "the sequence [1] is given twice"),
    ({"suppress_tokens": [1.5]}, "suppress_tokens[0] must be an integer"),
    ({"forced_eos_token_id": -3}, "forced_eos_token_id must be >= 0"),
    ({"forced_bos_token_id": 97}, "forced_bos_token_id 97 is not a token id of this model"),
    ({"bad_words_ids": [[3, 500]]}, "bad_words_ids token 500 is not a token id of this model"),
])
def test_a_bad_rule_is_refused_naming_it(checkpoint, tmp_path, options, message):  # noqa: F811
    _, out = with_generation(checkpoint, tmp_path, max_new_tokens=3)
    model = rt.load(out)
    with pytest.raises(UsageError) as e:
        rt.generate(model, [PROMPT], rt.SearchOptions(**options))
    assert message in str(e.value)


@pytest.mark.parametrize("config, named", [
    ({"bad_words_ids": [[3, 97]]}, "bad_words_ids token 97"),
    ({"sequence_bias": [[[5, 120], -2.0]]}, "sequence_bias token 120"),
    ({"forced_eos_token_id": [4, 300]}, "forced_eos_token_id 300"),
    ({"suppress_tokens": [1, 2, 98]}, "suppress_tokens token 98"),
])
def test_a_rules_id_past_the_vocabulary_stops_the_export_naming_it(checkpoint, tmp_path, config, named):  # noqa: F811
    """transformers would fail on it at the first decode (or drop it silently); the export says
    so before anything is written, naming the file, the key and the id."""
    from tests.test_generation_config import export_with

    _, out, result = export_with(checkpoint, tmp_path, config)
    assert result.exit_code == 2, result.output
    assert f"generation_config.json: {named} is not a token id of this model: expected an id in [0, 97)" \
        in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_an_older_manifests_rules_kept_as_not_applied_are_applied_now(checkpoint, greedy, tmp_path):  # noqa: F811
    folder, out = with_generation(checkpoint, tmp_path, no_repeat_ngram_size=2, top_h=0.5, max_new_tokens=NEW)
    manifest = json.loads((out / "manifest.json").read_text())
    # as an export before this change wrote it
    manifest["generation"] = {"file": "generation_config.json", "defaults": {"max_new_tokens": NEW},
                              "not_applied": {"no_repeat_ngram_size": 2, "top_h": 0.5}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    model = rt.load(out)
    assert model.generation["not_applied"] == {"top_h": 0.5}
    assert rt.generate(model, [PROMPT])[0] == hf_generate_with(folder, PROMPT, max_new_tokens=NEW,
                                                               do_sample=False) != greedy
    result = CliRunner().invoke(cli, ["inspect", str(out)])
    assert "not applied (tokens can differ from transformers' generate): top_h 0.5" in result.output


def test_an_encoder_decoder_starts_from_its_checkpoints_decoder_start_token(tmp_path):
    """A transformer checkpoint whose generation_config names a decoder_start_token_id other than
    its bos: the Python runtime's decoder starts from it (as the page's runtime and transformers
    do), and the token rules read it first."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from seqexport.checkpoints.io import save_checkpoint
    from seqexport.checkpoints.presets import build_preset

    torch.manual_seed(0)
    ckpt = build_preset("transformer", "tiny", seed=0)
    folder = save_checkpoint(ckpt.model, ckpt.config, "transformer", tmp_path / "ckpt")
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(60)}, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    bos, start = 1, 7
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": 2, "pad_token_id": 0, "decoder_start_token_id": start}))
    out = tmp_path / "onnx"
    result = CliRunner().invoke(cli, ["export", "transformer", "--checkpoint", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    model = rt.load(out)
    assert (model.tokenizer.decoder_start_id, model.tokenizer.bos_id, model.start_token()) == (start, bos, start)
    src = [5, 9, 14, 22, 31]
    never = {"eos_id": -1, "max_new_tokens": 6}
    ours = rt.generate(model, [src], rt.SearchOptions(**never))[0]
    assert ours == rt.generate(model, [src], rt.SearchOptions(start_id=start, **never))[0]
    assert ours != rt.generate(model, [src], rt.SearchOptions(start_id=bos, **never))[0]  # (the start matters)
    banned = rt.generate(model, [src], rt.SearchOptions(bad_words_ids=[[start, ours[0]]], **never))[0]
    assert banned[0] != ours[0]  # the rule read the decoder start before the first new token


def test_beam_sampling_stays_not_applied_and_the_model_still_samples(checkpoint, tmp_path):  # noqa: F811
    """do_sample with num_beams > 1 (transformers' beam sampling, which seqexport does not do):
    num_beams stays not applied, in a new export's manifest and as it is read back, and the
    model's decode samples as its other defaults say (not refused as beams with sampling)."""
    folder, out = with_generation(checkpoint, tmp_path, do_sample=True, num_beams=3, top_k=3, max_new_tokens=5,
                                  no_repeat_ngram_size=2)
    model = rt.load(out)
    assert model.generation["not_applied"] == {"num_beams": 3}
    assert model.generation_defaults == {"do_sample": True, "top_k": 3, "max_new_tokens": 5, "no_repeat_ngram_size": 2}
    seeded = rt.generate(model, [PROMPT], rt.model_options(model, seed=1))[0]
    assert seeded == rt.generate(model, [PROMPT], rt.SearchOptions(do_sample=True, top_k=3, max_new_tokens=5, seed=1,
                                                                   no_repeat_ngram_size=2))[0]
    ours, log = cli_ids(out, "--seed", "1")
    assert ours == seeded and "num_beams 3, which seqexport does not apply" in log
