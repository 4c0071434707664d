"""A checkpoint's generation_config.json: its defaults reach the manifest, `generate`, the
Python API and the server; what seqexport cannot apply is said; bad values are refused.

The reference is transformers itself: `generate()` with no arguments on the model loaded from
the same folder decodes with that folder's generation config (greedy and beam search compared
token for token); a sampled decode is checked against transformers' logits (every token among
the top k the config names)."""

import json
import shutil

import openai
import pytest
import torch
import transformers
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import ArtifactError
from seqexport.manifest import read_manifest
from tests.test_serve import plain_server

PROMPT = [5, 17, 42, 8, 60, 3, 91, 11]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random Mamba checkpoint as transformers saves it (no eos: decodes run their full length)."""
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, state_size=8,
                                   eos_token_id=None, bos_token_id=None, pad_token_id=None)
    hf = transformers.MambaForCausalLM(cfg).eval()
    with torch.no_grad():  # logits far from flat: top-k and the beams' choices matter
        for layer in hf.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.5)
            layer.mixer.out_proj.weight.mul_(5.0)
    folder = tmp_path_factory.mktemp("gen") / "hf"
    hf.save_pretrained(folder)
    return folder


def export_with(checkpoint, tmp_path, config: dict) -> tuple:
    """A copy of the checkpoint whose generation_config.json holds `config`, and `seqexport export`
    run on it: (checkpoint, export folder, the CLI's result)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    (folder / "generation_config.json").write_text(json.dumps(config))
    out = tmp_path / "onnx"
    return folder, out, CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(folder), "--out", str(out)])


def with_generation(checkpoint, tmp_path, **config) -> tuple:
    """(checkpoint, export) of the checkpoint with a generation_config.json setting `config`."""
    folder, out, result = export_with(checkpoint, tmp_path, config)
    assert result.exit_code == 0, result.output
    return folder, out


def hf_generate(folder, prompt) -> list[int]:
    """transformers' generate with no arguments: the folder's generation config decides."""
    hf = transformers.MambaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]))[0, len(prompt):].tolist()


def cli_ids(out, *flags) -> tuple[list[int], str]:
    result = CliRunner().invoke(cli, ["generate", str(out), "--ids", " ".join(map(str, PROMPT)), *flags])
    assert result.exit_code == 0, result.output
    return [int(t) for t in result.stdout.split()], result.stderr


@pytest.mark.parametrize("config", [{"num_beams": 3, "max_new_tokens": 6},
                                    {"do_sample": False, "max_new_tokens": 5}], ids=["beams", "greedy"])
def test_generate_without_options_decodes_as_transformers_does_with_the_same_folder(checkpoint, tmp_path, config):
    folder, out = with_generation(checkpoint, tmp_path, **config)
    expected = hf_generate(folder, PROMPT)
    assert len(expected) == config["max_new_tokens"]
    ours, log = cli_ids(out)
    assert ours == expected
    assert f"max_new_tokens {config['max_new_tokens']}" in log
    # the Python API too: no options -> the model's defaults
    assert rt.generate(rt.load(out), [PROMPT])[0] == expected
    if "num_beams" in config:  # the beams chose otherwise than greedy would (or the test says nothing)
        assert ours != rt.generate(rt.load(out), [PROMPT], rt.SearchOptions(max_new_tokens=6))[0]


def test_sampling_defaults_are_applied_and_flags_override_them(checkpoint, tmp_path):
    folder, out = with_generation(checkpoint, tmp_path, do_sample=True, temperature=0.7, top_k=3, top_p=0.95,
                                  max_new_tokens=8, top_h=0.9)
    manifest = read_manifest(out)
    reference = transformers.GenerationConfig.from_pretrained(folder)  # how transformers reads the file
    assert manifest["generation"]["defaults"] == {k: getattr(reference, k) for k in
                                                  ("do_sample", "temperature", "top_k", "top_p", "max_new_tokens")}
    assert manifest["generation"]["not_applied"] == {"top_h": reference.top_h}
    hf = transformers.MambaForCausalLM.from_pretrained(folder).eval()
    seen = set()
    for seed in range(4):
        ours, log = cli_ids(out, "--seed", str(seed))
        assert len(ours) == 8
        with torch.no_grad():  # every sampled token among transformers' top 3 where it was picked
            logits = hf(torch.tensor([PROMPT + ours])).logits[0, len(PROMPT) - 1:-1]
        top3 = logits.topk(3).indices
        assert all(t in top3[i].tolist() for i, t in enumerate(ours)), (ours, top3)
        seen.add(tuple(ours))
    assert len(seen) > 1  # sampled: seeds give different answers
    assert "do_sample True, temperature 0.7, top_k 3, top_p 0.95, max_new_tokens 8" in log
    assert "top_h 0.9, which seqexport does not apply" in log
    # what was given wins; what was not keeps the model's
    greedy, _ = cli_ids(out, "--greedy")
    with torch.no_grad():
        # (top_h, which seqexport said it does not apply, is a sampling rule)
        assert greedy == hf.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=8)[0, 8:].tolist()
    wide, log = cli_ids(out, "--seed", "1", "--top-k", "0", "--max-new-tokens", "3")
    same = rt.generate(rt.load(out), [PROMPT], rt.SearchOptions(do_sample=True, temperature=0.7, top_k=0, top_p=0.95,
                                                                max_new_tokens=3, seed=1))[0]
    assert wide == same
    assert "top_k" not in log.split("generation defaults")[1].split("\n")[0]  # given, so not "taken"
    result = CliRunner().invoke(cli, ["inspect", str(out)])
    assert "generation defaults (generation_config.json): do_sample true, temperature 0.7" in result.output
    assert "not applied (tokens can differ from transformers' generate): top_h 0.9" in result.output


