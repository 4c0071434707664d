"""Repetition, presence and frequency penalties in every decode: generate() (greedy, sampling,
beam search), the engine and the server, against transformers' generate(repetition_penalty=…)
on the same checkpoint and against a greedy loop over transformers' full forward with OpenAI's
presence / frequency rule written out here."""

import json
import shutil

import numpy as np
import openai
import pytest
import torch
import transformers
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import UsageError
from tests.test_serve import plain_server

PROMPTS = [[5, 17, 42, 8, 60, 3, 91, 11], [7, 7, 7, 2, 40]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(transformers' model, our export) of one random Mamba checkpoint whose greedy decode repeats
    itself (so that a penalty changes the tokens); no eos: decodes run their full length."""
    torch.manual_seed(1)
    cfg = transformers.MambaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, state_size=8,
                                   eos_token_id=None, bos_token_id=None, pad_token_id=None)
    hf = transformers.MambaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in hf.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.5)
            layer.mixer.out_proj.weight.mul_(5.0)
    root = tmp_path_factory.mktemp("penalties")
    hf.save_pretrained(root / "hf")
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(root / "hf"), "--out", str(root / "onnx")])
    assert result.exit_code == 0, result.output
    return hf, root / "onnx"


def hf_tokens(hf, prompt, **kwargs) -> list[int]:
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]), **kwargs)[0, len(prompt):].tolist()


def test_greedy_with_a_repetition_penalty_is_transformers_greedy(exported):
    hf, folder = exported
    model = rt.load(folder)
    for prompt in PROMPTS:
        plain = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=16))[0]
        ours = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=16, repetition_penalty=1.5))[0]
        assert ours == hf_tokens(hf, prompt, do_sample=False, max_new_tokens=16, repetition_penalty=1.5)
        assert ours != plain  # the penalty changed something
    # rewarding repetition (< 1) too, and a batch (each row its own history)
    batch = rt.generate(model, PROMPTS, rt.SearchOptions(max_new_tokens=10, repetition_penalty=0.6))
    assert batch == [hf_tokens(hf, p, do_sample=False, max_new_tokens=10, repetition_penalty=0.6) for p in PROMPTS]


def test_beam_search_with_a_repetition_penalty_is_transformers_beam_search(exported):
    hf, folder = exported
    model = rt.load(folder)
    for prompt in PROMPTS:
        ours = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=8, num_beams=3, repetition_penalty=1.5))[0]
        assert ours == hf_tokens(hf, prompt, do_sample=False, num_beams=3, max_new_tokens=8, repetition_penalty=1.5,
                                 length_penalty=1.0)
        assert ours != rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=8, num_beams=3))[0]


def openai_greedy(hf, prompt, n, presence, frequency) -> list[int]:
    """A greedy loop over transformers' full forward (no cache), each generated token's logit
    lowered by frequency x its count + presence, as OpenAI documents the two penalties."""
    out: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out])).logits[0, -1].double()
        for t in set(out):
            logits[t] -= frequency * out.count(t) + presence
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("presence, frequency", [(1.5, 0.0), (0.0, 0.8), (-0.5, 0.3)])
def test_presence_and_frequency_penalties_follow_openais_rule(exported, presence, frequency):
    hf, folder = exported
    model = rt.load(folder)
    prompt = PROMPTS[0]
    ours = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=14, presence_penalty=presence,
                                                         frequency_penalty=frequency))[0]
    assert ours == openai_greedy(hf, prompt, 14, presence, frequency)
    assert ours != rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=14))[0]


def test_sampling_applies_the_penalty_before_it_draws(exported):
    """Sampled with top_k 1 the draw is the penalised argmax: transformers' greedy with the penalty."""
    hf, folder = exported
    model = rt.load(folder)
    ours = rt.generate(model, [PROMPTS[0]], rt.SearchOptions(max_new_tokens=12, do_sample=True, top_k=1, seed=3,
                                                             repetition_penalty=1.5))[0]
    assert ours == hf_tokens(hf, PROMPTS[0], do_sample=False, max_new_tokens=12, repetition_penalty=1.5)


def test_served_requests_and_the_cli_take_the_penalties(exported, tmp_path, tmp_path_factory):
    """A batch of penalised and plain requests on one server: each gets generate()'s tokens for
    it alone; `generate --repetition-penalty` too; and a checkpoint's generation_config
    repetition_penalty is the default of both."""
    hf, folder = exported
    model = rt.load(folder)
    asks = [{"repetition_penalty": 1.5}, {}, {"presence_penalty": 1.5}, {"frequency_penalty": 0.8},
            {"repetition_penalty": 1.3, "temperature": 0.8, "seed": 4}, {"min_p": 0.3, "temperature": 1.5, "seed": 5}]

    def expected(prompt, ask):
        sample = "temperature" in ask
        options = {k: v for k, v in ask.items() if k != "temperature"} | {
            "temperature": ask.get("temperature", 1.0), "do_sample": sample}
        return rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=10, **options))[0]

    with plain_server(folder, tmp_path_factory) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        import concurrent.futures as cf

        def ask(i):
            body = asks[i % len(asks)]
            extra = {k: v for k, v in body.items() if k in ("repetition_penalty", "min_p")}  # vLLM's fields
            openai_fields = {k: v for k, v in body.items() if k not in extra}
            return client.completions.create(model=folder.name, prompt=PROMPTS[i % 2], max_tokens=10,
                                             **({"temperature": 0} | openai_fields), extra_body=extra)

        with cf.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(12)))
        for i, answer in enumerate(answers):
            assert answer.choices[0].token_ids == expected(PROMPTS[i % 2], asks[i % len(asks)]), i
        sampled = {k: v for k, v in asks[5].items() if k != "min_p"}  # min-p decides a token here
        assert expected(PROMPTS[1], asks[5]) != expected(PROMPTS[1], sampled)
        for field, value in [("presence_penalty", 2.5), ("frequency_penalty", "high"), ("repetition_penalty", 0)]:
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(model=folder.name, prompt=PROMPTS[0], extra_body={field: value})
            assert caught.value.body["param"] == field
    ids = " ".join(map(str, PROMPTS[0]))
    result = CliRunner().invoke(cli, ["generate", str(folder), "--ids", ids, "--max-new-tokens", "16",
                                      "--repetition-penalty", "1.5"])
    assert result.exit_code == 0, result.output
    assert [int(t) for t in result.stdout.split()] == hf_tokens(hf, PROMPTS[0], do_sample=False, max_new_tokens=16,
                                                                repetition_penalty=1.5)
    # the checkpoint's own repetition_penalty: the default (transformers' generate() with no arguments)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(folder.parent / "hf", ckpt)
    (ckpt / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.5, "max_new_tokens": 9}))
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(ckpt), "--out", str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    reference = transformers.MambaForCausalLM.from_pretrained(ckpt).eval()
    assert rt.generate(rt.load(tmp_path / "g"), [PROMPTS[0]])[0] == hf_tokens(reference, PROMPTS[0])


