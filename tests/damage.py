"""An export with one weight shifted and its manifest re-hashed, as an exporter bug would leave it:
the files agree with their manifest, the numbers are wrong (validate must fail and name the layer)."""

import json
import shutil

import numpy as np
import onnx
from onnx import numpy_helper

from seqexport.manifest import sha256_file


def damaged_copy(folder, tmp_path, graph, initializer, delta=1e-2, edit=None):
    """Copy an export, add `delta` to one initializer of one graph (or apply `edit` to it), and
    re-hash the graph in the manifest."""
    out = tmp_path / f"damaged-{graph}-{initializer}"
    shutil.copytree(folder, out)
    model = onnx.load(str(out / f"{graph}.onnx"))
    init = next(i for i in model.graph.initializer if i.name == initializer)
    w = numpy_helper.to_array(init)
    w = edit(w.copy()) if edit else w + np.float32(delta)
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(model, str(out / f"{graph}.onnx"))
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["graphs"][graph]
    entry["sha256"] = sha256_file(out / entry["file"])
    entry["bytes"] = (out / entry["file"]).stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out
