"""seqexport validate on real Optimum exports (optimum-cli in its own venv, .venv-peers/optimum,
built on first use by scripts/peers.sh under a lock): a tiny random Marian (encoder-decoder,
merged and separate decoders) and a tiny random Llama (decoder-only) pass against transformers'
own classes; a copy with one decoder weight moved by +-1e-2 fails with exit 1, naming the
position, the call and the output; a MatMulNBits copy is judged by the quantised rule."""

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers
from click.testing import CliRunner
from onnx import numpy_helper

from seqexport.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("SEQEXPORT_PEERS", ROOT / ".venv-peers"))  # as scripts/peers.sh reads it
PEER = PEERS / "optimum"


def shared_root(tmp_path_factory, worker_id, name) -> Path:
    """A folder every xdist worker of this session shares (their temporary folders' parent)."""
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if worker_id != "master" else root) / name
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session")
def optimum_cli():
    """optimum-cli of the peer venv, built once (a few minutes with PyPI) and kept."""
    PEERS.mkdir(parents=True, exist_ok=True)
    with open(PEERS / ".optimum.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = subprocess.run(["bash", str(ROOT / "scripts" / "peers.sh"), "optimum"], capture_output=True,
                               text=True)
        assert build.returncode == 0, build.stderr[-3000:]
    return PEER / "bin" / "optimum-cli"


def tiny_checkpoints(root: Path) -> dict:
    """Random tiny checkpoints, saved by transformers' classes (a layout transformers 4.57 reads)."""
    torch.manual_seed(0)
    marian = transformers.MarianConfig(
        vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=95, decoder_start_token_id=95, eos_token_id=0)
    llama = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)
    models = {"marian": transformers.MarianMTModel(marian), "llama": transformers.LlamaForCausalLM(llama)}
    out = {}
    for name, model in models.items():
        with torch.no_grad():  # larger than the init's 0.02: logits that tell a wrong weight apart
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.2)
        model.eval().save_pretrained(root / name)
        out[name] = root / name
    return out


TASKS = {"marian": "text2text-generation-with-past", "llama": "text-generation-with-past"}


@pytest.fixture(scope="session")
def optimum_exports(optimum_cli, tmp_path_factory, worker_id):
    """{name: (checkpoint, Optimum export)}, made once for all workers by optimum-cli itself."""
    root = shared_root(tmp_path_factory, worker_id, "optimum-exports")
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").is_file():
            ckpts = tiny_checkpoints(root / "checkpoints")
            for name, ckpt in ckpts.items():
                run = subprocess.run([str(optimum_cli), "export", "onnx", "--model", str(ckpt), "--task", TASKS[name],
                                      str(root / name)], capture_output=True, text=True,
                                     env=os.environ | {"HF_HUB_OFFLINE": "1"})
                assert run.returncode == 0, run.stderr[-3000:]
            (root / "done").write_text("")
    return {name: (root / "checkpoints" / name, root / name) for name in TASKS}


def validate(folder, reference, tmp_path, *extra):
    report = tmp_path / f"report-{Path(folder).name}.json"
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(reference), "--steps", "12",
                                      "--report", str(report), *extra])
    return result, (json.loads(report.read_text()) if report.is_file() else None)


def figures(report) -> dict:
    """{output: max abs} of every case (the note's figures)."""
    return {o["name"]: o["max_abs"] for check in report["checks"].values() for c in check["cases"]
            for o in c["outputs"]}


