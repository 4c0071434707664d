"""`seqexport quantize`: an int8 copy the runtime runs unchanged, its weights stored once for all
its graphs, judged by validate's int8 rule against the float32 eager model, as accurate as
float32 on the bundled models' held-out dates; bad requests are one line, exit 2."""

import json

import onnx
import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.checkpoints import bundled
from seqexport.cli import cli
from seqexport.errors import UsageError
from seqexport.export.quantize import quantize
from seqexport.runtime.tokenizer import encode_prompt
from seqexport.training.dates import make_split

N = 100  # held-out dates here; the README's figures use 1000


@pytest.fixture(scope="module")
def dates_exports(bundled_exports, tmp_path_factory):
    """family -> exported folder of its bundled date model (RWKV-7's exported here)."""
    from seqexport.checkpoints.io import load_checkpoint
    from seqexport.families.rwkv.export import export_rwkv

    made = {}

    def get(family):
        if family != "rwkv":
            return bundled_exports(family)[1]
        if family not in made:
            ckpt = load_checkpoint(bundled("rwkv"))
            record = json.loads((ckpt.path / "config.json").read_text())["tokenizer"]
            made[family] = tmp_path_factory.mktemp("bundled") / "rwkv"
            export_rwkv(ckpt, None, made[family], tokenizer=record)
        return made[family]

    return get


def exact_match(folder, pairs) -> float:
    model = rt.load(folder, provider="cpu")
    prompts = [encode_prompt(model.tokenizer, model.prompt_frame, x, model.manifest["tokenizer"]) for x, _ in pairs]
    out = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=16))
    return sum(model.tokenizer.decode(o) == y for o, (_, y) in zip(out, pairs)) / len(pairs)


def stored(folder) -> dict[str, dict[str, tuple]]:
    """graph -> {initializer in the shared weights file: (offset, length, dtype)}."""
    m = json.loads((folder / "manifest.json").read_text())
    out = {}
    for name, g in m["graphs"].items():
        graph = onnx.load(str(folder / g["file"]), load_external_data=False)
        out[name] = {}
        for t in graph.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                assert info["location"] == m["weights"]["file"]
                out[name][t.name] = (int(info["offset"]), int(info["length"]), t.data_type)
    return out


def ops(folder, graph) -> set[str]:
    m = json.loads((folder / "manifest.json").read_text())
    return {n.op_type for n in onnx.load(str(folder / m["graphs"][graph]["file"]), load_external_data=False).graph.node}


@pytest.mark.parametrize("family", ["transformer", "mamba", "rwkv"])
def test_int8_copy_validates_and_keeps_the_accuracy(dates_exports, tmp_path, family):
    folder = dates_exports(family)
    out = quantize(folder, tmp_path / "int8")
    m, source = (json.loads((f / "manifest.json").read_text()) for f in (out, folder))
    q = m["quantization"]
    assert q["mode"] == "dynamic" and q["weights"] == "int8" and q["source"]["folder"] == str(folder.resolve())
    for name, g in m["graphs"].items():  # the runtime's contract: every graph's I/O as the source's
        assert (g["inputs"], g["outputs"]) == (source["graphs"][name]["inputs"], source["graphs"][name]["outputs"])
    assert m["weights"]["bytes"] < source["weights"]["bytes"] / 2
    # one weights file; an int8 weight two graphs read is stored once, at one offset
    files = stored(out)
    int8 = {g: {n: v for n, v in t.items() if v[2] == onnx.TensorProto.INT8} for g, t in files.items()}
    if family != "transformer":  # prefill and step: the same linears, the same int8 bytes
        assert int8["prefill"] == int8["step"] and len(int8["step"]) >= 2 * m["config"]["n_layer"]
        assert "MatMulInteger" in ops(out, "step")  # the step's Gemms were quantised too
    n = m["config"]["n_layer" if family != "transformer" else "num_layers"]
    # float32 by default: the head, and what makes a scan's inputs: Mamba's x_proj and dt_proj
    # (Δ, B, C), RWKV-7's LoRAs of the decay, in-context rate and value mix (layer 0 has no v)
    expected = {
        "transformer": {"decoder.fc_out"},
        "mamba": {"backbone.embedding"} | {f"backbone.layers.{i}.mixer.{p}" for i in range(n) for p in ("x_proj", "dt_proj")},
        "rwkv": {"head"} | {f"blocks.{i}.att.{p}" for i in range(n) for p in ("w1", "w2", "a1", "a2", "v1", "v2")
                            if i or p[0] != "v"},
    }[family]
    assert set(q["kept_float"]["decoder" if family == "transformer" else "step"]) == expected
    # only learned weights go int8: an exact broadcast or sum the export writes as a MatMul by a
    # constant of ones (Mamba's step: Δ ⊗ 1) stays float32 (as int8, Δ went through uint8)
    for name, g in m["graphs"].items():
        graph = onnx.load(str(out / g["file"]), load_external_data=False)
        int8_names = [t.name for t in graph.graph.initializer if t.data_type == onnx.TensorProto.INT8]
        assert int8_names and all(n.startswith("model.") for n in int8_names), (name, int8_names)
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "12"])
    assert result.exit_code == 0, result.output
    assert "int8: top-1 agreement" in result.output
    pairs = make_split("test", N, seed=0)
    assert abs(exact_match(out, pairs) - exact_match(folder, pairs)) <= 0.02