def test_a_request_that_leaves_sampling_out_takes_the_models_defaults(checkpoint, tmp_path, tmp_path_factory):
    _, out = with_generation(checkpoint, tmp_path, do_sample=True, temperature=3.0, top_k=40, top_p=0.9,
                             max_new_tokens=5, repetition_penalty=1.2)
    model = rt.load(out)

    def explicit(seed, **given):
        options = {"do_sample": True, "temperature": 3.0, "top_k": 40, "top_p": 0.9, "max_new_tokens": 5,
                   "repetition_penalty": 1.2, "seed": seed} | given
        return rt.generate(model, [PROMPT], rt.SearchOptions(**options))[0]

    # each default matters: leaving any one out changes some seed's tokens (or the test says nothing)
    for key, neutral in [("temperature", 1.0), ("top_k", 0), ("top_p", 1.0), ("repetition_penalty", 1.0)]:
        assert any(explicit(seed) != explicit(seed, **{key: neutral}) for seed in range(4)), key
    with plain_server(out, tmp_path_factory) as server:
        assert "take the model's generation defaults (generation_config.json): temperature 3.0, top_p 0.9, " \
               "top_k 40, max_new_tokens 5, repetition_penalty 1.2" in server.log_path.read_text()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        for seed in range(4):
            answer = client.completions.create(model=out.name, prompt=PROMPT, seed=seed)
            assert answer.choices[0].token_ids == explicit(seed)  # 5 tokens, each default applied
        given = client.completions.create(model=out.name, prompt=PROMPT, seed=3, max_tokens=7, temperature=0,
                                          extra_body={"top_k": 0})
        assert given.choices[0].token_ids == rt.generate(model, [PROMPT], rt.SearchOptions(max_new_tokens=7))[0]
    with plain_server(out, tmp_path_factory, "--generation-config", "none") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=out.name, prompt=PROMPT, seed=4)
        assert answer.choices[0].token_ids == explicit(4, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=16,
                                                       repetition_penalty=1.0)


@pytest.mark.parametrize("config, message", [
    ({"temperature": "hot"}, "temperature is \"hot\"; expected a number >= 0"),
    ({"top_p": 1.5}, "top_p is 1.5; expected a number in (0, 1]"),
    ({"do_sample": True, "temperature": 0}, "temperature 0 with do_sample true"),
    ({"max_new_tokens": 0}, "max_new_tokens is 0; expected an integer >= 1"),
    ({"do_sample": "yes"}, "do_sample is \"yes\"; expected true or false"),
])
def test_a_value_transformers_would_refuse_stops_the_export_naming_it(checkpoint, tmp_path, config, message):
    folder, out, result = export_with(checkpoint, tmp_path, config)
    assert result.exit_code == 2, result.output
    assert f"{folder / 'generation_config.json'}: {message}" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_a_checkpoint_without_generation_keys_keeps_none_and_old_manifests_still_load(checkpoint, tmp_path):
    _, out = with_generation(checkpoint, tmp_path, bos_token_id=None)  # only ids: nothing that changes a decode
    manifest = json.loads((out / "manifest.json").read_text())
    assert "generation" not in manifest
    model = rt.load(out)
    assert model.generation_defaults == {}
    assert len(rt.generate(model, [PROMPT])[0]) == 32  # SearchOptions' own default


@pytest.mark.parametrize("record, field", [
    ({"file": "generation_config.json", "defaults": {"top_p": 2}, "not_applied": {}}, "top_p"),
    ({"file": "generation_config.json", "defaults": {"beams": 2}, "not_applied": {}}, "beams"),
    ({"file": "generation_config.json", "defaults": {}}, "not_applied"),
    ("greedy", "generation"),
])
def test_a_malformed_generation_record_is_refused_naming_it(checkpoint, tmp_path, record, field):
    _, out = with_generation(checkpoint, tmp_path, do_sample=True)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps(manifest | {"generation": record}))
    with pytest.raises(ArtifactError, match=f"field 'generation'.*{field}"):
        rt.load(out)
