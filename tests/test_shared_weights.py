"""Weights once: every graph of an export reads one weights file (named after the eager
parameters, hashed in the manifest), a preset's checkpoint refers into it, and artifacts of the
earlier layouts (weights inside each graph, or one .data file per graph) still load and validate."""

import json
import shutil

import numpy as np
import onnx
import pytest
import torch

import seqexport.runtime as rt
from seqexport.checkpoints.io import load_checkpoint
from seqexport.checkpoints.presets import build_preset
from seqexport.errors import ArtifactError, ExportError
from seqexport.export.weights import ALIGN, WEIGHTS_FILE, Weights, share_weights
from seqexport.families.transformer.export import export_transformer
from seqexport.parity.validate import validate


@pytest.fixture(scope="module")
def exports(tmp_path_factory, mamba_exports):
    """family -> (checkpoint, folder): the tiny presets (Mamba perturbed, see conftest)."""
    ckpt = build_preset("transformer", "tiny", seed=3)
    out = tmp_path_factory.mktemp("shared") / "transformer"
    export_transformer(ckpt, "tiny", out)
    return {"transformer": (ckpt, out), "mamba": mamba_exports("loop")}


def stored(folder, manifest, name) -> np.ndarray:
    t = manifest["weights"]["tensors"][name]
    raw = (folder / manifest["weights"]["file"]).read_bytes()[t["offset"]: t["offset"] + t["length"]]
    return np.frombuffer(raw, t["dtype"]).reshape(t["dims"])


@pytest.mark.parametrize("family", ["transformer", "mamba"])
def test_graphs_share_one_file_named_after_the_eager_parameters(exports, family):
    ckpt, folder = exports[family]
    m = json.loads((folder / "manifest.json").read_text())
    params = {f"model.{k}": v.numpy() for k, v in ckpt.model.state_dict().items()}
    refs = {}
    for g in m["graphs"].values():
        model = onnx.load(str(folder / g["file"]), load_external_data=False)
        external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert external, g["file"]
        for t in external:
            info = {e.key: e.value for e in t.external_data}
            assert info["location"] == WEIGHTS_FILE
            assert int(info["offset"]) == m["weights"]["tensors"][t.name]["offset"]
            refs.setdefault(t.name, set()).add(g["file"])
    # the big ones are the eager parameters, bit for bit, under their module paths
    named = 0
    for name in refs:
        base = name.removesuffix(".T").removesuffix(".view")
        if base not in params:
            continue
        want = params[base]
        if name.endswith(".T"):
            want = want.reshape([d for d in want.shape if d != 1]).T
        np.testing.assert_array_equal(stored(folder, m, name).reshape(want.shape), want)
        named += 1
    big = sum(v.nbytes >= 1024 for v in params.values())
    assert named >= big // 2, f"only {named} of {len(refs)} stored tensors carry a parameter's name"
    assert not [n for n in refs if n.startswith("val_")]
    layouts = {}
    for name in refs:
        layouts.setdefault(name.removesuffix(".T").removesuffix(".view"), []).append(name)
    assert not {k: v for k, v in layouts.items() if len(v) > 1 and k in params and params[k].ndim == 2}, \
        "a matrix stored in two layouts"
    if family == "mamba":  # prefill and step are one model: they read the same weights
        shared = [n for n, files in refs.items() if len(files) == len(m["graphs"])]
        assert len(shared) >= len(refs) * 3 // 4, "the graphs hold their weights apart"
    # once on disk: the file holds each weight once (the tied head too), plus small derived constants
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in ckpt.model.state_dict().values()}
    assert m["weights"]["bytes"] <= 1.1 * sum(unique.values())


@pytest.mark.parametrize("family", ["transformer", "mamba"])
def test_preset_checkpoint_refers_into_the_weights_and_rebuilds_the_model(exports, family):
    ckpt, folder = exports[family]
    weight_bytes = sum(v.numel() * v.element_size() for v in ckpt.model.state_dict().values())
    assert (folder / "checkpoint" / "model.safetensors").stat().st_size < weight_bytes / 4
    rebuilt = load_checkpoint(folder / "checkpoint").model.state_dict()
    for k, v in ckpt.model.state_dict().items():
        assert torch.equal(rebuilt[k], v), k