def test_long_histories_are_penalised_as_the_rule_reads():
    """Thousands of tokens seen (many distinct: the row's arrays grow): every score as the rules
    read, token by token, in float32."""
    from seqexport.runtime.penalties import Seen

    rng = np.random.default_rng(0)
    v = 5000
    scores = (rng.standard_normal(v) * 3).astype(np.float32)
    # a short prompt, then an answer of thousands of tokens mostly new (the arrays grow as it is
    # counted), with repeats (counts above 1) and ids past v (never picked, skipped)
    context = rng.integers(0, 100, 300).tolist()
    generated = rng.integers(50, v + 10, 4000).tolist()
    for rep, presence, frequency in [(1.3, 0.0, 0.0), (0.8, 0.4, 0.3), (1.0, -0.7, 1.1)]:
        seen = Seen(rt.SearchOptions(repetition_penalty=rep, presence_penalty=presence,
                                     frequency_penalty=frequency), context)
        for t in generated:
            seen.add(t)
        want = scores.copy()
        for t in set(context) | set(generated):
            if t < v and rep != 1:
                want[t] = want[t] * np.float32(rep) if want[t] < 0 else want[t] / np.float32(rep)
        for t in set(generated) - set(range(v, v + 10)):
            times = np.float32(generated.count(t))
            want[t] -= np.float32(frequency) * times + np.float32(presence)
        assert np.array_equal(seen.apply(scores), want), (rep, presence, frequency)


