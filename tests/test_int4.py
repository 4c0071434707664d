"""`seqexport quantize --bits 4`: weight-only int4 through ONNX Runtime's MatMulNBits, the same
keep-float rules as int8, weights stored once, a copy validate and the runtime take as they take
an int8 one; validate's state-drift check for quantised recurrent models, which a copy with one
state-writing weight off fails; bad requests one line, exit 2."""

import json
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport import families
from seqexport.checkpoints import bundled
from seqexport.cli import cli
from seqexport.export.quantize import quantize
from seqexport.manifest import read_manifest, sha256_file
from seqexport.parity import drift
from seqexport.parity.checks import QuantRule
from seqexport.parity.validate import eager_checkpoint
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


@pytest.fixture(scope="module")
def int4_copies(dates_exports, tmp_path_factory):
    """family -> int4 copy (default options) of its bundled date model, made once."""
    made = {}

    def get(family):
        if family not in made:
            made[family] = quantize(dates_exports(family), tmp_path_factory.mktemp("int4") / family, bits=4)
        return made[family]

    return get


def exact_match(folder, pairs) -> float:
    model = rt.load(folder, provider="cpu")
    prompts = [encode_prompt(model.tokenizer, model.prompt_frame, x, model.manifest["tokenizer"]) for x, _ in pairs]
    out = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=16))
    return sum(model.tokenizer.decode(o) == y for o, (_, y) in zip(out, pairs)) / len(pairs)


def graph(folder, name) -> onnx.ModelProto:
    m = json.loads((folder / "manifest.json").read_text())
    return onnx.load(str(folder / m["graphs"][name]["file"]), load_external_data=False)


def module_path(weight: str) -> str:
    """`model.blocks.1.att.key.weight.T_Q4` -> `blocks.1.att.key`."""
    for suffix in ("_Q4", "_Q8", "_scales", ".T", ".weight"):
        weight = weight.removesuffix(suffix)
    return weight.removeprefix("model.")


@pytest.mark.parametrize("family", ["transformer", "mamba", "rwkv"])
def test_int4_copy_validates_and_keeps_the_accuracy(dates_exports, int4_copies, family):
    folder, out = dates_exports(family), int4_copies(family)
    m, source = (json.loads((f / "manifest.json").read_text()) for f in (out, folder))
    q = m["quantization"]
    assert (q["weights"], q["bits"], q["block_size"], q["accuracy_level"]) == ("int4", 4, 32, 4)
    assert q["head"] == "int8" and q["source"]["folder"] == str(folder.resolve())
    for name, g in m["graphs"].items():  # the runtime's contract: every graph's I/O as the source's
        assert (g["inputs"], g["outputs"]) == (source["graphs"][name]["inputs"], source["graphs"][name]["outputs"])
    assert m["weights"]["bytes"] < source["weights"]["bytes"] / 2
    n = m["config"]["n_layer" if family != "transformer" else "num_layers"]
    # float32: what makes a scan's inputs (Mamba's x_proj and dt_proj: Δ, B, C), RWKV-7's LoRAs of
    # the decay, in-context rate and value mix (layer 0 has no v); the head is 8-bit MatMulNBits
    kept = {
        "transformer": set(),
        "mamba": {f"backbone.layers.{i}.mixer.{p}" for i in range(n) for p in ("x_proj", "dt_proj")},
        "rwkv": {f"blocks.{i}.att.{p}" for i in range(n) for p in ("w1", "w2", "a1", "a2", "v1", "v2") if i or p[0] != "v"},
    }[family]
    step = "decoder" if family == "transformer" else "step"
    assert set(q["kept_float"][step]) == kept
    tensors = m["weights"]["tensors"]
    for name in m["graphs"]:
        g = graph(out, name)
        init = {t.name: t for t in g.graph.initializer}
        nbits = [nd for nd in g.graph.node if nd.op_type == "MatMulNBits"]
        quantised = {module_path(nd.input[1]) for nd in nbits}
        # no learned weight left on a float MatMul but the kept ones: every MatMul whose B is a
        # stored float32 weight is one the family keeps float
        floats = {module_path(nd.input[1]) for nd in g.graph.node if nd.op_type == "MatMul"
                  and tensors.get(nd.input[1], {}).get("dtype") == "float32"}
        assert floats == kept, (name, floats ^ kept)
        assert not quantised & kept
        head = {"transformer": "decoder.fc_out", "mamba": "backbone.embedding", "rwkv": "head"}[family]
        assert (head in quantised) == (name != "encoder"), (name, sorted(quantised))
        for nd in nbits:  # 4-bit (the head 8-bit), in the copy's blocks; the packed weight is uint8
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nd.attribute}
            bits = 8 if module_path(nd.input[1]) == head else 4
            assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (bits, 32, 4), nd.name
            dtype = tensors[nd.input[1]]["dtype"] if nd.input[1] in tensors else init[nd.input[1]].data_type
            assert dtype in ("uint8", onnx.TensorProto.UINT8)
        for path in kept:  # kept float32 as exported
            assert any(t["dtype"] == "float32" and module_path(w) == path for w, t in tensors.items()), path
    if family != "transformer":  # prefill and step read the same int4 bytes, stored once
        q4 = {name: {t.name for t in graph(out, name).graph.initializer if t.name.endswith("_Q4")} for name in m["graphs"]}
        assert q4["prefill"] == q4["step"] and len(q4["step"]) >= 2 * n
        assert len({(tensors[t]["offset"]) for t in q4["step"]}) == len(q4["step"])
    result = CliRunner().invoke(cli, ["validate", str(out), "--steps", "12"])
    assert result.exit_code == 0, result.output
    assert "int4: top-1 agreement" in result.output
    assert ("state_drift: PASS" in result.output) == (family != "transformer"), result.output
    pairs = make_split("test", N, seed=0)
    assert abs(exact_match(out, pairs) - exact_match(folder, pairs)) <= 0.02