def test_static_mode_calibrates_on_the_models_own_decodes(dates_exports, tmp_path):
    folder = dates_exports("transformer")
    texts = [x for x, _ in make_split("train", 16, seed=1)]
    out = quantize(folder, tmp_path / "static", mode="static", calibration=texts)
    q = json.loads((out / "manifest.json").read_text())["quantization"]
    assert q["mode"] == "static" and q["calibration_feeds"]["decoder"] > len(texts)
    assert "QuantizeLinear" in ops(out, "decoder")  # QDQ: activations quantised with calibrated ranges
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "12"])
    assert result.exit_code == 0, result.output
    pairs = make_split("test", N, seed=0)
    assert abs(exact_match(out, pairs) - exact_match(folder, pairs)) <= 0.02


def test_static_per_channel_puts_one_scale_per_output_channel(transformer_tiny, tmp_path):
    """Static int8 per channel: each int8 weight is dequantised along its output axis with one
    scale per output channel (the eager Linear's out_features), not one per tensor or per input."""
    ckpt, folder = transformer_tiny
    out = quantize(folder, tmp_path / "static", mode="static", per_channel=True)
    m = json.loads((out / "manifest.json").read_text())
    tensors = m["weights"]["tensors"]
    checked = 0
    for name in m["graphs"]:
        graph = onnx.load(str(out / m["graphs"][name]["file"]), load_external_data=False)
        init = {t.name: t for t in graph.graph.initializer}
        dims = {n: list(t.dims) for n, t in init.items()} | {n: t["dims"] for n, t in tensors.items()}
        int8 = {n for n, t in init.items() if t.data_type == onnx.TensorProto.INT8} | \
            {n for n, t in tensors.items() if t["dtype"] == "int8"}
        for node in graph.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in int8:
                continue
            w = node.input[0]  # (in, out): the MatMul's B
            path = w.removeprefix("model.").removesuffix("_quantized").removesuffix(".T").removesuffix(".weight")
            out_features = ckpt.model.get_submodule(path).out_features
            axis = next(a.i for a in node.attribute if a.name == "axis")
            assert dims[w][axis] == out_features and dims[node.input[1]] == [out_features], (w, dims[node.input[1]])
            checked += 1
    assert checked >= 2 * 8  # every decoder layer's linears at least (the head stays float32)


def test_tiny_transformer_keeps_its_appended_cache_io(transformer_tiny, tmp_path):
    """A random-weight preset, head included: past_lengths in, only the new K/V out, as the
    source; the runtime decodes it (with a cache buffer it grows) to the requested length."""
    _, folder = transformer_tiny
    out = quantize(folder, tmp_path / "int8", include_head=True, per_channel=True)
    m = json.loads((out / "manifest.json").read_text())
    dec = m["graphs"]["decoder"]
    assert "past_lengths" in [t["name"] for t in dec["inputs"]]
    assert m["quantization"]["kept_float"]["decoder"] == []
    floats = {n for n, v in stored(out)["decoder"].items() if v[2] == onnx.TensorProto.FLOAT and v[1] >= 4096}
    assert floats and all(n.endswith(("embedding.weight", "embedding.weight.T", "pe.pe")) for n in floats), floats
    model = rt.load(out, provider="cpu")
    tokens = rt.generate(model, [[5, 6, 7], [8, 9]], rt.SearchOptions(max_new_tokens=20, eos_id=-1))
    assert [len(t) for t in tokens] == [20, 20]


