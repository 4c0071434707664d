"""Write an export folder atomically: build it in a hidden temporary folder, then rename.

An exception or Ctrl-C midway removes the temporary folder and leaves an earlier
export at the target untouched; an existing target is replaced only with
`overwrite`. A process killed outright (SIGKILL) cannot clean up: its hidden
temporary folder carries its pid and the next export to the same target
removes it once that process is gone.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from seqexport.errors import ExportError


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
    """Remove temporary folders left next to `target` by killed exports."""
    for kind in ("tmp", "old"):
        for p in target.parent.glob(f".{target.name}.{kind}-*"):
            pid = p.name.split(f".{kind}-", 1)[1].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(target: str | Path, overwrite: bool = False):
    """Yield a temporary folder next to `target`; on success it becomes `target`."""
    target = Path(target)
    check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the export is an ordinary folder
    try:
        yield tmp
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{os.getpid()}-", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:  # Ctrl-C included: nothing half-written stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