def test_head_options(transformer_tiny, tmp_path):
    """--float-head: the head stays a float32 MatMul; the runtime decodes the copy to length.
    --include-head: the head 4-bit like the rest."""
    _, folder = transformer_tiny
    out = tmp_path / "int4"
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--out", str(out), "--bits", "4", "--float-head",
                                      "--block-size", "16", "--accuracy-level", "1"])
    assert result.exit_code == 0, result.output
    m = json.loads((out / "manifest.json").read_text())
    q = m["quantization"]
    assert q["kept_float"]["decoder"] == ["decoder.fc_out"] and not q["include_head"]
    assert (q["block_size"], q["accuracy_level"]) == (16, 1)
    nbits = [nd for nd in graph(out, "decoder").graph.node if nd.op_type == "MatMulNBits"]
    assert nbits and all({a.name: onnx.helper.get_attribute_value(a) for a in nd.attribute}.items()
                         >= {"block_size": 16, "accuracy_level": 1}.items() for nd in nbits)  # the nodes, too
    assert m["weights"]["tensors"]["model.decoder.fc_out.weight.T"]["dtype"] == "float32"
    heads = [nd for nd in graph(out, "decoder").graph.node if nd.input[1:2] == ["model.decoder.fc_out.weight.T"]]
    assert [nd.op_type for nd in heads] == ["MatMul"]
    tokens = rt.generate(rt.load(out, provider="cpu"), [[5, 6, 7], [8, 9]], rt.SearchOptions(max_new_tokens=20, eos_id=-1))
    assert [len(t) for t in tokens] == [20, 20]
    four = quantize(folder, tmp_path / "int4-head", bits=4, include_head=True)
    assert json.loads((four / "manifest.json").read_text())["quantization"]["head"] == "int4"
    heads = [nd for nd in graph(four, "decoder").graph.node if nd.input[1:2] and nd.input[1].startswith("model.decoder.fc_out.weight")]
    assert [(nd.op_type, [a.i for a in nd.attribute if a.name == "bits"]) for nd in heads] == [("MatMulNBits", [4])]


