"""What tests/test_foreign_genai.py and tests/test_foreign_mobius.py share: a peer tool's venv
(scripts/peers.sh, built once under a lock and kept), a folder all xdist workers share, the CLI's
validate with its JSON report, and a copy of an artifact with one weight moved."""

import fcntl
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import numpy_helper

from seqexport.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("SEQEXPORT_PEERS", ROOT / ".venv-peers"))  # as scripts/peers.sh reads it


def peer_python(name: str) -> Path:
    """The python of the peer venv `name`, built on first use (about 3 minutes with PyPI)."""
    PEERS.mkdir(parents=True, exist_ok=True)
    with open(PEERS / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = subprocess.run(["bash", str(ROOT / "scripts" / "peers.sh"), name], capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-3000:]
    return PEERS / name / "bin" / "python"


def run_peer(args: list, what: str) -> None:
    run = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                         env=os.environ | {"HF_HUB_OFFLINE": "1"})  # local folders only: no model hub
    assert run.returncode == 0, f"{what}: {run.stderr[-3000:]}"


@contextmanager
def made_once(tmp_path_factory, worker_id, name):
    """(folder, done): a folder every xdist worker of this session shares, held under a lock;
    `done` is False until a worker finished making its content (then touch folder/done)."""
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if worker_id != "master" else root) / name
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root, (root / "done").is_file()


def validate(folder, reference, tmp_path, *extra):
    """seqexport validate FOLDER --reference REFERENCE: (click result, the JSON report or None)."""
    report = tmp_path / f"report-{Path(folder).name}.json"
    result = CliRunner().invoke(cli, ["validate", str(folder), "--reference", str(reference), "--steps", "12",
                                      "--report", str(report), *extra])
    return result, (json.loads(report.read_text()) if report.is_file() else None)


def figures(report) -> dict:
    """{output: max abs} over every case: the figures the notes report."""
    return {o["name"]: o["max_abs"] for check in report["checks"].values() for c in check["cases"]
            for o in c["outputs"]}


def failing(report, check: str = "teacher_forced") -> list[str]:
    return [o["name"] for c in report["checks"][check]["cases"] for o in c["outputs"] if not o["passed"]]


def perturbed(folder, out, initializer: str, delta: float = 1e-2) -> Path:
    """A copy of `folder` with every element of one weight moved by +-delta (random signs)."""
    shutil.copytree(folder, out)
    graph = out / "model.onnx"
    model = onnx.load(str(graph))  # the weights of model.onnx.data too
    init = next(i for i in model.graph.initializer if i.name == initializer)
    w = numpy_helper.to_array(init)
    signs = np.random.default_rng(0).choice([-1, 1], w.shape).astype(w.dtype)
    init.CopyFrom(numpy_helper.from_array(w + signs * np.float32(delta), initializer))
    (out / "model.onnx.data").unlink(missing_ok=True)
    onnx.save(model, str(graph), save_as_external_data=True, location="model.onnx.data")
    return out
