"""Interrupts: Ctrl-C gives one line and exit 130; the earlier export survives an interrupt or a
failure at any instant, including between the two renames that replace it."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seqexport.export import atomic
from tests.conftest import sigint_as_a_terminal_sends_it


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def earlier(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "manifest.json").write_text('{"earlier": true}')
    (target / "graph.onnx").write_bytes(b"weights")
    return target


def test_a_failure_between_the_two_renames_puts_the_earlier_export_back(earlier, monkeypatch):
    before = _tree(earlier)
    real, calls = os.replace, []

    def second_rename_fails(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the earlier export is set aside; the new one is not in place yet
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", second_rename_fails)
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_folder(earlier, overwrite=True) as tmp:
            (tmp / "manifest.json").write_text('{"new": true}')
    assert len(calls) >= 2
    assert _tree(earlier) == before
    assert list(earlier.parent.glob(".model.*")) == []


def test_a_kill_between_the_two_renames_is_undone_by_the_next_export(earlier):
    """SIGKILL after the first rename: the earlier export waits in .old-<pid>; no target exists.
    The next export to the target puts it back before anything else."""
    before = _tree(earlier)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    aside = earlier.parent / f".model.old-{dead}-x1"
    aside.mkdir()
    os.replace(earlier, aside / "model")
    atomic.remove_stale(earlier)
    assert _tree(earlier) == before and not aside.exists()


def test_signals_are_held_during_the_swap(earlier, monkeypatch):
    """A SIGINT that arrives during the swap is delivered after it, when the new export is in place."""
    got = []
    old = signal.signal(signal.SIGINT, lambda *a: got.append(earlier.joinpath("manifest.json").read_text()))
    try:
        with atomic.atomic_folder(earlier, overwrite=True) as tmp:
            (tmp / "manifest.json").write_text('{"new": true}')
            real = os.replace

            def replace_and_interrupt(src, dst):
                os.kill(os.getpid(), signal.SIGINT)  # held back by the swap
                return real(src, dst)

            monkeypatch.setattr(atomic.os, "replace", replace_and_interrupt)
        monkeypatch.undo()
        assert got and set(got) == {'{"new": true}'}  # delivered once the new export was in place
    finally:
        signal.signal(signal.SIGINT, old)


def export_under_way(target: Path) -> subprocess.Popen:
    """An export to `target` in a subprocess, returned once its temporary folder exists."""
    proc = subprocess.Popen([sys.executable, "-m", "seqexport.cli", "export", "transformer", "--preset", "tiny",
                             "--out", str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_a_terminal_sends_it)
    deadline = time.time() + 120
    while time.time() < deadline and not list(target.parent.glob(f".{target.name}.tmp-*")):
        time.sleep(0.05)
    return proc


def test_ctrl_c_during_an_export_is_one_line_and_exit_130(tmp_path):
    target = tmp_path / "model"
    proc = export_under_way(target)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.lstrip().startswith("exporting")]
    assert lines == ["interrupted"], err
    assert "Traceback" not in err
    assert not target.exists() and list(tmp_path.glob(".model.*")) == []


def test_ctrl_c_before_the_command_starts_its_work(tmp_path):
    """Interrupted while torch is still being imported: the same one line and exit 130."""
    proc = subprocess.Popen([sys.executable, "-m", "seqexport.cli", "export", "mamba", "--preset", "tiny",
                             "--out", str(tmp_path / "m")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_a_terminal_sends_it)
    time.sleep(0.8)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err
    assert not (tmp_path / "m").exists()


def test_ctrl_c_inside_an_import_lands_once_the_import_is_done(tmp_path):
    """The CLI's SIGINT handler defers a Ctrl-C that arrives inside an import (there it could unwind
    into torch's C++ initialisation, which aborts the process) and raises it right after."""
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while this module is being imported\n"
        "end = time.monotonic() + 0.3\n"
        "while time.monotonic() < end:  # Python bytecode: where a handler runs\n"
        "    pass\n"
        "DONE = True\n")
    script = (
        "import signal, sys, time\n"
        "from seqexport.cli import sigint_outside_imports\n"
        "signal.signal(signal.SIGINT, sigint_outside_imports)\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "try:\n"
        "    import slow_module\n"
        "    time.sleep(5)\n"
        "    print('never interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after the import' if 'slow_module' in sys.modules and sys.modules['slow_module'].DONE"
        " else 'interrupted inside the import')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         preexec_fn=sigint_as_a_terminal_sends_it)
    assert out.returncode == 0 and out.stdout.strip() == "interrupted after the import", out.stdout + out.stderr


def test_broken_pipe_is_silent(tmp_path, transformer_tiny):
    folder = transformer_tiny[1]
    proc = subprocess.run(f"{sys.executable} -m seqexport.cli inspect {folder} | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and proc.stderr == "", proc.stderr
    # a reader gone before the first write (`true` reads nothing): silent too, and the command's
    # own exit status is 141 (128 + SIGPIPE) as Unix tools end, not click's 1; pipefail shows it
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m seqexport.cli inspect {folder} | true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 141 and proc.stderr == "", (proc.returncode, proc.stderr)


def test_sigterm_is_exit_143_and_cleans_up(tmp_path):
    target = tmp_path / "model"
    proc = export_under_way(target)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert not target.exists() and list(tmp_path.glob(".model.*")) == []
    shutil.rmtree(tmp_path, ignore_errors=True)
