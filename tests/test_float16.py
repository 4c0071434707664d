"""float16 exports: weights and activations in fp16, the SSM state and scan in fp32, parity within fp16 tolerance."""

import onnx
import pytest
import torch
from onnx import TensorProto

from seqexport.checkpoints.presets import build_preset
from seqexport.families.mamba.export import export_mamba
from seqexport.families.transformer.export import export_transformer
from seqexport.parity.validate import validate


def io_types(path):
    m = onnx.load(str(path))
    return {v.name: v.type.tensor_type.elem_type for v in list(m.graph.input) + list(m.graph.output)}, m


@pytest.mark.parametrize("family", ["transformer", "mamba"])
def test_float16_export_validates(family, tmp_path):
    ckpt = build_preset(family, "tiny", seed=2)
    out = tmp_path / family
    if family == "transformer":
        export_transformer(ckpt, "tiny", out, dtype="float16")
        types, _ = io_types(out / "decoder.onnx")
        assert types["logits"] == TensorProto.FLOAT16
        assert types["past_key_values.0.decoder.key"] == TensorProto.FLOAT16
    else:
        export_mamba(ckpt, "tiny", out, dtype="float16", scan="loop")
        types, model = io_types(out / "prefill.onnx")
        assert types["past_conv_state.0"] == TensorProto.FLOAT16
        assert types["past_ssm_state.0"] == TensorProto.FLOAT and types["present_ssm_state.1"] == TensorProto.FLOAT
        scan = next(n for n in model.graph.node if n.op_type == "Scan")
        body = next(a.g for a in scan.attribute if a.name == "body")
        assert all(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in body.output)  # the scan runs in fp32
        weights = {i.name: i.data_type for i in model.graph.initializer}
        assert weights["model.backbone.layers.0.mixer.conv1d.bias"] == TensorProto.FLOAT16
    assert next(ckpt.model.parameters()).dtype == torch.float32  # export converted a copy
    report = validate(out, steps=6, write_summary=False)
    assert report.passed, report.table()
    assert report.atol > 1e-4  # the float16 tolerance row, not float32's
