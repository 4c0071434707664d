"""A real checkpoint's tokenizer: transformers' MambaForCausalLM + a `tokenizers` BPE trained here
(no downloads) -> export -> validate -> `seqexport generate --text` prints what transformers
generates, decoded by the same tokenizer, and stops at the checkpoint's eos."""

import json
import shutil

import pytest
import torch
import transformers  # the independent reference: a missing package fails, never skips
from click.testing import CliRunner
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import seqexport.runtime as rt
from seqexport.checkpoints.tokenizers import special_ids
from seqexport.cli import cli
from seqexport.errors import ArtifactError
from seqexport.runtime.tokenizer import HFTokenizer
from seqexport.training.dates import make_split

VOCAB = 320
PROMPT = "Friday, 5 März 2021 — the dates 1984-05-09 and"  # non-ASCII: byte-level pieces


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = [f"{x} = {y}" for x, y in make_split("train", 3000, seed=1)] + [PROMPT, "März über Straße"]
    tok.train_from_iterator(text, trainer)
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tok = train_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=8)
    hf = transformers.MambaForCausalLM(cfg).eval()
    with torch.no_grad():  # outputs that depend on every part (see tests/test_hf_workflow.py)
        for layer in hf.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.5)
            layer.mixer.dt_proj.bias.uniform_(-3.0, 0.0)
            layer.mixer.out_proj.weight.mul_(5.0)
    ids = tok.encode(PROMPT).ids
    with torch.no_grad():  # greedy without eos, to pick an eos the decode will meet
        free = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(ids):].tolist()
    eos = next(t for i, t in enumerate(free) if i >= 3 and t not in free[:i])
    folder = tmp_path_factory.mktemp("hf-bpe")
    hf.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    for name in ("config.json", "generation_config.json"):
        data = json.loads((folder / name).read_text()) if (folder / name).exists() else {}
        (folder / name).write_text(json.dumps(data | {"eos_token_id": eos, "bos_token_id": 0, "pad_token_id": 0}))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=eos,
                          pad_token_id=0)[0, len(ids):].tolist()
    assert ref[-1] == eos and len(ref) < 12  # transformers stopped at the eos
    return folder, tok, eos, ref[:-1]


def test_export_validate_generate_text_with_the_checkpoints_tokenizer(checkpoint, tmp_path):
    folder, tok, eos, expected = checkpoint
    out = tmp_path / "onnx"
    runner = CliRunner()
    result = runner.invoke(cli, ["export", "mamba", "--checkpoint", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["tokenizer"]
    assert record["type"] == "hf" and record["eos_id"] == eos and record["bos_id"] == 0
    assert (out / record["file"]).read_bytes() == (folder / "tokenizer.json").read_bytes()
    result = runner.invoke(cli, ["validate", str(out), "--steps", "6"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["generate", str(out), "--text", PROMPT, "--max-new-tokens", "12"])
    assert result.exit_code == 0, result.output
    assert result.stdout == tok.decode(expected, skip_special_tokens=True) + "\n"
    model = rt.load(out)
    ids = rt.generate(model, [tok.encode(PROMPT).ids], rt.SearchOptions(max_new_tokens=12))[0]
    assert ids == expected  # stopped at the checkpoint's eos, which is not included
    longer = runner.invoke(cli, ["generate", str(out), "--text", PROMPT, "--max-new-tokens", "12",
                                 "--eos-id", "1"])
    assert longer.exit_code == 0 and len(longer.stdout) > len(result.stdout)  # --eos-id overrides


def test_a_changed_tokenizer_file_is_refused(checkpoint, tmp_path):
    folder, *_ = checkpoint
    out = tmp_path / "onnx"
    assert CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(folder), "--out", str(out)]).exit_code == 0
    path = out / "tokenizer.json"
    path.write_text(path.read_text().replace("<unk>", "<UNK>"))
    with pytest.raises(ArtifactError, match=r"^tokenizer: sha256 of .*tokenizer.json is .*\(file altered\)"):
        rt.load(out)



def test_special_ids_take_every_listed_eos_and_each_must_lie_in_the_vocabulary(checkpoint, tmp_path):
    """generation_config.json may list several eos ids: the first is the record's eos_id, all of
    them its eos_ids (one id: no eos_ids, as before); an id at the vocabulary's size, first or
    not, is refused at export, naming it, and nothing is written; the vocabulary's last id is
    taken."""
    folder, _, eos, _ = checkpoint
    listed = tmp_path / "listed"
    shutil.copytree(folder, listed)
    (listed / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 3, eos], "bos_token_id": 0}))
    ids = special_ids(listed, HFTokenizer(listed / "tokenizer.json"))
    assert ids["eos_id"] == eos and ids["eos_ids"] == [eos, 3]  # each once, in order
    (listed / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    assert "eos_ids" not in special_ids(listed, HFTokenizer(listed / "tokenizer.json"))
    runner = CliRunner()
    for eos_ids, code in ((VOCAB, 2), ([3, VOCAB], 2), (VOCAB - 1, 0)):
        (listed / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
        out = tmp_path / f"onnx-{code}-{len(str(eos_ids))}"
        result = runner.invoke(cli, ["export", "mamba", "--checkpoint", str(listed), "--out", str(out)])
        assert result.exit_code == code, result.output
        if code:
            assert f"{VOCAB} of {listed}" in result.output and f"outside the vocabulary [0, {VOCAB})" in result.output
            assert "Traceback" not in result.output and not out.exists()
        else:
            assert json.loads((out / "manifest.json").read_text())["tokenizer"]["eos_id"] == VOCAB - 1


def test_a_tokenizer_side_file_that_cannot_be_read_is_named(checkpoint, tmp_path):
    """A folder where tokenizer_config.json should be was a bare IsADirectoryError traceback
    at export; now one line naming the file, and nothing written."""
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint[0], folder)
    (folder / "tokenizer_config.json").mkdir()
    out = tmp_path / "onnx"
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(folder), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {folder / 'tokenizer_config.json'}: cannot read it (Is a directory)"
    assert not out.exists()


@pytest.fixture(scope="module")
def two_eos(checkpoint, tmp_path_factory):
    """The checkpoint with generation_config listing two eos ids, the one the greedy decode meets
    second (end of text first, end of turn after, as Llama 3 lists them), exported; and what
    transformers' generate gives with that list."""
    folder, tok, eos, _ = checkpoint
    root = tmp_path_factory.mktemp("two-eos")
    listed = root / "hf"
    shutil.copytree(folder, listed)
    hf = transformers.MambaForCausalLM.from_pretrained(listed).eval()
    ids = tok.encode(PROMPT).ids
    with torch.no_grad():
        free = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(ids):].tolist()
    other = next(t for t in range(2, VOCAB) if t not in free)  # an eos this decode never meets
    eos_ids = [other, eos]
    for name in ("config.json", "generation_config.json"):
        data = json.loads((listed / name).read_text())
        (listed / name).write_text(json.dumps(data | {"eos_token_id": eos_ids}))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=eos_ids,
                          pad_token_id=0)[0, len(ids):].tolist()
    assert ref[-1] == eos and len(ref) < 12  # transformers stopped at the second listed id
    out = root / "onnx"
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(listed), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, tok, eos_ids, ref[:-1]


