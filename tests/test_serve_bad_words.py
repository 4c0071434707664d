"""vLLM's `bad_words` request field on a served model: the words as vLLM tokenizes them (each as
it begins a text, and after a space where that makes another first token of as many ids),
banned as transformers' `bad_words_ids` bans them.

The reference is transformers' own `generate(bad_words_ids=…)` on the checkpoint the export was
made from, with the ids taken from the `tokenizers` library by vLLM's rule (written out here,
not seqexport's code); a completion and a chat request, streamed and not.
"""

import openai
import pytest
import requests
import torch
import transformers
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.serve.bad_words import bad_words_ids
from tests.test_generation_config import checkpoint  # noqa: F401
from tests.test_serve import plain_server
from tests.test_web import byte_level_bpe

PROMPT = "Friday, 5 March 2021 ="
NEW = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint folder, export folder, the tokenizers library's tokenizer) of a random Mamba
    with a byte-level BPE (GPT-2's kind: a word inside a text carries its space)."""
    tok = byte_level_bpe()
    torch.manual_seed(7)
    config = transformers.MambaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                      state_size=8, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    hf = transformers.MambaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in hf.backbone.layers:
            layer.mixer.out_proj.weight.mul_(5.0)  # tokens that vary (this seed: a few)
    folder = tmp_path_factory.mktemp("bad-words")
    hf.save_pretrained(folder / "ckpt")
    tok.save(str(folder / "ckpt" / "tokenizer.json"))
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(folder / "ckpt"), "--out",
                                      str(folder / "onnx")])
    assert result.exit_code == 0, result.output
    return folder / "ckpt", folder / "onnx", tok


def vllm_ids(tok, words) -> list[list[int]]:
    """vLLM's SamplingParams.update_from_tokenizer, on the tokenizers library."""
    out = []
    for word in words:
        alone = tok.encode(word.lstrip(), add_special_tokens=False).ids
        out.append(alone)
        spaced = tok.encode(" " + word.lstrip(), add_special_tokens=False).ids
        if spaced[0] != alone[0] and len(spaced) == len(alone):
            out.append(spaced)
    return out


def post_json(url: str, body: dict) -> tuple[int, dict]:
    r = requests.post(url, json=body, timeout=30)
    return r.status_code, r.json()


def hf_generate(folder, ids, **kwargs) -> list[int]:
    hf = transformers.MambaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, **kwargs)[0, len(ids):].tolist()


def test_a_requests_bad_words_are_banned_as_vllm_tokenizes_them(exported, tmp_path_factory):
    ckpt, out, tok = exported
    model = rt.load(out)
    ids = model.encode(PROMPT)
    plain = hf_generate(ckpt, ids)
    # a word of the plain answer that comes with its space folded into one token: only vLLM's
    # spaced variant bans it there; and one of two tokens as the answer has them
    spaced = next(t for t in plain if vllm_ids(tok, [tok.decode([t]).strip()])[1:] == [[t]])
    words = [tok.decode([spaced]).strip(), tok.decode(plain[1:3]), "never-seen-word"]
    banned = vllm_ids(tok, words)
    expected = hf_generate(ckpt, ids, bad_words_ids=banned)
    assert expected != plain and expected != hf_generate(ckpt, ids, bad_words_ids=banned[:1] + banned[2:])
    with plain_server(out, tmp_path_factory) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=out.name, prompt=ids, max_tokens=NEW, temperature=0,
                                           extra_body={"bad_words": words})
        assert answer.choices[0].token_ids == expected
        streamed = [t for chunk in client.completions.create(model=out.name, prompt=ids, max_tokens=NEW, temperature=0,
                                                             stream=True, extra_body={"bad_words": words})
                    for t in chunk.choices[0].token_ids]
        assert streamed == expected
        # no bad_words: the plain answer (nothing kept from one request to the next)
        answer = client.completions.create(model=out.name, prompt=ids, max_tokens=NEW, temperature=0)
        assert answer.choices[0].token_ids == plain
        # bad input: a 400 naming the field, the server unharmed
        for body, message in [({"bad_words": "Paris"}, 'bad_words: expected a list of words, got "Paris"'),
                              ({"bad_words": [" "]}, "bad_words: element 0: expected a word"),
                              ({"bad_words": ["ok", 7]}, "bad_words: element 1: expected a word"),
                              ({"bad_words": ["w"] * 257}, "bad_words: at most 256 words, got 257")]:
            status, reply = post_json(server.url + "/v1/completions",
                                      {"model": out.name, "prompt": ids, "max_tokens": 2} | body)
            assert status == 400 and reply["error"]["param"] == "bad_words", reply
            assert reply["error"]["message"].startswith(message), reply
        answer = client.completions.create(model=out.name, prompt=ids, max_tokens=NEW, temperature=0,
                                           extra_body={"bad_words": words})
        assert answer.choices[0].token_ids == expected


def test_the_words_ids_are_vllms_for_every_kind_of_word(exported):
    """Words with and without a leading space, of one token or several, a spaced form that is
    one token where the word alone is two (vLLM keeps only the first then), and text the
    tokenizer splits to bytes: the ids vLLM's rule takes on the tokenizers library."""
    _, out, tok = exported
    model = rt.load(out)
    words = ["20", " 20", "2020", "March", "Friday", "=", "日本語", "a b", " x  "]
    assert bad_words_ids(model.tokenizer, words) == [w for i, w in enumerate(vllm_ids(tok, words))
                                                   if w not in vllm_ids(tok, words)[:i]]


def test_bad_words_on_a_model_without_a_tokenizer_is_a_400_naming_it(checkpoint, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("no-tokenizer") / "onnx"
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(checkpoint), "--out", str(out)])
    assert result.exit_code == 0, result.output
    with plain_server(out, tmp_path_factory) as server:
        status, reply = post_json(server.url + "/v1/completions",
                                  {"prompt": [5, 6, 7], "max_tokens": 2, "bad_words": ["Paris"]})
        assert status == 400 and reply["error"]["param"] == "bad_words"
        assert reply["error"]["message"].startswith("bad_words: this model has no tokenizer")
