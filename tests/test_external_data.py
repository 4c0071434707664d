"""Graphs over the protobuf limit are written with external data: forced here on a tiny model."""

import pytest

import seqexport.export.common as common
import seqexport.runtime as rt
from seqexport.checkpoints.presets import build_preset
from seqexport.errors import ArtifactError
from seqexport.families.transformer.export import export_transformer
from seqexport.parity.validate import validate


def test_external_data_export_loads_validates_and_is_hashed(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "TWO_GB", (256 << 20) + 1)  # every graph counts as "large"
    out = tmp_path / "ext"
    export_transformer(build_preset("transformer", "tiny", seed=4), "tiny", out)
    assert (out / "decoder.onnx.data").stat().st_size > (out / "decoder.onnx").stat().st_size
    model = rt.load(out)
    assert model.manifest["graphs"]["decoder"]["data_file"] == "decoder.onnx.data"
    assert validate(out, steps=4, write_summary=False).passed
    with open(out / "decoder.onnx.data", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(ArtifactError, match="decoder.onnx.data.*file altered"):
        rt.load(out)
