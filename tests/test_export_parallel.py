"""Graphs traced side by side (seqexport.export.parallel): the artifact is byte for byte the
one a sequential export writes; a graph that fails in its forked process fails the export
with its own message and leaves nothing behind; a bad SEQEXPORT_EXPORT_JOBS is refused."""

import os
import subprocess
import sys

import pytest

from seqexport.errors import UsageError
from seqexport.export import parallel

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked exports need os.fork")


def run_script(script: str, *args, jobs: str = "2", timeout: int = 300) -> subprocess.CompletedProcess:
    """A fresh Python (one thread, as `seqexport export` runs; a test worker may have others,
    and then the export is sequential)."""
    env = {**os.environ, "SEQEXPORT_EXPORT_JOBS": jobs}
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


EXPORT = """
import sys
from seqexport.families.transformer.export import export_transformer
from seqexport.checkpoints import build_preset
export_transformer(build_preset("transformer", "tiny", seed=0), "tiny", sys.argv[1])
"""


def test_side_by_side_export_writes_the_sequential_artifact(tmp_path):
    one = run_script(EXPORT, tmp_path / "one", jobs="1")
    assert one.returncode == 0, one.stderr[-2000:]
    assert "(2 processes)" not in one.stderr
    two = run_script(EXPORT, tmp_path / "two", jobs="2")
    assert two.returncode == 0, two.stderr[-2000:]
    assert "exporting encoder and decoder (2 processes)" in two.stderr
    for name in ("encoder.onnx", "decoder.onnx", "weights.onnx.data"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())


BROKEN_ENCODER = """
import sys
from seqexport.errors import ExportError
from seqexport.families.transformer import export as transformer_export
from seqexport.checkpoints import build_preset

real = transformer_export.exported_module

def broken(model, graph, *args):
    module = real(model, graph, *args)
    if graph == "encoder":  # the first graph: traced in the forked process
        def fail(input_ids, attention_mask):
            raise RuntimeError("the encoder cannot be traced today")
        module.forward = fail
    return module

transformer_export.exported_module = broken
try:
    transformer_export.export_transformer(build_preset("transformer", "tiny", seed=0), "tiny", sys.argv[1])
except ExportError as e:
    print("ExportError:", e)
    sys.exit(3)
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_graph_torch_cannot_export_fails_the_export_alike_and_writes_nothing(tmp_path, jobs):
    """In its forked process or in this one: one ExportError naming the graph and the cause."""
    r = run_script(BROKEN_ENCODER, tmp_path / "out", jobs=jobs)
    assert r.returncode == 3, r.stderr[-2000:]
    assert ("exporting encoder and decoder (2 processes)" in r.stderr) == (jobs == "2")
    assert "ExportError: graph 'encoder': torch.onnx cannot export it:" in r.stdout
    assert "the encoder cannot be traced today" in r.stdout
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary one


@pytest.mark.parametrize("value", ["0", "two", "-1", ""])
def test_a_bad_jobs_setting_is_refused_by_name(value, monkeypatch):
    monkeypatch.setenv("SEQEXPORT_EXPORT_JOBS", value)
    with pytest.raises(UsageError, match="SEQEXPORT_EXPORT_JOBS"):
        parallel.export_jobs()


def test_the_cli_says_what_is_wrong_with_the_jobs_setting(tmp_path):
    env = {**os.environ, "SEQEXPORT_EXPORT_JOBS": "many"}
    r = subprocess.run([sys.executable, "-m", "seqexport.cli", "export", "transformer", "--preset", "tiny",
                        "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "SEQEXPORT_EXPORT_JOBS='many'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


HELD_SESSION = """
import gc, os, sys, time
import numpy as np
import onnxruntime as ort
from seqexport.families.transformer.export import export_transformer
from seqexport.checkpoints import build_preset

ckpt = build_preset("transformer", "tiny", seed=0)
gc.disable()  # the garbage below is still there at the fork (the parent never collects it) ...
options = ort.SessionOptions()
options.intra_op_num_threads = 2  # a pool thread, which blocks on a condition variable once idle
session = ort.InferenceSession(sys.argv[2], options, providers=["CPUExecutionProvider"])
for _ in range(20):
    session.run(None, {i.name: np.ones([4, 30], np.int64) for i in session.get_inputs()})
time.sleep(0.5)  # past ORT's spinning: the pool thread waits
cycle = {"session": session}
cycle["self"] = cycle  # garbage only a collection frees: its destructor joins ORT's thread pool
del session, cycle
fork = os.fork

def fork_and_collect():  # ... and the forked child collects first thing (in the hang: on its own)
    pid = fork()
    if pid == 0:
        gc.enable()
        gc.collect()
    return pid

os.fork = fork_and_collect
export_transformer(ckpt, "tiny", sys.argv[1])
print("exported")
"""


def test_a_session_left_for_the_collector_does_not_hang_the_forked_export(tmp_path, transformer_tiny):
    """A forked child that finalised an inherited ONNX Runtime session would wait forever for
    threads that were not forked (a test worker hung so): the child never collects them."""
    _, folder = transformer_tiny
    r = run_script(HELD_SESSION, tmp_path / "out", folder / "encoder.onnx", timeout=150)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exporting encoder and decoder (2 processes)" in r.stderr
    assert (tmp_path / "out" / "decoder.onnx").exists()