def matmul_weight(model: onnx.ModelProto, scope: str) -> str:
    """The weight initializer of the MatMul whose node name starts with `scope` (If branches included)."""
    def nodes(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                if a.HasField("g"):
                    yield from nodes(a.g)
    names = {i.name for i in model.graph.initializer}
    return next(n.input[1] for n in nodes(model.graph) if n.op_type == "MatMul" and n.name.startswith(scope)
                and n.input[1] in names)


def perturbed(folder, tmp_path, graph, scope, delta=1e-2):
    """A copy with every element of one weight moved by +-delta (random signs)."""
    out = tmp_path / f"perturbed-{Path(folder).name}"
    shutil.copytree(folder, out)
    model = onnx.load(str(out / graph))
    name = matmul_weight(model, scope)
    init = next(i for i in model.graph.initializer if i.name == name)
    w = numpy_helper.to_array(init)
    signs = np.random.default_rng(0).choice([-1, 1], w.shape).astype(w.dtype)
    init.CopyFrom(numpy_helper.from_array(w + signs * np.float32(delta), name))
    onnx.save(model, str(out / graph))
    return out


def test_marian_merged_decoder_passes(optimum_exports, tmp_path):
    ckpt, folder = optimum_exports["marian"]
    result, report = validate(folder, ckpt, tmp_path)
    assert result.exit_code == 0, result.output
    assert report["passed"] and report["adapter"] == "optimum"
    assert "MarianMTModel" in report["family"]
    outs = figures(report)
    # every layer's self K/V (appended) and cross K/V (static) compared with transformers' cache
    for i in range(2):
        for kv in ("decoder.key", "decoder.value", "encoder.key", "encoder.value"):
            assert outs[f"final past_key_values.{i}.{kv}"] < 1e-4
    cases = report["checks"]["teacher_forced"]["cases"]
    assert "calls [3, 1, 1" in cases[0]["label"]  # the merged graph's with-past branch: one token a call
    print("marian merged", outs)


def test_the_tolerance_given_is_the_one_judged_by(optimum_exports, tmp_path):
    """--atol/--rtol reach a foreign artifact's checks: at 0 the correct Marian fails on float
    rounding alone (ONNX Runtime and torch add in other orders), and the report says 0."""
    ckpt, folder = optimum_exports["marian"]
    result, report = validate(folder, ckpt, tmp_path, "--atol", "0", "--rtol", "0")
    assert result.exit_code == 1, result.output
    assert report["atol"] == 0 and report["rtol"] == 0 and not report["passed"]


def test_marian_separate_decoders_pass(optimum_exports, tmp_path):
    ckpt, folder = optimum_exports["marian"]
    split = tmp_path / "marian-split"
    shutil.copytree(folder, split, ignore=shutil.ignore_patterns("decoder_model_merged.onnx"))
    result, report = validate(split, ckpt, tmp_path)
    assert result.exit_code == 0, result.output
    print("marian split", figures(report))


def test_llama_passes_in_mixed_chunks(optimum_exports, tmp_path):
    ckpt, folder = optimum_exports["llama"]
    result, report = validate(folder, ckpt, tmp_path)
    assert result.exit_code == 0, result.output
    label = report["checks"]["teacher_forced"]["cases"][0]["label"]
    assert "calls [3, 1, 4, 1, 2, 3" in label  # several tokens a call from a past, as a user feeds them
    assert all(c["passed"] for c in report["checks"]["free_running"]["cases"])
    print("llama", figures(report))


def perturbed_past_decoder(optimum_exports, tmp_path, layer: int):
    """(checkpoint, the Marian export without its merged decoder, decoder_with_past's fc1 of
    `layer` moved)."""
    ckpt, folder = optimum_exports["marian"]
    split = tmp_path / "split"
    shutil.copytree(folder, split, ignore=shutil.ignore_patterns("decoder_model_merged.onnx"))
    return ckpt, perturbed(split, tmp_path, "decoder_with_past_model.onnx", f"/model/decoder/layers.{layer}/fc1/")

def test_marian_with_a_perturbed_past_decoder_fails(optimum_exports, tmp_path):
    """decoder_with_past's layer-0 fc1 moved: the first call (decoder_model.onnx) is right, the
    second is not — position 3, call 1; layer 0's K/V are made before fc1, layer 1's after."""
    ckpt, bad = perturbed_past_decoder(optimum_exports, tmp_path, layer=0)
    result, report = validate(bad, ckpt, tmp_path)
    assert result.exit_code == 1, result.output
    tf = report["checks"]["teacher_forced"]
    assert not tf["passed"]
    failing = [o["name"] for o in tf["cases"][0]["outputs"] if not o["passed"]]
    assert "logits position 3" in failing
    assert "final past_key_values.1.decoder.key" in failing and "final past_key_values.0.decoder.key" not in failing
    assert "first diverging position 3: call 1" in result.output
    assert "first layer whose state diverges: layer 1" in result.output
    assert "first diverging layer: model.decoder.layers.0 " in result.output  # the graph's scopes, layer 0
    # free-running: a row whose greedy token differs where the reference's top-2 margin exceeds
    # the tolerance is a real divergence, not a near-tie
    free = report["checks"]["free_running"]["cases"]
    assert not report["checks"]["free_running"]["passed"]
    assert any("a real divergence" in c["note"] for c in free if not c["passed"])
    print("perturbed marian", figures(report))


def test_a_later_calls_layer_is_named_by_its_own_positions(optimum_exports, tmp_path):
    """decoder_with_past's layer-1 fc1 moved: the decode first diverges on call 1 (positions 3
    onwards); the graph's layer 0 still agrees with the reference's layer 0 *at those positions*,
    so layer 1 is the one named."""
    ckpt, bad = perturbed_past_decoder(optimum_exports, tmp_path, layer=1)
    result, _ = validate(bad, ckpt, tmp_path)
    assert result.exit_code == 1, result.output
    assert "first diverging position 3: call 1" in result.output
    assert "first diverging layer: model.decoder.layers.1 " in result.output

def test_llama_with_a_perturbed_weight_fails(optimum_exports, tmp_path):
    ckpt, folder = optimum_exports["llama"]
    bad = perturbed(folder, tmp_path, "model.onnx", "/model/layers.1/mlp/down_proj/")
    result, report = validate(bad, ckpt, tmp_path)
    assert result.exit_code == 1, result.output
    assert "logits position 0" in result.output and "first diverging position 0: call 0" in result.output
    assert "first diverging layer: model.layers.1 " in result.output  # layer 0's output still agrees
    # layer 1's MLP comes after every K/V: the state agrees, the logits do not
    assert not any("final" in f for f in report["failures"][0].split("outputs ")[1].split(",")[:-1])
    assert "FAIL" in result.output
    print("perturbed llama", figures(report))


def test_quantised_copy_is_judged_by_the_quantised_rule(optimum_exports, tmp_path):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    ckpt, folder = optimum_exports["llama"]
    q = tmp_path / "llama-int4"
    shutil.copytree(folder, q)
    quantizer = MatMulNBitsQuantizer(onnx.load(str(folder / "model.onnx")), block_size=32, is_symmetric=True)
    quantizer.process()
    quantizer.model.save_model_to_file(str(q / "model.onnx"))
    result, report = validate(q, ckpt, tmp_path)
    assert report["dtype"] == "int4" and report["rule"].startswith("int4")
    notes = [c["note"] for c in report["checks"]["teacher_forced"]["cases"]]
    assert "top-1 agreement" in notes[0]
    assert result.exit_code == (0 if report["passed"] else 1)
    print("int4", report["passed"], notes, [c["note"] for c in report["checks"]["free_running"]["cases"]])


def test_inspect_shows_the_adapter_and_the_map(optimum_exports):
    _, folder = optimum_exports["marian"]
    result = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 0, result.output
    assert "adapter optimum (encoder-decoder)" in result.output
    assert "use_cache_branch" in result.output
    assert "past_key_values.1.encoder.value <- present.1.encoder.value (static)" in result.output
    assert "past_key_values.0.decoder.key <- present.0.decoder.key (appended)" in result.output


def test_reference_and_checkpoint_are_not_mixed_up(optimum_exports, transformer_tiny, tmp_path):
    ckpt, folder = optimum_exports["llama"]
    result = CliRunner().invoke(cli, ["validate", str(folder)])
    assert result.exit_code == 2 and "pass --reference CHECKPOINT" in result.output
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(ckpt), "--checkpoint", str(ckpt)])
    assert result.exit_code == 2 and "its judge is --reference" in result.output
    result = CliRunner().invoke(cli, ["validate", str(transformer_tiny[1]), "--reference", str(ckpt)])
    assert result.exit_code == 2 and "seqexport's own export" in result.output
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(tmp_path)])
    assert result.exit_code == 2 and "expected a folder with config.json" in result.output


def test_openvino_runs_the_same_checks(optimum_exports, tmp_path):
    """--runtime openvino: Llama and Marian's separate decoders pass; Marian's merged decoder is
    refused by OpenVINO's CPU plugin (an If whose outputs have a dynamic rank), one line, exit 2."""
    pytest.importorskip("openvino", reason="the openvino extra (make setup installs it)")
    ckpt, folder = optimum_exports["llama"]
    result, report = validate(folder, ckpt, tmp_path, "--runtime", "openvino")
    assert result.exit_code == 0, result.output
    assert report["runtime"].startswith("openvino") and report["provider"] == "CPU"
    print("llama openvino", figures(report))
    ckpt, folder = optimum_exports["marian"]
    result, _ = validate(folder, ckpt, tmp_path, "--runtime", "openvino")
    assert result.exit_code == 2 and "decoder_model_merged.onnx" in result.output and "If" in result.output
    split = tmp_path / "marian-split"
    shutil.copytree(folder, split, ignore=shutil.ignore_patterns("decoder_model_merged.onnx"))
    result, report = validate(split, ckpt, tmp_path, "--runtime", "openvino")
    assert result.exit_code == 0, result.output
    print("marian split openvino", figures(report))
