"""`seqexport validate`: passes on correct exports, fails loudly and precisely on a damaged one."""

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from seqexport.cli import cli
from seqexport.manifest import graph_specs, read_manifest
from seqexport.parity.checks import free_case
from seqexport.parity.validate import validate
from tests.damage import damaged_copy


def test_transformer_export_passes(transformer_tiny, tmp_path):
    _, folder = transformer_tiny
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["validate", str(folder), "--steps", "8", "--report", str(report_path)])
    assert result.exit_code == 0, result.output
    assert "result: PASS" in result.output
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["provider"] == "CPUExecutionProvider"
    assert set(report["checks"]) == {"graphs", "teacher_forced", "free_running"}
    labels = [c["label"] for c in report["checks"]["graphs"]["cases"]]
    assert any("batch=1 past_len=0 tgt_len=1" in label for label in labels)
    out = report["checks"]["graphs"]["cases"][0]["outputs"][0]
    assert {"max_abs", "max_rel", "mean_abs", "needed_atol", "passed"} <= set(out)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["parity"]["summary"]["passed"] is True


@pytest.mark.parametrize("lowering", ["loop", "unrolled", "parallel"])
def test_mamba_exports_pass(mamba_exports, lowering):
    _, folder = mamba_exports(lowering)
    report = validate(folder, steps=6, write_summary=False)
    assert report.passed, report.table()
    assert report.check_passed("teacher_forced") and report.check_passed("free_running")
    # the decode's final state is compared too, every state tensor of it (not only the logits)
    teacher = next(c for c in report.cases if c.check == "teacher_forced")
    states = {t.name for t in graph_specs(read_manifest(folder, verify=False))["step"].state_inputs}
    assert {o.name for o in teacher.outputs if o.name.startswith("final ")} == {f"final {n}" for n in states}


def test_damaged_transformer_decoder_fails_and_names_the_layer(transformer_tiny, tmp_path):
    _, folder = transformer_tiny
    bad = damaged_copy(folder, tmp_path, "decoder", "model.decoder.layers.1.ffn.fc1.bias")
    report_path = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["validate", str(bad), "--steps", "6", "--report", str(report_path)])
    assert result.exit_code == 1, result.output
    assert "result: FAIL" in result.output and "logits" in result.output
    assert "decoder.layers.1.ffn" in result.output
    fails = [line for line in result.output.splitlines() if line.lstrip().startswith("FAIL")]
    assert fails and all("max abs" in line and "needs atol" in line for line in fails)  # how far off, too
    report = json.loads(report_path.read_text())
    failing = [c for c in report["checks"]["graphs"]["cases"] if not c["passed"]]
    assert failing and all(c["label"].startswith("decoder") for c in failing)  # the encoder is untouched
    div = failing[0]["divergence"]
    # the damaged Linear itself: modules are compared in graph order, the first to differ named
    assert div["layer"] == "decoder.layers.1" and div["module"] == "decoder.layers.1.ffn.fc1"
    assert div["module_type"] == "Linear"
    assert not report["checks"]["teacher_forced"]["passed"]


def test_damaged_mamba_prefill_fails_and_names_the_layer(mamba_exports, tmp_path):
    _, folder = mamba_exports("loop")
    bad = damaged_copy(folder, tmp_path, "prefill", "model.backbone.layers.1.mixer.conv1d.bias")
    report = validate(bad, steps=4, write_summary=False)
    assert not report.passed
    failing = [c for c in report.cases if c.check == "graphs" and not c.passed]
    assert failing and all(c.label.startswith("prefill") for c in failing)
    assert any(o.name == "logits" and not o.passed for o in failing[0].outputs)
    assert failing[0].divergence.layer == "backbone.layers.1"
    assert failing[0].divergence.module.startswith("backbone.layers.1")
    # the prefill's state is off too: the teacher-forced decode's final state says so
    teacher = next(c for c in report.cases if c.check == "teacher_forced")
    assert any(o.name.startswith("final ") and not o.passed for o in teacher.outputs)


