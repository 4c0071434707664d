"""Write an export folder atomically: build it in a hidden temporary folder, then rename.

An exception or Ctrl-C midway removes the temporary folder and leaves an earlier
export at the target untouched; an existing target is replaced only with
`overwrite`.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from seqexport.errors import ExportError


def check_target(target: Path, overwrite: bool) -> None:
    if target.exists() and not overwrite:
        raise ExportError(f"{str(target)!r} already exists; pass --overwrite to replace it")
    if target.exists() and not target.is_dir():
        raise ExportError(f"{str(target)!r} exists and is not a folder")


@contextlib.contextmanager
def atomic_folder(target: str | Path, overwrite: bool = False):
    """Yield a temporary folder next to `target`; on success it becomes `target`."""
    target = Path(target)
    check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the export is an ordinary folder
    try:
        yield tmp
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:  # Ctrl-C included: nothing half-written stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