def test_an_altered_weights_file_is_refused(exports, tmp_path):
    _, folder = exports["transformer"]
    out = tmp_path / "altered"
    shutil.copytree(folder, out)
    with open(out / WEIGHTS_FILE, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(ArtifactError, match=f"shared weights: sha256 of .*{WEIGHTS_FILE}.*file altered"):
        rt.load(out)


def test_every_session_gets_the_same_weight_memory(exports):
    _, folder = exports["mamba"]
    model = rt.load(folder, provider="cpu")
    shared = model.shared_weights
    assert shared is not None and shared.nbytes == model.manifest["weights"]["bytes"]
    first = next(iter(shared.values.values()))
    assert first.data_ptr() == shared.data.ctypes.data + next(iter(model.manifest["weights"]["tensors"].values()))["offset"]


def packs(graph) -> bool:
    """Whether this graph's session prepacks its weights (ORT's own option, as the session holds it)."""
    try:
        return graph.session.get_session_options().get_session_config_entry("session.disable_prepacking") != "1"
    except Exception:  # noqa: BLE001 - ORT raises when the entry was never set: packing is on
        return True


def test_a_small_model_packs_its_shared_weights_and_a_large_one_reads_the_pages(exports, monkeypatch):
    """Mamba's prefill and step read the same weights: packed in each session when they are few
    (the bundled models: faster batched steps); when they are many the prefill reads the one
    mapped file and only the one-token step packs (session.PACK_STEP_BYTES).
    A transformer's encoder and decoder share only a positional table: they pack either way."""
    import seqexport.runtime.session as session

    mamba, transformer = exports["mamba"][1], exports["transformer"][1]
    assert all(packs(g) for g in rt.load(mamba, provider="cpu").graphs.values())
    monkeypatch.setattr(session, "PACK_SHARED_BYTES", 0)  # as if the weights were large
    assert [name for name, g in rt.load(mamba, provider="cpu").graphs.items() if packs(g)] == ["step"]
    assert all(packs(g) for g in rt.load(transformer, provider="cpu").graphs.values())


def old_layout(folder, out, per_graph_data: bool):
    """The folder as seqexport wrote it before the shared file: weights inside each graph (or in
    `<graph>.onnx.data`), no "weights" entry, a full copy of the checkpoint."""
    from seqexport.manifest import sha256_file

    ckpt = load_checkpoint(folder / "checkpoint")
    out.mkdir()
    m = json.loads((folder / "manifest.json").read_text())
    for g in m["graphs"].values():
        model = onnx.load(str(folder / g["file"]))
        onnx.save_model(model, str(out / g["file"]), save_as_external_data=per_graph_data,
                        location=g["file"] + ".data" if per_graph_data else None)
        g.update(sha256=sha256_file(out / g["file"]), bytes=(out / g["file"]).stat().st_size)
        if per_graph_data:
            data = out / (g["file"] + ".data")
            g.update(data_file=data.name, data_sha256=sha256_file(data), data_bytes=data.stat().st_size)
    from seqexport.checkpoints.io import checkpoint_sha256, save_checkpoint

    save_checkpoint(ckpt.model, ckpt.config, ckpt.family, out / "checkpoint")
    m.pop("weights")
    m["source"]["sha256"] = checkpoint_sha256(out / "checkpoint")
    (out / "manifest.json").write_text(json.dumps(m))
    return out


@pytest.mark.parametrize("per_graph_data", [False, True], ids=["inline", "per-graph-data"])
def test_artifacts_of_the_earlier_layouts_still_load_and_validate(exports, tmp_path, per_graph_data):
    _, folder = exports["mamba"]
    out = old_layout(folder, tmp_path / "old", per_graph_data)
    assert not (out / WEIGHTS_FILE).exists()
    model = rt.load(out)
    assert model.shared_weights is None
    assert validate(out, steps=4, write_summary=False).passed
    if per_graph_data:
        with open(out / "step.onnx.data", "r+b") as f:
            f.seek(100)
            f.write(b"\xff\xff\xff\xff")
        with pytest.raises(ArtifactError, match="step.onnx.data.*file altered"):
            rt.load(out)


@pytest.mark.parametrize("edit, field", [
    (lambda w: w.update(file="../elsewhere.data"), "weights.file"),
    (lambda w: next(iter(w["tensors"].values())).update(offset=w["bytes"]), "weights.tensors"),
    (lambda w: next(iter(w["tensors"].values())).update(dims=[3]), "weights.tensors"),
    (lambda w: w.pop("sha256"), "weights.sha256"),
])
def test_a_malformed_weights_entry_is_refused_naming_the_field(exports, tmp_path, edit, field):
    _, folder = exports["mamba"]
    out = tmp_path / "bad"
    shutil.copytree(folder, out)
    m = json.loads((out / "manifest.json").read_text())
    edit(m["weights"])
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=f"field '{field}'"):
        rt.load(out)