def test_min_new_tokens_holds_eos_back_as_transformers_does(exported):
    """An eos that greedy decoding meets early: with min_new_tokens it cannot end a row before,
    in greedy decoding, beam search, the engine and a served request (vLLM's min_tokens), each
    equal to transformers' generate(min_new_tokens=…)."""
    hf, folder = exported
    model = rt.load(folder)
    prompt = PROMPTS[0]
    eos = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=3))[0][1]  # its second token

    def reference(**kwargs):
        seq = hf_tokens(hf, prompt, do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos, **kwargs)
        return seq[: seq.index(eos)] if eos in seq else seq

    early = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12, eos_id=eos))[0]
    assert early == reference() and len(early) == 1  # ended at the eos
    for n in (4, 7):
        ours = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12, eos_id=eos, min_new_tokens=n))[0]
        assert ours == reference(min_new_tokens=n) and len(ours) >= n
        # beams scored by sum log p (no length normalisation): a short hypothesis wins where it may end
        beams = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12, eos_id=eos, min_new_tokens=n,
                                                              num_beams=3, length_penalty=0.0))[0]
        assert beams == reference(min_new_tokens=n, num_beams=3, early_stopping=False, length_penalty=0.0)
        assert len(beams) >= n > len(rt.generate(model, [prompt], rt.SearchOptions(
            max_new_tokens=12, eos_id=eos, num_beams=3, length_penalty=0.0))[0])


def test_a_served_request_with_min_tokens_runs_past_its_eos(bundled_exports, tmp_path_factory):
    """The bundled date model answers in ~10 tokens then its eos: with vLLM's `min_tokens` the
    answer goes on past it (generate()'s tokens with min_new_tokens), in a batch beside a plain
    request; min_tokens above max_tokens is a 400 naming it."""
    folder = bundled_exports("mamba")[1]
    model = rt.load(folder)
    ids = model.encode("5 March 2021")
    plain = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=24))[0]
    held = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=24, min_new_tokens=len(plain) + 4))[0]
    assert len(plain) < 20 and len(held) >= len(plain) + 4
    with plain_server(folder, tmp_path_factory) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda extra: client.completions.create(
                model=folder.name, prompt=ids, max_tokens=24, temperature=0, extra_body=extra).choices[0].token_ids,
                [{"min_tokens": len(plain) + 4}, {}]))
        assert got == [held, plain]
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=folder.name, prompt=ids, max_tokens=4, extra_body={"min_tokens": 5})
        assert caught.value.body["param"] == "min_tokens"


