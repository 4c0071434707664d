"""Export: one checkpoint -> an artifact folder of ONNX graphs + manifest.json, atomically.

The shared steps live here (common, atomic, scan lowerings); each family's graph wrappers
live in `seqexport/families/<name>/export.py`.
"""

DEFAULT_OPSET = 18


def export_model(ckpt, preset: str | None, out, **options):
    """Export a loaded checkpoint of any registered family (options as its `export` takes)."""
    from seqexport import families

    return families.get(ckpt.family).export.export(ckpt, preset, out, **options)