@pytest.mark.parametrize("family", ["transformer", "mamba"])
def test_every_stored_tensor_starts_on_an_aligned_offset(exports, family):
    """The kernels that read the mapped file load whole vectors: each tensor starts at a multiple
    of 64 bytes, and the bytes before it are the zero padding."""
    _, folder = exports[family]
    m = json.loads((folder / "manifest.json").read_text())
    raw = (folder / WEIGHTS_FILE).read_bytes()
    spans = sorted((t["offset"], t["offset"] + t["length"]) for t in m["weights"]["tensors"].values())
    assert len(spans) > 4
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start % ALIGN == 0 and 0 <= start - end < ALIGN, (end, start)
        assert raw[end:start] == bytes(start - end)


def test_tensors_of_any_size_are_written_at_aligned_offsets(tmp_path):
    """Sizes that are not multiples of 64 bytes (a tiny model's rarely are not): each next tensor
    still starts aligned, and reads back from its recorded offset."""
    arrays = {"a": np.arange(300, dtype=np.float32), "b": np.arange(7, dtype=np.int64) - 3,
              "c": np.linspace(-1, 1, 333, dtype=np.float32).reshape(9, 37)}
    weights = Weights()
    for name, a in arrays.items():
        weights.add(name, a)
    weights.write(tmp_path / WEIGHTS_FILE)
    raw = (tmp_path / WEIGHTS_FILE).read_bytes()
    assert len(raw) == weights.size
    for name, a in arrays.items():
        t = weights.index[name]
        assert t["offset"] % ALIGN == 0, (name, t["offset"])
        got = np.frombuffer(raw[t["offset"]: t["offset"] + t["length"]], t["dtype"]).reshape(t["dims"])
        np.testing.assert_array_equal(got, a)


