"""Write an export folder atomically: build it in a hidden temporary folder, then rename.

An exception or Ctrl-C midway removes the temporary folder and leaves an earlier
export at the target untouched; an existing target is replaced only with
`overwrite`. Replacing takes two renames (the earlier export aside, the new one in):
SIGINT/SIGTERM are held back between them, and a failure of the second puts the
earlier export back. A process killed outright (SIGKILL) cannot clean up: its hidden
folders carry its pid, and the next export to the same target removes them once that
process is gone — restoring an earlier export it finds set aside with no target in place.
"""

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from seqexport.errors import ExportError, UsageError

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def file_in_the_way(folder: Path) -> Path | None:
    """The file where `folder` or one of the folders above it should be, if any (why it cannot
    be made: mkdir's "[Errno 17] File exists" names no path a user gave)."""
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)


def check_target(target: Path, overwrite: bool) -> None:
    if target.exists() and not target.is_dir():
        raise ExportError(f"{str(target)!r} exists and is not a folder")
    if target.exists() and not overwrite:
        raise ExportError(f"{str(target)!r} already exists; pass --overwrite to replace it")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(target: Path) -> None:
    """Clean up after killed exports next to `target`: an earlier export set aside while no
    target exists goes back in place; every other leftover folder is removed."""
    for kind in ("old", "tmp"):
        for p in target.parent.glob(f".{target.name}.{kind}-*"):
            pid = p.name.split(f".{kind}-", 1)[1].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            if kind == "old" and (p / target.name).is_dir() and not target.exists():
                os.replace(p / target.name, target)
            shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT and SIGTERM back until the block ends, then deliver them to the handlers
    that were in place. (A thread mask would not do: the kernel hands a process's signal to
    any thread that does not block it, and torch and onnxruntime run threads of their own.)"""
    pending: list[int] = []
    try:
        old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in HELD_SIGNALS}
    except ValueError:  # not the main thread, which is where Python runs signal handlers
        yield
        return
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in pending:
            signal.raise_signal(s)


def _swap_in(tmp: Path, target: Path) -> None:
    """Make `tmp` the target; an existing target is set aside first and put back on failure."""
    with _signals_held():
        if not target.exists():
            os.replace(tmp, target)
            return
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{os.getpid()}-", dir=target.parent))
        os.replace(target, old / target.name)
        try:
            os.replace(tmp, target)
        except BaseException:
            if not target.exists():
                os.replace(old / target.name, target)
            shutil.rmtree(old, ignore_errors=True)
            raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(target: str | Path, overwrite: bool = False):
    """Yield a temporary folder next to `target`; on success it becomes `target`."""
    target = Path(target)
    check_target(target, overwrite)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
    except OSError as e:  # a file where a folder must be, no permission: the caller's path, named
        blocker = file_in_the_way(target.parent)
        why = f"{blocker} is a file, not a folder" if blocker is not None else (e.strerror or str(e))
        raise UsageError(f"cannot write {target}: {why}") from None
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the export is an ordinary folder
    try:
        yield tmp
        _swap_in(tmp, target)
    except BaseException:  # Ctrl-C included: nothing half-written stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