@pytest.mark.parametrize("field, value, message", [
    ("repetition_penalty", 0, "repetition_penalty must be > 0, got 0"),
    ("presence_penalty", 3, "presence_penalty must be in [-2, 2], got 3"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be in [-2, 2], got nan"),
])
def test_a_penalty_out_of_range_is_named(field, value, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        rt.SearchOptions(**{field: value})


def test_the_engine_keeps_each_rows_history_apart(exported):
    """Several penalised requests in one batch, joined at different rounds: each gets the tokens
    generate() gives it alone."""
    _, folder = exported
    model = rt.load(folder)
    engine = rt.Engine(model, max_rows=4).start()
    try:
        options = [rt.SearchOptions(max_new_tokens=n, repetition_penalty=p, frequency_penalty=f)
                   for n, p, f in [(12, 1.5, 0.0), (7, 1.0, 0.6), (10, 0.7, 0.0), (12, 1.2, 0.3), (5, 1.5, 1.0)]]
        reqs = [engine.submit(PROMPTS[i % 2], o) for i, o in enumerate(options)]
        for r in reqs:
            assert r.wait(60)
        got = [r.tokens for r in reqs]
    finally:
        engine.close()
    assert got == [rt.generate(model, [PROMPTS[i % 2]], o)[0] for i, o in enumerate(options)]
    assert np.unique([len(g) for g in got]).size > 1


def test_logit_bias_is_transformers_sequence_bias_in_every_search(exported):
    """OpenAI's logit_bias (token id -> a number added to its score) equals transformers'
    generate(sequence_bias={(id,): bias}) greedy and in beam search, and decides a top-k 1
    draw; with a repetition penalty it comes first, as transformers' processors run. The bias
    bans the token plain greedy takes first and favours another, so the tokens change."""
    hf, folder = exported
    model = rt.load(folder)
    for prompt in PROMPTS:
        plain = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12))[0]
        bias = {plain[0]: -100.0, (plain[0] + 1) % 97: 2.5}
        sequence_bias = {(t,): b for t, b in bias.items()}
        ours = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12, logit_bias=bias))[0]
        assert ours == hf_tokens(hf, prompt, do_sample=False, max_new_tokens=12, sequence_bias=sequence_bias)
        assert ours != plain and plain[0] not in ours
        beams = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=8, num_beams=3, logit_bias=bias))[0]
        assert beams == hf_tokens(hf, prompt, do_sample=False, num_beams=3, max_new_tokens=8, length_penalty=1.0,
                                  sequence_bias=sequence_bias)
        penalised = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12, logit_bias=bias,
                                                                  repetition_penalty=1.5))[0]
        assert penalised == hf_tokens(hf, prompt, do_sample=False, max_new_tokens=12, sequence_bias=sequence_bias,
                                      repetition_penalty=1.5)
        drawn = rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12, logit_bias=bias, do_sample=True,
                                                              top_k=1, seed=0))[0]
        assert drawn == ours
    # -inf bans outright; a huge bias makes a token every draw
    banned = rt.generate(model, [PROMPTS[0]], rt.SearchOptions(max_new_tokens=12, logit_bias={plain[0]: -np.inf}))[0]
    assert plain[0] not in banned
    forced = rt.generate(model, [PROMPTS[0]], rt.SearchOptions(max_new_tokens=6, do_sample=True, seed=1,
                                                               logit_bias={42: 100.0}))[0]
    assert forced == [42] * 6


def test_logit_bias_reaches_served_requests_and_the_cli_and_bad_ones_are_named(exported, tmp_path_factory):
    """Served requests with and without logit_bias in one batch (completions and chat-free
    token prompts) each get generate()'s tokens; `generate --logit-bias` too. A bias out of
    [-100, 100], a key that is no token id, an id past the vocabulary: 400 naming logit_bias."""
    hf, folder = exported
    model = rt.load(folder)
    plain = rt.generate(model, [PROMPTS[0]], rt.SearchOptions(max_new_tokens=10))[0]
    bias = {plain[0]: -100.0, plain[1]: -50.5}
    want = rt.generate(model, [PROMPTS[0]], rt.SearchOptions(max_new_tokens=10, logit_bias=bias))[0]
    assert want != plain
    with plain_server(folder, tmp_path_factory) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda b: client.completions.create(
                model=folder.name, prompt=PROMPTS[0], max_tokens=10, temperature=0,
                logit_bias=b).choices[0].token_ids, [{str(t): v for t, v in bias.items()}, None] * 2))
        assert got == [want, plain] * 2
        for value, says in [({str(plain[0]): 101}, "expected a number in [-100, 100]"),
                            ({"ten": 1}, "expected a token id"), ({"-3": 1}, "expected a token id"),
                            ({"97": 1}, "not a token id of this model: expected an id in [0, 97)"),
                            ([1, 2], "expected an object")]:
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(model=folder.name, prompt=PROMPTS[0], max_tokens=2, logit_bias=value)
            assert caught.value.body["param"] == "logit_bias" and says in caught.value.body["message"], value
    ids = " ".join(map(str, PROMPTS[0]))
    args = ["generate", str(folder), "--ids", ids, "--max-new-tokens", "10"]
    result = CliRunner().invoke(cli, [*args, *(f"--logit-bias={t}={v}" for t, v in bias.items())])
    assert result.exit_code == 0, result.output
    assert [int(t) for t in result.stdout.split()] == want
    for item, says in [("5", "expected ID=BIAS"), ("5=big", "expected ID=BIAS"), ("97=1", "not a token id")]:
        result = CliRunner().invoke(cli, [*args, "--logit-bias", item])
        assert result.exit_code == 2 and says in result.output, result.output