def test_altered_file_is_refused_before_comparing(transformer_tiny, tmp_path):
    _, folder = transformer_tiny
    bad = tmp_path / "altered"
    shutil.copytree(folder, bad)
    with open(bad / "decoder.onnx", "r+b") as f:
        f.seek(-10, 2)
        f.write(b"\x00" * 10)
    result = CliRunner().invoke(cli, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "sha256" in result.output and "decoder.onnx" in result.output


def test_changed_checkpoint_is_an_error_unless_named(transformer_tiny, tmp_path):
    _, folder = transformer_tiny
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    cfg = copy / "checkpoint" / "config.json"
    cfg.write_text(cfg.read_text().replace('"dropout"', '"dropout": 0.2, "x_dropout"').replace('"x_dropout": 0.1,', ""))
    result = CliRunner().invoke(cli, ["validate", str(copy), "--steps", "3"])
    assert result.exit_code == 2 and "changed since export" in result.output
    result = CliRunner().invoke(cli, ["validate", str(copy), "--steps", "3", "--checkpoint", str(copy / "checkpoint")])
    assert result.exit_code == 0, result.output


def test_changed_checkpoint_weights_are_noticed_too(transformer_tiny, tmp_path):
    """The checkpoint's digest covers its weights file, not only config.json: one weight
    changed after export is refused as a changed checkpoint."""
    _, folder = transformer_tiny
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    weights = copy / "checkpoint" / "model.safetensors"
    tensors = load_file(weights)
    name = next(k for k, t in tensors.items() if t.is_floating_point())
    tensors[name] = tensors[name] + 1e-3
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    save_file(tensors, str(weights), metadata=metadata)
    result = CliRunner().invoke(cli, ["validate", str(copy), "--steps", "3"])
    assert result.exit_code == 2 and "changed since export" in result.output, result.output


class FixedLogits:
    """A reference decoder whose every step yields the same logits (to exercise the tie rule)."""

    def __init__(self, logits):
        self.logits = logits[None]  # (1, v)

    def begin(self, rows, start_id=None):
        return self.logits, None

    def step(self, tokens, state):
        return self.logits, None


def test_free_running_rule_tie_vs_real_divergence():
    tie = np.zeros(10, np.float32)
    tie[3] = tie[7] = 5.0  # an exact tie: eager argmax takes 3, ONNX took 7
    case = free_case(0, [7, 1, 1], 3, FixedLogits(tie), [1], None, atol=1e-4, rtol=1e-3)
    assert case.passed and "near-tie" in case.note and "step 0" in case.note
    clear = np.zeros(10, np.float32)
    clear[3] = 5.0  # eager is sure of 3; ONNX's 7 is a real divergence
    case = free_case(0, [3, 7], 2, FixedLogits(clear), [1], None, atol=1e-4, rtol=1e-3)
    assert not case.passed and "real divergence" in case.note and "step 1" in case.note


def test_damaged_step_graph_fails_free_running(mamba_exports, tmp_path):
    """A real bug in the step graph: free-running tokens diverge, reported as a failure, not a tie."""
    _, folder = mamba_exports("loop")

    def favour_token_50(w):  # the random tiny model echoes its last token; make the step graph prefer 50
        w[:, 50] = 3 * w.sum(1)  # w: the tied head transposed, (d_model, vocab), as the graphs store it
        return w

    bad = damaged_copy(folder, tmp_path, "step", "model.backbone.embedding.weight.T", edit=favour_token_50)
    report = validate(bad, steps=12, write_summary=False)
    assert not report.check_passed("teacher_forced")
    free = [c for c in report.cases if c.check == "free_running"]
    assert any(not c.passed and "real divergence" in c.note for c in free)


def test_inspect_lists_graphs_and_parity(transformer_tiny):
    _, folder = transformer_tiny
    validate(folder, steps=3)  # writes the parity summary into the manifest
    result = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 0, result.output
    assert "decoder: decoder.onnx" in result.output
    assert "past_key_values.1.decoder.value" in result.output and "'past_len'" in result.output
    assert "parity: PASS on CPUExecutionProvider" in result.output
    assert "source: preset tiny" in result.output and "tokenizer: none" in result.output
    machine = CliRunner().invoke(cli, ["inspect", str(folder), "--json"])
    assert json.loads(machine.output)["parity"]["summary"]["passed"] is True


class OffByOneCausalDecoder(torch.nn.Module):
    """A copy of the export wrapper DecoderGraph whose in-graph causal mask is off by one: new
    position i also sees new position i + 1. A one-token step has no position i + 1, so only
    multi-token steps show it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, past_lengths, *past):
        dec = self.model.decoder
        n = len(dec.layers)
        cross = [(past[2 * i], past[2 * i + 1]) for i in range(n)]
        cache = [(past[2 * n + 2 * i], past[2 * n + 2 * i + 1]) for i in range(n)]
        t, c = input_ids.shape[1], cache[0][0].shape[2]
        x = dec.pe.at(dec.embedding(input_ids), past_lengths[:, None] + torch.arange(t))
        visible = (torch.arange(c)[None, :] < past_lengths[:, None])[:, None, None, :]
        causal = torch.arange(t)[None, :] <= torch.arange(t)[:, None] + 1  # the fault
        presents = []
        for layer, kv, ckv in zip(dec.layers, cache, cross):
            x, new = layer.step_cached(x, kv, ckv, visible, causal, encoder_attention_mask[:, None, None, :])
            presents += new
        return (dec.fc_out(x), *presents)


def test_validate_fails_when_the_decoder_causal_mask_is_off_by_one(tmp_path, monkeypatch):
    import seqexport.families.transformer.export as tf_export
    from seqexport.checkpoints import build_preset

    real = tf_export.exported_module
    monkeypatch.setattr(tf_export, "exported_module",
                        lambda model, graph, *args: OffByOneCausalDecoder(model) if graph == "decoder"
                        else real(model, graph, *args))
    out = tmp_path / "off-by-one"
    tf_export.export_transformer(build_preset("transformer", "tiny", seed=1), "tiny", out)
    monkeypatch.undo()  # validate compares with the unmodified model
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "8"])
    assert result.exit_code == 1, result.output
    assert "teacher_forced: FAIL" in result.output
    assert "free_running: PASS" in result.output  # one token per step never shows the fault


def test_validate_fails_on_a_nan_weight(tmp_path):
    from seqexport.checkpoints import build_preset
    from seqexport.export import export_model

    ckpt = build_preset("transformer", "tiny", seed=2)
    with torch.no_grad():
        ckpt.model.decoder.layers[1].ffn.fc1.bias[3] = float("nan")
    export_model(ckpt, "tiny", tmp_path / "nan")
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "nan"), "--steps", "4"])
    assert result.exit_code == 1, result.output
    assert "NaN/Inf" in result.output and "result: FAIL" in result.output


def test_a_checkpoint_of_another_shape_is_refused_before_any_graph_runs(transformer_tiny, tmp_path):
    from seqexport.models.transformer import TransformerConfig

    from seqexport.checkpoints import build_preset, save_checkpoint

    _, folder = transformer_tiny
    other = build_preset("transformer", "tiny")
    config = TransformerConfig(**{**other.config.to_dict(), "tgt_vocab_size": 272})
    from seqexport.checkpoints.io import build_model

    save_checkpoint(build_model("transformer", config), config, "transformer", tmp_path / "other")
    result = CliRunner().invoke(cli, ["validate", str(folder), "--checkpoint", str(tmp_path / "other")])
    assert result.exit_code == 2
    assert "does not match the export" in result.output and "tgt_vocab_size 272 (the export has 100)" in result.output
    assert "Gather" not in result.output


def test_cli_options_reach_the_checks(transformer_tiny, tmp_path):
    """--batch and --seed shape and draw the decodes' inputs (the same seed the same figures,
    another seed others); --atol lets a damaged export's differences pass, as it says."""
    _, folder = transformer_tiny
    runs = iter(range(100))

    def run(target, *args):
        path = tmp_path / f"report{next(runs)}.json"
        result = CliRunner().invoke(cli, ["validate", str(target), "--steps", "3", *args, "--report", str(path)])
        return result.exit_code, json.loads(path.read_text())

    def teacher(report):
        return report["checks"]["teacher_forced"]["cases"][0]

    code, a = run(folder, "--batch", "3", "--seed", "7")
    assert code == 0 and (a["batch"], a["seed"]) == (3, 7)
    assert "batch 3" in teacher(a)["label"] and teacher(a)["outputs"][0]["shape"][0] == 3
    assert all(len(c["label"]) for c in a["checks"]["free_running"]["cases"])
    _, same = run(folder, "--batch", "3", "--seed", "7")
    _, other = run(folder, "--batch", "3", "--seed", "8")
    assert teacher(same)["outputs"][0]["max_abs"] == teacher(a)["outputs"][0]["max_abs"]
    assert teacher(other)["outputs"][0]["max_abs"] != teacher(a)["outputs"][0]["max_abs"]
    bad = damaged_copy(folder, tmp_path, "decoder", "model.decoder.layers.1.ffn.fc1.bias")
    assert run(bad)[0] == 1
    code, loose = run(bad, "--atol", "1e9")
    assert code == 0 and loose["atol"] == 1e9 and loose["passed"]