def test_bad_int4_requests_are_one_line_exit_2(transformer_tiny, tmp_path):
    _, folder = transformer_tiny
    runner = CliRunner()
    for args, message in (
        (["--bits", "3"], "--bits 3: expected one of [8, 4]"),
        (["--bits", "4", "--per-channel"], "--per-channel is an int8 option"),
        (["--bits", "4", "--mode", "static"], "--mode static is an int8 option"),
        (["--bits", "4", "--block-size", "48"], "--block-size 48: expected one of [16, 32, 64, 128, 256]"),
        (["--bits", "4", "--accuracy-level", "7"], "--accuracy-level 7: expected one of [0, 1, 2, 3, 4]"),
        (["--block-size", "32"], "--block-size is an int4 option"),
    ):
        result = runner.invoke(cli, ["quantize", str(folder), "--out", str(tmp_path / "x"), *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert "Traceback" not in result.output and not (tmp_path / "x").exists()


def scaled_copy(folder, out, weight: str, factor: float):
    """A copy of a quantised folder whose stored `weight` tensor (e.g. int4 scales) is `factor`
    times too large, its manifest re-hashed: a copy broken in one weight."""
    shutil.copytree(folder, out)
    m = json.loads((out / "manifest.json").read_text())
    t = m["weights"]["tensors"][weight]
    data = np.memmap(out / m["weights"]["file"], dtype=np.uint8, mode="r+")
    values = data[t["offset"]: t["offset"] + t["length"]].view(np.dtype(t["dtype"]))
    values *= np.asarray(factor, values.dtype)
    data.flush()
    del data, values
    m["weights"]["sha256"] = sha256_file(out / m["weights"]["file"])
    (out / "manifest.json").write_text(json.dumps(m, indent=2))
    return out


def drift_cases(folder, seed: int = 0):
    manifest = read_manifest(folder)
    model = rt.load(folder, provider="cpu")
    eager = eager_checkpoint(folder, manifest, None).model.float().eval()
    rng = np.random.default_rng(seed)
    cases = families.get(manifest["family"]).parity.Cases(eager, model, rng, 2, "cpu")
    return drift.state_drift(model, cases, rng, QuantRule.for_bits(4).max_drift)


def test_state_drift_fails_a_copy_whose_state_writing_weight_is_off(int4_copies, tmp_path):
    """Layer 1's in_proj (which writes its conv state and, through it, its SSM state) 1.45x too
    large: the layers from 1 on drift past the int4 bound (measured 0.45-0.58 at layer 1, 0.04
    at layer 0; the good copy 0.04-0.11 everywhere) — and validate fails, naming the tensor."""
    good = int4_copies("mamba")
    cases = drift_cases(good)
    assert [c.label.split(":")[0] for c in cases] == [f"layer {i}" for i in range(4)]
    assert all(c.passed for c in cases), [c.note for c in cases]
    broken = scaled_copy(good, tmp_path / "broken", "model.backbone.layers.1.mixer.in_proj.weight.T_scales", 1.45)
    bad = drift_cases(broken)
    assert bad[0].passed and not bad[1].passed, [c.note for c in bad]
    assert "past_ssm_state.1" in bad[1].note and "> the 30% bound" in bad[1].note
    result = CliRunner().invoke(cli, ["validate", str(broken), "--steps", "4"])
    assert result.exit_code == 1 and "state_drift: FAIL" in result.output, result.output


def test_bench_times_the_int4_copy_beside_its_source(int4_copies, tmp_path):
    out = int4_copies("mamba")
    report = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", str(out), "--fast", "--json", str(report)])
    assert result.exit_code == 0, result.output
    source = json.loads((out / "manifest.json").read_text())["quantization"]["source"]["folder"]
    assert f"int4 {out} vs its float32 source {source}" in result.output
    side = json.loads(report.read_text())["int4_vs_float32"]
    assert side["quantization"]["block_size"] == 32
    assert all(r["step_int4_ms"] > 0 and r["step_float32_ms"] > 0 for r in side["rows"])
    alone = side["linears_alone"]  # 4 layers' in/out projections and the head int4; x_proj, dt_proj float
    assert (alone["graph"], alone["linears"], alone["int4_linears"]) == ("step", 17, 9)
    assert alone["float32_linears"] == 17  # the same linears, from the source's step graph
    # the int4 graph's linears hold its int4 weights (a quarter of the bytes, plus scales), not random ones
    assert 0.1 * alone["float32_weights_mb"] < alone["int4_weights_mb"] < 0.6 * alone["float32_weights_mb"]
    assert alone["int4_ms"] > 0 and alone["float32_ms"] > 0
    # timed beside the first context's steps: the rest and the floor are those calls' arithmetic
    row = side["rows"][0]
    assert alone["context"] == row["context"]
    assert alone["rest_float32_ms"] == pytest.approx(row["step_float32_ms"] - alone["float32_ms"])
    assert alone["rest_int4_ms"] == pytest.approx(row["step_int4_ms"] - alone["int4_ms"])
    assert alone["floor_ratio"] == pytest.approx((alone["int4_ms"] + alone["rest_float32_ms"]) / row["step_float32_ms"])
    assert "the step outside its linears" in result.output
    assert side["disk_bytes"]["int4"] < 0.5 * side["disk_bytes"]["float32"]
