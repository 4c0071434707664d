"""seqexport validate on real onnxruntime-genai model folders: its own model builder (in its venv,
.venv-peers/genai, built on first use by scripts/peers.sh) makes float32 and int4 folders offline
from a tiny random transformers Llama; they are judged against transformers' LlamaForCausalLM.
float32 passes in mixed chunks; int4 is judged by the quantised rule; a float32 copy with one
weight moved by +-1e-2 fails naming the position, the call and the layer; and a builder output
whose logits come from the wrong layer (the builder's own bug, below) fails."""

import json
import shutil

import pytest
import torch
import transformers
from click.testing import CliRunner
from tokenizers import Tokenizer, models, pre_tokenizers

from seqexport.cli import cli
from tests.foreign_peers import (
    failing,
    figures,
    made_once,
    peer_python,
    perturbed,
    run_peer,
    validate,
)

VOCAB = 128


def tiny_llama(folder, intermediate_size: int = 96) -> None:
    """A random Llama with a word-level tokenizer (the builder loads one) saved by transformers."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=intermediate_size,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # larger than the init's 0.02: logits that tell a wrong weight apart
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.eval().save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>",
                                         eos_token="</s>").save_pretrained(folder)


def build(python, checkpoint, out, precision: str) -> None:
    run_peer([python, "-m", "onnxruntime_genai.models.builder", "-i", checkpoint, "-o", out, "-p", precision,
              "-e", "cpu", "-c", out.parent / f"cache-{out.name}"], f"genai builder -p {precision}")


@pytest.fixture(scope="session")
def genai(tmp_path_factory, worker_id):
    """{name: folder}: the checkpoint and the builder's fp32 and int4 folders, made once."""
    with made_once(tmp_path_factory, worker_id, "genai-folders") as (root, done):
        if not done:
            python = peer_python("genai")
            tiny_llama(root / "llama")
            for precision in ("fp32", "int4"):
                build(python, root / "llama", root / precision, precision)
            (root / "done").write_text("")
    return {name: root / name for name in ("llama", "fp32", "int4")}


def test_float32_folder_passes_in_mixed_chunks(genai, tmp_path):
    config = json.loads((genai["fp32"] / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True  # genai's own mode; a growing past here
    result, report = validate(genai["fp32"], genai["llama"], tmp_path)
    assert result.exit_code == 0, result.output
    assert report["adapter"] == "genai" and "LlamaForCausalLM" in report["family"]
    label = report["checks"]["teacher_forced"]["cases"][0]["label"]
    assert "calls [3, 1, 4, 1, 2, 3" in label and "batch 2" in label  # several tokens after a past, two rows
    outs = figures(report)
    for i in range(2):  # every layer's K/V, transformers' layout [b, kv_heads, past, head_size]
        for kv in ("key", "value"):
            assert outs[f"final past_key_values.{i}.{kv}"] < 1e-4
    assert report["map"]["graphs"]["step"]["dims"] == {"kv_cache_dim": 16}  # head_size, from genai_config.json
    print("genai fp32", outs)


def test_int4_folder_is_judged_by_the_quantised_rule(genai, tmp_path):
    """The verdict is reported, not asserted: on this random model (Gaussian weights, no outliers,
    the head int4 too) the builder's int4 logits are 43% off transformers' (relative L2), the same
    as ORT's own MatMulNBits quantizer (block 32, symmetric) gives on the float32 folder."""
    result, report = validate(genai["int4"], genai["llama"], tmp_path)
    assert report["dtype"] == "int4" and report["rule"].startswith("int4")  # MatMulNBits found in the graph
    notes = [c["note"] for check in report["checks"].values() for c in check["cases"]]
    assert "top-1 agreement" in notes[0] and all("picks are the reference's argmax" in n for n in notes[1:])
    assert result.exit_code == (0 if report["passed"] else 1), result.output
    print("genai int4", figures(report), notes)


def test_float32_copy_with_a_moved_weight_fails(genai, tmp_path):
    """Layer 0's MLP down projection moved by +-1e-2: logits differ from position 0 (call 0), layer
    0's K/V (made before that MLP) agree, layer 1's (after it) do not."""
    bad = perturbed(genai["fp32"], tmp_path / "moved", "model.layers.0.mlp.down_proj.MatMul.weight")
    result, report = validate(bad, genai["llama"], tmp_path)
    assert result.exit_code == 1, result.output
    failed = failing(report)
    assert "logits position 0" in failed
    assert "final past_key_values.1.key" in failed and "final past_key_values.0.key" not in failed
    assert "first diverging position 0: call 0" in result.output
    assert "first layer whose state diverges: layer 1" in result.output
    # the residual stream after layer 0 is the next norm's fused sum (SkipSimplifiedLayerNormalization)
    assert "first diverging layer: model.layers.0 (graph value /model/layers.1/input_layernorm/output_3)" \
        in result.output
    assert any("a real divergence" in c["note"] for c in report["checks"]["free_running"]["cases"])
    print("genai fp32 moved", figures(report))


def test_builder_output_with_logits_from_the_wrong_layer_fails(genai, tmp_path):
    """onnxruntime-genai 0.18's builder takes every nn.Linear with vocab_size outputs for the LM
    head: with intermediate_size == vocab_size it feeds the head from layer 0's MLP norm, the final
    norm left dangling. The K/V are right, the logits are not: validate names position 0."""
    ckpt = tmp_path / "llama-128"
    tiny_llama(ckpt, intermediate_size=VOCAB)
    build(peer_python("genai"), ckpt, tmp_path / "fp32", "fp32")
    result, report = validate(tmp_path / "fp32", ckpt, tmp_path)
    assert result.exit_code == 1, result.output
    failed = failing(report)
    assert "logits position 0" in failed and not any(n.startswith("final") for n in failed)
    assert "no single layer's output diverges" in result.output  # layer 0's output is right: the head is not
    print("genai head mix-up", figures(report))


def test_inspect_shows_the_genai_map(genai):
    result = CliRunner().invoke(cli, ["inspect", str(genai["fp32"])])
    assert result.exit_code == 0, result.output
    assert "adapter genai (decoder)" in result.output
    assert "past_key_values.1.value <- present.1.value (appended)" in result.output
    assert "several tokens after a past: 1 row a call" in result.output


@pytest.mark.parametrize("damage, message", [
    (lambda c: c["model"].pop("decoder"), "no model.decoder section"),
    (lambda c: c["model"]["decoder"]["inputs"].update(past_key_names="past.key"), "one %d for the layer"),
    (lambda c: c["model"]["decoder"]["outputs"].pop("present_value_names"), "'present_value_names' output"),
])
def test_a_damaged_genai_config_is_refused(genai, tmp_path, damage, message):
    folder = tmp_path / "damaged"
    shutil.copytree(genai["fp32"], folder)
    config = json.loads((folder / "genai_config.json").read_text())
    damage(config)
    (folder / "genai_config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(genai["llama"])])
    assert result.exit_code == 2 and message in result.output, result.output


def test_float32_folder_passes_on_openvino_at_batch_1(genai, tmp_path):
    """The same folder compiled by OpenVINO: batch 1 passes. (OpenVINO 2026.4.1 refuses this graph
    at batch 2 in a Reshape on the first call: docs/validate-other-tools.md.)"""
    pytest.importorskip("openvino")
    result, report = validate(genai["fp32"], genai["llama"], tmp_path, "--runtime", "openvino", "--batch", "1")
    assert result.exit_code == 0, result.output
    assert "openvino" in report["provider"].lower() or "openvino" in result.output
    print("genai fp32 openvino batch 1", figures(report))