def test_a_decode_stops_at_any_of_the_checkpoints_eos_ids_as_transformers_does(two_eos):
    """Every decode path (generate(), the CLI's stream, the serving engine) stops
    at the second listed eos; the text decoded stops there too."""
    from seqexport.runtime.engine import Engine

    out, tok, eos_ids, expected = two_eos
    record = json.loads((out / "manifest.json").read_text())["tokenizer"]
    assert record["eos_id"] == eos_ids[0] and record["eos_ids"] == eos_ids
    model = rt.load(out)
    assert model.tokenizer.eos_ids == tuple(eos_ids)
    prompt = tok.encode(PROMPT).ids
    assert rt.generate(model, [prompt], rt.SearchOptions(max_new_tokens=12))[0] == expected
    engine = Engine(model, max_rows=2).start()
    try:
        req = engine.submit(prompt, rt.SearchOptions(max_new_tokens=12))
        assert req.wait(60)
    finally:
        engine.close()
    assert req.tokens == expected and req.finish_reason == "stop"
    result = CliRunner().invoke(cli, ["generate", str(out), "--text", PROMPT, "--max-new-tokens", "12"])
    assert result.exit_code == 0, result.output
    assert result.stdout == tok.decode(expected, skip_special_tokens=True) + "\n"
    assert model.tokenizer.decode(expected + [eos_ids[1], 5, 6]) == tok.decode(expected, skip_special_tokens=True)


def test_eos_ids_given_on_the_command_line_replace_the_checkpoints(two_eos):
    """--eos-id repeated: any of those ends a row, the checkpoint's do not; one --eos-id that
    never comes: all 12 tokens."""
    out, tok, eos_ids, expected = two_eos
    runner = CliRunner()
    both = runner.invoke(cli, ["generate", str(out), "--ids", " ".join(map(str, tok.encode(PROMPT).ids)),
                               "--max-new-tokens", "12", "--eos-id", str(eos_ids[0]), "--eos-id", str(eos_ids[1])])
    assert both.exit_code == 0, both.output
    assert both.stdout == tok.decode(expected, skip_special_tokens=True) + "\n"
    one = runner.invoke(cli, ["generate", str(out), "--text", PROMPT, "--max-new-tokens", "12", "--eos-id", str(eos_ids[0])])
    assert one.exit_code == 0 and len(one.stdout) > len(both.stdout)  # the checkpoint's second eos no longer stops it
    model = rt.load(out)
    never = rt.generate(model, [tok.encode(PROMPT).ids], rt.SearchOptions(max_new_tokens=12, eos_id=eos_ids[0]))[0]
    assert len(never) == 12 and never[: len(expected) + 1] == expected + [eos_ids[1]]


@pytest.mark.parametrize("eos_ids, why", [(["x"], "'x'"), ([], "non-empty list"), (7, "non-empty list"),
                                          ("first", "must start with the eos_id")])
def test_a_malformed_eos_ids_record_is_refused_naming_it(two_eos, tmp_path, eos_ids, why):
    out, _, listed, _ = two_eos
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["tokenizer"]["eos_ids"] = [listed[1], listed[0]] if eos_ids == "first" else eos_ids
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="eos_ids") as e:
        rt.load(copy)
    assert why in str(e.value)


def test_an_artifact_from_before_eos_ids_stops_at_its_one_eos(two_eos, tmp_path):
    """A record without eos_ids (every export before them): its eos_id is the one stop."""
    out, tok, eos_ids, _ = two_eos
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["tokenizer"]["eos_ids"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    model = rt.load(copy)
    assert model.tokenizer.eos_ids == (eos_ids[0],)
    assert len(rt.generate(model, [tok.encode(PROMPT).ids], rt.SearchOptions(max_new_tokens=12))[0]) == 12

def test_streamed_text_never_splits_a_character(checkpoint):
    from seqexport.runtime.tokenizer import HFTokenizer, TextStream

    folder, tok, *_ = checkpoint
    ours = HFTokenizer(folder / "tokenizer.json")
    ids = tok.encode("über März Straße ✓").ids
    stream = TextStream(ours)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) == "über März Straße ✓"
    assert all("\ufffd" not in p for p in pieces)
