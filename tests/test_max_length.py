"""transformers' max_length (a row's ids in all: a language model's prompt and its new tokens, an
encoder-decoder's decoder start and its new tokens) and min_new_tokens replacing min_length, as
transformers' `generate` reads them from a checkpoint's generation_config.json.

The reference is transformers itself: `generate()` with no arguments on the model loaded from
the same folder (greedy and beam search, prompt by prompt), and its refusal of a prompt that
already reaches max_length. An encoder-decoder (no transformers class for it) is held to the
rule's arithmetic: its decoder start counts, so max_length L makes L - 1 new tokens.
"""

import json

import pytest
import torch
import transformers
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import InputError, UsageError
from seqexport.manifest import read_manifest
from seqexport.runtime.engine import Engine
from tests.test_generation_config import PROMPT, checkpoint, cli_ids, hf_generate, with_generation  # noqa: F401

LENGTH = len(PROMPT) + 6  # the prompt's 8 ids and 6 new tokens


def hf_generate_with(folder, prompt, **kwargs) -> list[int]:
    hf = transformers.MambaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]), **kwargs)[0, len(prompt):].tolist()


def until(tokens: list[int], eos: int) -> list[int]:
    """transformers' tokens up to its eos (seqexport's leave the eos out)."""
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


@pytest.mark.parametrize("config", [{"max_length": LENGTH}, {"max_length": LENGTH, "num_beams": 3},
                                    {"max_length": LENGTH, "max_new_tokens": 3}],
                         ids=["greedy", "beams", "max-new-tokens-wins"])
def test_a_checkpoints_max_length_counts_the_prompt_as_transformers_generate(checkpoint, tmp_path, config):  # noqa: F811
    folder, out = with_generation(checkpoint, tmp_path, **config)
    expected = hf_generate(folder, PROMPT)  # the folder's generation config decides
    assert len(expected) == config.get("max_new_tokens", LENGTH - len(PROMPT))
    assert read_manifest(out)["generation"]["defaults"] == config
    ours, log = cli_ids(out)
    assert ours == expected
    assert "does not apply" not in log
    if "max_new_tokens" not in config:
        assert f"max_length {LENGTH}" in log.split("using the model's generation defaults")[1].split("\n")[0]
    model = rt.load(out)
    assert rt.generate(model, [PROMPT])[0] == expected
    if "num_beams" not in config:  # the engine (what the Python API's server-side decode runs) too
        engine = Engine(model)
        req = engine.submit(PROMPT)
        engine.run_until_done()
        assert req.tokens == expected and req.finish_reason == "length"


def test_each_row_of_a_batch_stops_at_max_length_as_it_would_alone(checkpoint, tmp_path):  # noqa: F811
    """Prompts of 8, 5 and 2 tokens in one batch (greedy and beam search): each row makes
    max_length minus its own prompt's length, the tokens transformers decodes from it alone
    (transformers' own batches pad the prompts to one length; a row here decodes as alone)."""
    folder, out = with_generation(checkpoint, tmp_path, max_length=11)
    model = rt.load(out)
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:5]]
    for beams in (3, 1):
        expected = [hf_generate_with(folder, p, num_beams=beams) for p in prompts]
        assert [len(e) for e in expected] == [3, 6, 9]
        assert rt.generate(model, prompts, rt.model_options(model, num_beams=beams)) == expected
    # both given (the Python API): the tighter holds in each row
    both = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=2, max_length=9))
    assert both == [expected[0][:1], expected[1][:2], expected[2][:2]]
    # a forced eos at the row's last id (max_length - 1 before it), as transformers forces it
    forced = [hf_generate_with(folder, p, forced_eos_token_id=13) for p in prompts]
    assert all(f[-1] == 13 for f in forced)
    assert rt.generate(model, prompts, rt.model_options(model, forced_eos_token_id=13)) == forced
    # early_stopping "never" scores the best running beam at the longest length the row may
    # reach (an eos ends hypotheses early: each of the greedy tokens in turn)
    never = {"num_beams": 3, "early_stopping": "never", "length_penalty": 2.0}
    for eos in sorted({t for row in expected for t in row}):
        assert rt.generate(model, prompts, rt.model_options(model, eos_id=eos, **never)) == \
            [until(hf_generate_with(folder, p, eos_token_id=eos, pad_token_id=0, **never), eos) for p in prompts], eos


