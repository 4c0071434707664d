"""Sharded checkpoints (checkpoints/shards.py), as `save_pretrained` writes every Hub model of a
few billion parameters: an index and the shards it names. One exports, validates and decodes
as transformers' own model does; the source digest covers every shard; a broken layout is one
line naming what is wrong, exit 2, nothing written."""

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import seqexport.runtime as rt
from seqexport.checkpoints.io import checkpoint_sha256, load_checkpoint
from seqexport.cli import cli
from tests.test_hybrid_model import VOCAB, _randomize
from tests.test_mamba2_model import _hf_model as _hf_mamba2

transformers = pytest.importorskip("transformers")

INDEX = "model.safetensors.index.json"
SHARD_SIZE = "40KB"  # the tiny Granite below comes out in 12 shards


def _granite_tied():
    """A dense Granite-4.0-H layout with tied embeddings: the shards store the head once."""
    config = transformers.GraniteMoeHybridConfig(
        hidden_size=64, num_hidden_layers=3, vocab_size=VOCAB, shared_intermediate_size=96, num_local_experts=0,
        layer_types=["linear_attention", "full_attention", "linear_attention"], num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
        mamba_chunk_size=16, position_embedding_type="rope", tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    torch.manual_seed(3)
    hf = _randomize(transformers.GraniteMoeHybridForCausalLM(config), seed=3)
    hf.tie_weights()
    return hf


def _shards(folder) -> list[str]:
    return sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    hf = _granite_tied()
    folder = tmp_path_factory.mktemp("granite") / "hf"
    hf.save_pretrained(folder, max_shard_size=SHARD_SIZE)
    return hf, folder


def _export(checkpoint, out, family="hybrid"):
    return CliRunner().invoke(cli, ["export", family, "--checkpoint", str(checkpoint), "--out", str(out)])


def test_a_sharded_hybrid_exports_validates_and_decodes_as_transformers(sharded, tmp_path):
    hf, folder = sharded
    assert not (folder / "model.safetensors").exists() and len(_shards(folder)) >= 3
    assert "lm_head.weight" not in json.loads((folder / INDEX).read_text())["weight_map"]  # tied: stored once
    result = _export(folder, tmp_path / "onnx")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "onnx" / "manifest.json").read_text())
    assert manifest["source"]["checkpoint"] == str(folder.resolve())
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "onnx"), "--steps", "6"])
    assert result.exit_code == 0, result.output
    prompt = [5, 17, 42, 8, 60, 3, 91, 11, 29, 77, 40, 2, 13, 88, 54, 19, 6, 33]
    ours = rt.generate(rt.load(tmp_path / "onnx"), [prompt], rt.SearchOptions(max_new_tokens=10, eos_id=-1))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref and len(set(ours)) > 2


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_sharded_and_single_file_saves_load_the_same_weights(tmp_path, family):
    if family == "mamba":
        torch.manual_seed(0)
        hf = transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=97, hidden_size=32,
                                                                    num_hidden_layers=3, state_size=8))
    else:
        hf = _hf_mamba2(ngroups=2)
    hf.save_pretrained(tmp_path / "one")
    hf.save_pretrained(tmp_path / "many", max_shard_size="20KB")
    assert len(_shards(tmp_path / "many")) >= 3
    one, many = load_checkpoint(tmp_path / "one", family), load_checkpoint(tmp_path / "many", family)
    a, b = one.model.state_dict(), many.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert one.sha256 != many.sha256  # a digest of the files: different files


def test_a_sharded_torch_checkpoint_loads(tmp_path):
    """`pytorch_model.bin.index.json`, the layout of older Hub checkpoints: torch.save per shard
    and an index, which transformers itself still reads (checked first, so the layout written
    here is the real one)."""
    torch.manual_seed(1)
    hf = transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=97, hidden_size=32,
                                                                num_hidden_layers=2, state_size=8)).eval()
    folder = tmp_path / "bin"
    hf.config.save_pretrained(folder)
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[:4], names[4:9], names[9:])):
        shard = f"pytorch_model-0000{i + 1}-of-00003.bin"
        torch.save({k: state[k] for k in part}, folder / shard)
        weight_map |= dict.fromkeys(part, shard)
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    prompt = torch.tensor([[5, 17, 42, 8, 60, 3]])
    with torch.no_grad():
        again = transformers.MambaForCausalLM.from_pretrained(folder, local_files_only=True).eval()
        assert torch.equal(again(prompt).logits, hf(prompt).logits)
    ours = load_checkpoint(folder, "mamba").model.state_dict()
    converted = load_checkpoint(_single(hf, tmp_path / "one"), "mamba").model.state_dict()
    assert ours.keys() == converted.keys() and all(torch.equal(ours[k], converted[k]) for k in ours)