def _graph_reading(name: str, value: np.ndarray) -> onnx.ModelProto:
    """A one-node graph y = x + <name>."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(value.shape))
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(value.shape))
    graph = onnx.helper.make_graph([onnx.helper.make_node("Add", ["x", name], ["y"])], "g", [x], [y],
                                   [onnx.numpy_helper.from_array(value, name)])
    return onnx.helper.make_model(graph)


def test_one_name_never_stands_for_two_values():
    a = np.arange(512, dtype=np.float32).reshape(16, 32)
    b = a + 1
    weights = Weights()
    weights.add("w", a)
    assert weights.add("w", a.copy()) == weights.index["w"]  # the same bytes again: stored once
    with pytest.raises(ExportError, match="different values under the initializer name 'w'"):
        weights.add("w", b)
    # a parameter two graphs hold with different values is refused (a module traced twice apart)
    models = {"prefill": _graph_reading("w", a), "step": _graph_reading("w", b)}
    with pytest.raises(ExportError, match="graph 'step': parameter 'w' differs from another graph's"):
        share_weights(models, {"prefill": {"w": a}, "step": {"w": b}})
    # a derived constant torch named alike in both graphs is kept apart under the graph's name
    models = {"prefill": _graph_reading("val_3", a), "step": _graph_reading("val_3", b)}
    shared = share_weights(models, {"prefill": {}, "step": {}})
    assert set(shared.index) == {"val_3", "step.val_3"}
    np.testing.assert_array_equal(shared.arrays["step.val_3"], b)
    assert models["step"].graph.node[0].input[1] == "step.val_3"


def test_a_graphs_weights_become_views_of_the_parameters_and_leave_the_proto():
    """`named_initializers`: an initializer equal to a parameter (as is, transposed, reshaped)
    becomes a view of the parameter's own memory and the proto lets its copy go; a constant no
    parameter holds keeps its values. `as_references` / `resolved` carry that to another
    process holding the same parameters (the parallel export's children) without the bytes.
    Before, an export held every graph's weights twice more than the model (5-6x its size)."""
    from seqexport.export.weights import as_references, compacted, named_initializers, resolved

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((64, 32)).astype(np.float32),
              "conv": rng.standard_normal((48, 1, 8)).astype(np.float32)}
    derived = rng.standard_normal((40, 40)).astype(np.float32)  # a constant torch computed
    graph = onnx.helper.make_graph([], "g", [], [], initializer=[
        onnx.numpy_helper.from_array(params["w"].copy(), "val_1"),
        onnx.numpy_helper.from_array(np.ascontiguousarray(params["w"].T), "val_2"),
        onnx.numpy_helper.from_array(params["conv"].reshape(48, 8).copy(), "val_3"),
        onnx.numpy_helper.from_array(derived, "val_4")])
    model = onnx.helper.make_model(graph)
    sources = {}
    arrays = named_initializers(model, params, sources)
    assert set(arrays) == {"w", "w.T", "conv.view", "val_4"}
    for name, want in (("w", params["w"]), ("w.T", params["w"].T), ("conv.view", params["conv"].reshape(48, 8))):
        np.testing.assert_array_equal(arrays[name], want)
        assert np.shares_memory(arrays[name], params[name.split(".")[0]]), name
    np.testing.assert_array_equal(arrays["val_4"], derived)
    assert not any(t.raw_data for t in model.graph.initializer)  # the proto's copies let go
    assert compacted(model).ByteSize() < 4096
    # another process's view of the same arrays: references for the parameters' views only
    refs = as_references(arrays, sources)
    assert isinstance(refs["val_4"], np.ndarray) and all(isinstance(refs[n], tuple) for n in ("w", "w.T", "conv.view"))
    again = resolved(refs, {k: v.copy() for k, v in params.items()})
    for name, a in arrays.items():
        np.testing.assert_array_equal(again[name], a)


def test_an_export_copies_no_weight_into_a_graphs_proto(tmp_path, monkeypatch):
    """Every tensor serialised while an export runs is small: the weights go from the tensors
    torch holds to the weights file, never through a graph's proto (before, each graph being
    exported held one more copy of every weight there: Granite-4.0-H Tiny's width, 3.3 GB,
    peaked at 18.5 GB; now 5.5 GB, most of it the model as loaded)."""
    import onnx_ir

    from seqexport.export.weights import MIN_BYTES
    from seqexport.families.mamba.export import export_mamba

    sizes = []
    real = onnx_ir.serde.serialize_tensor_into

    def counting(proto, from_):
        real(proto, from_)
        sizes.append(len(proto.raw_data))

    monkeypatch.setattr(onnx_ir.serde, "serialize_tensor_into", counting)
    monkeypatch.setenv("SEQEXPORT_EXPORT_JOBS", "1")  # traced here, where the count is kept
    ckpt = build_preset("mamba", "tiny", seed=0)
    export_mamba(ckpt, "tiny", tmp_path / "m", scan="loop")
    weights = json.loads((tmp_path / "m" / "manifest.json").read_text())["weights"]
    assert sizes and weights["bytes"] > 100_000
    assert max(sizes) < MIN_BYTES, sorted(sizes)[-3:]


def test_a_buffer_kept_out_of_the_state_dict_is_one_of_the_weights_matched():
    """A graph's weight may be a buffer the export made and kept out of the state dict (the
    experts' gate/up rows interleaved for ONNX Runtime's MoE, 1.6 GB at Granite-4.0-H Tiny's
    width): it is matched as a parameter is, over its own memory, not copied per graph."""
    from seqexport.export.common import numpy_params

    block = torch.nn.Linear(8, 8)
    block.register_buffer("_rows", torch.randn(64, 32), persistent=False)
    params = numpy_params(block)
    assert set(params) == {"weight", "bias", "_rows"}
    assert np.shares_memory(params["_rows"], block._rows.numpy())
    assert np.shares_memory(params["weight"], block.weight.detach().numpy())
