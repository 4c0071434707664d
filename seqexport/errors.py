"""Typed errors a user can cause. The CLI prints their message on one line and exits 2.

Every class subclasses ValueError so callers who only know the standard library
can still catch them.
"""


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