def test_bad_requests_are_one_line_exit_2(dates_exports, tmp_path):
    folder = dates_exports("transformer")
    int8 = quantize(folder, tmp_path / "int8")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("March 3, 2001\n")
    blank, binary = tmp_path / "blank.txt", tmp_path / "binary.txt"
    blank.write_text("\n  \n")
    binary.write_bytes(b"March\xa1\xff 3\n")
    runner = CliRunner()
    for args, message in (
        (["quantize", str(int8), "--out", str(tmp_path / "again")], "is already quantised"),
        (["quantize", str(folder), "--out", str(tmp_path / "x"), "--mode", "float4"],
         "'float4' is not one of 'dynamic', 'static'"),
        (["quantize", str(folder), "--out", str(tmp_path / "y"), "--exclude", "decoder.nothing.*"],
         "--exclude 'decoder.nothing.*' matches no weight MatMul/Gemm"),
        (["quantize", str(folder), "--out", str(tmp_path / "z"), "--calibration", str(prompts)],
         "calibration prompts are for --mode static"),
        # (a file of no prompts was taken silently, one not UTF-8 was a UnicodeDecodeError traceback)
        (["quantize", str(folder), "--out", str(tmp_path / "z"), "--mode", "static", "--calibration", str(blank)],
         f"--calibration {blank}: no prompts (every line is empty)"),
        (["quantize", str(folder), "--out", str(tmp_path / "z"), "--mode", "static", "--calibration", str(binary)],
         f"--calibration {binary}: not UTF-8 text (byte 5)"),
        # a calibration file the options do not use is refused as that, not judged (was: "no prompts")
        (["quantize", str(folder), "--out", str(tmp_path / "z"), "--calibration", str(blank)],
         "calibration prompts are for --mode static"),
        (["quantize", str(folder), "--out", str(tmp_path / "z"), "--bits", "4", "--calibration", str(binary)],
         "--calibration is an int8 option; --bits 4 is weight-only"),
        (["quantize", str(folder), "--out", str(int8)], "already exists"),
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output, result.output
    assert not any((tmp_path / d).exists() for d in ("again", "x", "y", "z"))
    with pytest.raises(UsageError, match="unknown quantisation mode 'float4'"):
        quantize(folder, tmp_path / "w", mode="float4")


def test_exclude_keeps_the_matching_weights_float(dates_exports, tmp_path):
    folder = dates_exports("transformer")
    out = quantize(folder, tmp_path / "int8", exclude=["decoder.layers.0.ffn.*"], per_channel=True)
    q = json.loads((out / "manifest.json").read_text())["quantization"]
    assert q["kept_float"]["decoder"] == ["decoder.fc_out", "decoder.layers.0.ffn.fc1", "decoder.layers.0.ffn.fc2"]
    assert q["kept_float"]["encoder"] == [] and q["per_channel"]
    names = set(stored(out)["decoder"])
    assert "model.decoder.layers.0.ffn.fc1.weight.T" in names  # float32, as exported
    assert "model.decoder.layers.1.ffn.fc1.weight.T_quantized" in names


def test_bench_times_the_int8_copy_beside_its_source(dates_exports, tmp_path):
    folder = dates_exports("mamba")
    out = quantize(folder, tmp_path / "int8")
    report = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", str(out), "--fast", "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert f"int8 {out} vs its float32 source {folder.resolve()}" in result.output
    side = json.loads(report.read_text())["int8_vs_float32"]
    assert [r["context"] for r in side["rows"]] == [4, 16]
    assert all(r["step_int8_ms"] > 0 and r["step_float32_ms"] > 0 for r in side["rows"])
    assert side["disk_bytes"]["int8"] < 0.7 * side["disk_bytes"]["float32"]  # tiny: float embedding, x_proj
    bad = CliRunner().invoke(cli, ["bench", str(folder), "--fast", "--baseline", str(folder)])
    assert bad.exit_code == 2 and "is not a quantised (int8 or int4) copy" in bad.output, bad.output


def test_int8_free_running_judges_each_pick_on_its_own_prefix():
    """validate's int8 free-running rule, with the bundled RWKV-7's eager model as the judge: a
    decode that takes eager's runner-up once (a near-tie, as int8 rounding does) and follows
    eager from there passes however many later tokens differ from eager's own decode; one that
    leaves eager's argmax at a third of its steps fails."""
    import numpy as np

    from seqexport import families
    from seqexport.checkpoints.io import load_checkpoint
    from seqexport.parity.checks import NEVER, QuantRule, int8_free_case
    from seqexport.runtime.generate import SearchOptions

    model = load_checkpoint(bundled("rwkv")).model.float().eval()
    judge = families.get("rwkv").parity.Cases.eager_class(model, None, cache=False, device="cpu")
    prompt, options = [1, 40, 52, 55, 3], SearchOptions(max_new_tokens=12, eos_id=NEVER)

    def decode(runner_up_at: set[int]) -> list[int]:
        """Eager's greedy picks, but its second best at these steps."""
        logits, state, out = *judge.begin([prompt]), []
        for t in range(12):
            order = np.argsort(logits[0])[::-1]
            out.append(int(order[1] if t in runner_up_at else order[0]))
            logits, state = judge.step(np.array([out[-1]], np.int64), state)
        return out

    detour = int8_free_case(0, decode({2}), judge, prompt, options, QuantRule())
    assert detour.passed and detour.label == "row 0: 11/12 int8 picks are eager's"
    assert "tokens equal eager's own greedy decode" in detour.note and "12/12 tokens equal" not in detour.note
    wrong = int8_free_case(0, decode({0, 3, 6, 9}), judge, prompt, options, QuantRule())
    assert not wrong.passed and wrong.label == "row 0: 8/12 int8 picks are eager's"
    assert int8_free_case(0, decode(set()), judge, prompt, options, QuantRule()).note.endswith("12/12 tokens equal "
                                                                                             "eager's own greedy decode")


def test_cli_mode_and_per_channel_reach_the_quantiser(transformer_tiny, tmp_path):
    """`seqexport quantize --mode static --per-channel`: the copy is calibrated and has a scale
    per output channel, as the same call in Python makes it (the flags are not lost on the way)."""
    _, folder = transformer_tiny
    out = tmp_path / "int8"
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--out", str(out), "--mode", "static", "--per-channel"])
    assert result.exit_code == 0, result.output
    q = json.loads((out / "manifest.json").read_text())["quantization"]
    assert q["mode"] == "static" and q["per_channel"] and q["calibration_feeds"]["decoder"] > 0


def test_a_quantise_killed_outright_leaves_only_what_the_next_one_removes(dates_exports, tmp_path):
    """SIGKILL (what the kernel does on running out of memory) midway through int8: the scratch
    copies, ORT's temporary files among them, sit inside the run's pid-tagged hidden folder,
    none in the system's temporary folder; the next quantise to the same folder removes it.
    Before, the scratch sat beside the output and ORT's copies in /tmp, left for good (3 GB
    after one killed quantise of a 3.3 GB model)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    for attempt in range(3):  # a run that ended before the signal landed proves nothing: again
        parent, system_tmp = tmp_path / f"parent{attempt}", tmp_path / f"system-tmp{attempt}"
        parent.mkdir()
        system_tmp.mkdir()
        out = parent / "q"
        proc = subprocess.Popen([sys.executable, "-m", "seqexport.cli", "quantize", str(dates_exports("mamba")),
                                 "--out", str(out)], env=os.environ | {"TMPDIR": str(system_tmp)},
                                stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            # midway: ORT's quantiser at work on a graph, its temporary folder made (here, or in TMPDIR)
            while not (list(parent.glob(".q.tmp-*/.scratch-*/ort.quant.*")) or list(system_tmp.glob("ort.quant.*"))):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        except ProcessLookupError:  # it had ended
            pass
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode == -signal.SIGKILL:
            break
    assert proc.returncode == -signal.SIGKILL, f"never killed midway in 3 attempts: {proc.stderr.read().decode()[-2000:]}"
    assert [p.name.split("-")[0] for p in parent.iterdir()] == [".q.tmp"], list(parent.iterdir())
    # (a library's 51-byte session id, .ses, may land there: not a copy of anything)
    assert [p for p in system_tmp.rglob("*") if p.is_dir() or p.stat().st_size > 4096] == []
    result = CliRunner().invoke(cli, ["quantize", str(dates_exports("mamba")), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [p.name for p in parent.iterdir()] == ["q"]
    assert not list(out.glob(".scratch-*"))
    rt.load(out)