def test_a_prompt_that_reaches_max_length_is_refused_as_transformers_refuses_it(checkpoint, tmp_path):  # noqa: F811
    folder, out = with_generation(checkpoint, tmp_path, max_length=len(PROMPT))
    with pytest.raises(ValueError, match="but `max_length` is set to 8"):
        hf_generate(folder, PROMPT)
    result = CliRunner().invoke(cli, ["generate", str(out), "--ids", " ".join(map(str, PROMPT))])
    assert result.exit_code == 2
    assert "max_length 8 leaves no new token after the prompt's 8 tokens: expected a max_length above them, " \
           "or max_new_tokens" in result.output
    assert "Traceback" not in result.output
    model = rt.load(out)
    with pytest.raises(InputError, match="max_length 8 leaves no new token"):
        rt.generate(model, [PROMPT[:3], PROMPT])  # (a batch: the row named, nothing decoded)
    with pytest.raises(InputError, match="max_length 8 leaves no new token"):
        Engine(model).submit(PROMPT)
    # --max-new-tokens (or --max-length) given: the file's max_length is not the rule
    ours, _ = cli_ids(out, "--max-new-tokens", "4")
    assert ours == hf_generate_with(folder, PROMPT, max_new_tokens=4)
    ours, _ = cli_ids(out, "--max-length", str(len(PROMPT) + 2))
    assert ours == hf_generate_with(folder, PROMPT, max_length=len(PROMPT) + 2)


def test_min_new_tokens_replaces_min_length_as_transformers(checkpoint, tmp_path):  # noqa: F811
    """Both in a generation config: transformers sets min_length = prompt + min_new_tokens, so a
    larger min_length is not the rule (an eos may come after min_new_tokens)."""
    greedy = hf_generate_with(checkpoint, PROMPT, max_new_tokens=12)
    eos = greedy[3]  # the 4th greedy token as the eos: the decode would end there
    config = {"eos_token_id": eos, "min_new_tokens": 2, "min_length": len(PROMPT) + 10, "max_new_tokens": 12}
    folder, out = with_generation(checkpoint, tmp_path, **config)
    expected = hf_generate(folder, PROMPT)
    expected = expected[: expected.index(eos)] if eos in expected else expected
    assert len(expected) < 10  # the larger min_length did not hold eos back
    model = rt.load(out)
    assert rt.generate(model, [PROMPT], rt.model_options(model, eos_id=eos))[0] == expected
    alone = rt.generate(model, [PROMPT], rt.model_options(model, eos_id=eos, min_new_tokens=0))[0]
    assert len(alone) >= 10  # min_length alone holds it back


def test_an_encoder_decoders_max_length_counts_its_decoder_start(tmp_path):
    from seqexport.checkpoints.io import save_checkpoint
    from seqexport.checkpoints.presets import build_preset

    torch.manual_seed(0)
    ckpt = build_preset("transformer", "tiny", seed=0)
    folder = save_checkpoint(ckpt.model, ckpt.config, "transformer", tmp_path / "ckpt")
    (folder / "generation_config.json").write_text(json.dumps({"max_length": 5}))
    out = tmp_path / "onnx"
    result = CliRunner().invoke(cli, ["export", "transformer", "--checkpoint", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    model = rt.load(out)
    src = [5, 9, 14, 22, 31]
    longer = rt.generate(model, [src], rt.SearchOptions(max_new_tokens=8, eos_id=-1))[0]
    assert rt.generate(model, [src], rt.model_options(model, eos_id=-1))[0] == longer[:4]
    assert rt.generate(model, [src], rt.model_options(model, eos_id=-1, num_beams=2))[0] == \
        rt.generate(model, [src], rt.SearchOptions(max_new_tokens=4, eos_id=-1, num_beams=2))[0]
    limit = model.max_new_tokens_limit
    with pytest.raises(InputError, match=f"max_length {limit + 5} \\({limit + 4} new tokens\\) exceeds what the "
                                         f"model can hold: its decoder has {limit} positions"):
        rt.generate(model, [src], rt.SearchOptions(max_length=limit + 5))
    with pytest.raises(InputError, match="max_length 1 leaves no new token after its decoder start"):
        rt.generate(model, [src], rt.SearchOptions(max_length=1))


@pytest.mark.parametrize("options, message", [
    ({"max_length": 0}, "max_length must be >= 1, got 0"),
    ({"max_length": 4.0}, "max_length must be an integer, got 4.0"),
    ({"max_length": True}, "max_length must be an integer, got True"),
])
def test_a_bad_max_length_is_refused_naming_it(options, message):
    with pytest.raises(UsageError, match=message):
        rt.SearchOptions(**options)


def test_a_bad_max_length_in_a_checkpoint_stops_the_export(checkpoint, tmp_path):  # noqa: F811
    from tests.test_generation_config import export_with

    _, _, result = export_with(checkpoint, tmp_path, {"max_length": -2})
    assert result.exit_code == 2
    assert "max_length is -2; expected an integer >= 1" in result.output
