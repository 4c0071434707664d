"""Typed errors a user can cause. The CLI prints their message on one line and exits 2.

Every class subclasses ValueError so callers who only know the standard library
can still catch them. `shown` and `listed` put the values at fault into a message.
"""

import json


class SeqexportError(ValueError):
    """Base of every error caused by input the user gave us."""


class UsageError(SeqexportError):
    """An unknown option value or a combination of options that does not make sense."""


class CheckpointError(SeqexportError):
    """A checkpoint folder that is missing, corrupt, unsafe or does not fit its config."""


class ArtifactError(SeqexportError):
    """An exported folder (manifest.json, .onnx files) that is missing, corrupt or altered."""


class InputError(SeqexportError):
    """Runtime input that does not match the graph spec (shape, dtype, token range...)."""


class ExportError(SeqexportError):
    """An export that cannot be done as asked (target exists, unsupported dtype...)."""


def shown(value, most: int = 80) -> str:
    """A value as a message names it: as JSON where it is JSON (what the user wrote), else its
    repr; cut past `most` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def listed(items: list[str], most: int = 100) -> str:
    """Every item of a short list; the first ones and a count of a long one."""
    if len(items) <= most:
        return ", ".join(items)
    return ", ".join(items[:most // 2]) + f", ... and {len(items) - most // 2} more ({len(items)} in all)"