def _single(hf, folder):
    hf.save_pretrained(folder)
    return folder


def test_the_source_digest_covers_every_shard(sharded, tmp_path):
    _, original = sharded
    folder = tmp_path / "hf"
    shutil.copytree(original, folder)
    result = _export(folder, tmp_path / "onnx")
    assert result.exit_code == 0, result.output
    before = checkpoint_sha256(folder)
    last = folder / _shards(folder)[-1]
    tensors = load_file(last)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, last, metadata={"format": "pt"})
    assert checkpoint_sha256(folder) != before
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "onnx"), "--steps", "2"])
    assert result.exit_code == 2 and "changed since export" in result.output, result.output


def _edit_index(change):
    def damage(folder):
        index = json.loads((folder / INDEX).read_text())
        change(index["weight_map"], _shards(folder))
        (folder / INDEX).write_text(json.dumps(index))
    return damage


def _write(text):
    return lambda folder: (folder / INDEX).write_text(text)


def _last_shard_name(weight_map, shards):
    return next(k for k, v in sorted(weight_map.items()) if v == shards[-1])


def _move_to_first(weight_map, shards):
    weight_map[_last_shard_name(weight_map, shards)] = shards[0]


def _forget(weight_map, shards):
    del weight_map[_last_shard_name(weight_map, shards)]


def _copy_into_last(folder):
    """A stale shard: the last one also holds a tensor the index puts in the first."""
    shards = _shards(folder)
    first, last = load_file(folder / shards[0]), load_file(folder / shards[-1])
    extra = sorted(first)[0]
    save_file(last | {extra: first[extra]}, folder / shards[-1], metadata={"format": "pt"})
    return extra


def _truncate_last(folder):
    last = folder / _shards(folder)[-1]
    last.write_bytes(last.read_bytes()[:100])


@pytest.mark.parametrize("damage, message", [
    (_write("{not json"), "model.safetensors.index.json is corrupt (not valid JSON"),
    (_write("[1, 2]"), "model.safetensors.index.json must hold a JSON object, found list"),
    (_write('{"metadata": {}}'), "has no 'weight_map': expected an object naming the shard file of every tensor"),
    (_write('{"weight_map": {}}'), "has 'weight_map' {}: expected an object"),
    (_edit_index(lambda m, s: m.update({"lm_head.weight": 3})), "the shard of 'lm_head.weight' is 3, expected a file name"),
    (_edit_index(lambda m, s: m.update({"lm_head.weight": "../model.safetensors"})),
     "the shard of 'lm_head.weight' is '../model.safetensors', expected the name of a file in the same folder"),
    (_edit_index(lambda m, s: m.update({"lm_head.weight": "/etc/hostname"})), "is '/etc/hostname', expected the name"),
    (lambda folder: (folder / _shards(folder)[1]).unlink(), "names 1 shard file(s) the folder does not have: model-00002-of-"),
    (_edit_index(_move_to_first), "which model.safetensors.index.json puts in it"),
    (_edit_index(_forget), "(not listed); is it a shard of another save?"),
    (_copy_into_last, "(listed in model-00001-of-"),
    (_truncate_last, "cannot read weights"),
])
def test_a_broken_sharded_layout_is_one_line_exit_2(sharded, tmp_path, damage, message):
    folder = tmp_path / "hf"
    shutil.copytree(sharded[1], folder)
    damage(folder)
    result = _export(folder, tmp_path / "out")
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", [INDEX, "shard", "config.json"])
def test_a_file_of_a_checkpoint_folder_is_refused_naming_the_folder(sharded, tmp_path, name):
    folder = sharded[1]
    path = folder / (_shards(folder)[0] if name == "shard" else name)
    result = _export(path, tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert f"is one file of the checkpoint folder {str(folder)!r}: give the folder" in result.output
