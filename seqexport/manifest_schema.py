"""The form of manifest.json, checked when it is read: every field the code uses, with one
ArtifactError naming the field and the expected form (never a KeyError deep inside a run).

Torch-free (the runtime reads manifests). Written out by hand rather than with a schema
library: the rules that matter (a known family, its graphs, graph files inside the folder)
are not expressible in JSON Schema alone.
"""

import re
from pathlib import Path, PurePosixPath

from seqexport import families
from seqexport.errors import ArtifactError
from seqexport.generation_config import check_record
from seqexport.specs import DIM_NAMES, DTYPES, ROLES

EXPORT_DTYPES = ("float32", "float16")  # what an export's weights may be
WEIGHT_DTYPES = {"float32": 4, "float16": 2, "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1}  # bytes each
SHA256 = re.compile(r"[0-9a-f]{64}")


class _Check:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, field: str, expected: str, value) -> None:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ArtifactError(f"{self.path}: field {field!r} is {shown}; expected {expected}")

    def get(self, d: dict, key: str, where: str, expected: str, ok, optional=False):
        field = f"{where}.{key}" if where else key
        if key not in d:
            if optional:
                return None
            raise ArtifactError(f"{self.path}: field {field!r} is missing; expected {expected}")
        if not ok(d[key]):
            self.fail(field, expected, d[key])
        return d[key]


def _int(minimum: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _inside(folder: Path, file) -> bool:
    """A plain relative path that stays inside the folder (no '..', not absolute)."""
    if not isinstance(file, str) or not file or "\\" in file:
        return False
    p = PurePosixPath(file)
    return not p.is_absolute() and ".." not in p.parts and (folder / file).resolve().is_relative_to(folder.resolve())


def _one_of(options):
    """A string among `options` (a list or dict given instead is refused, not hashed)."""
    return lambda v: isinstance(v, str) and v in options


def _tensor_ok(t) -> bool:
    return (isinstance(t, dict) and isinstance(t.get("name"), str) and _one_of(DTYPES)(t.get("dtype"))
            and isinstance(t.get("dims"), list)
            and all(_int(0)(d) or _one_of(DIM_NAMES)(d) for d in t["dims"])
            and _one_of(ROLES)(t.get("role", ""))
            and (t.get("vocab_size") is None or _int(1)(t["vocab_size"])))


def _stored_ok(t, size: int) -> bool:
    """A tensor's place in the weights file: inside it, its length that of its dtype and dims."""
    if not (isinstance(t, dict) and _int(0)(t.get("offset")) and _int(0)(t.get("length"))
            and _one_of(WEIGHT_DTYPES)(t.get("dtype")) and isinstance(t.get("dims"), list) and all(map(_int(0), t["dims"]))):
        return False
    count = 1
    for d in t["dims"]:
        count *= d
    return t["length"] == count * WEIGHT_DTYPES[t["dtype"]] and t["offset"] + t["length"] <= size


def check_manifest(m: dict, folder: Path, path: Path) -> None:
    """Raise ArtifactError for the first field of `m` that is missing or malformed."""
    c = _Check(path)
    name = c.get(m, "family", "", f"one of {families.names()}", _one_of(families.REGISTRY))
    family = families.REGISTRY[name]
    c.get(m, "dtype", "", f"one of {list(EXPORT_DTYPES)}", _one_of(EXPORT_DTYPES))
    c.get(m, "opset", "", "an integer >= 7", _int(7))
    config = c.get(m, "config", "", "an object (the model config)", lambda v: isinstance(v, dict))
    for key, minimum in family.config_fields.items():
        c.get(config, key, "config", f"an integer >= {minimum}", _int(minimum))
    tok = c.get(m, "tokenizer", "", "null or an object with a 'type'",
                lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("type"), str)), optional=True)
    if tok and "file" in tok:  # a tokenizer file copied into the artifact, hashed like a graph
        c.get(tok, "file", "tokenizer", "a file name inside the exported folder", lambda v: _inside(folder, v))
        c.get(tok, "sha256", "tokenizer", "64 lowercase hex digits", lambda v: isinstance(v, str) and SHA256.fullmatch(v))
        c.get(tok, "bytes", "tokenizer", "a byte count (integer >= 0)", _int(0))
    if tok and "chat_template" in tok:  # a Hugging Face tokenizer's chat template, a file hashed like it
        chat = c.get(tok, "chat_template", "tokenizer", "an object (file, sha256, bytes, special_tokens) beside "
                     "an 'hf' tokenizer", lambda v: isinstance(v, dict) and tok.get("type") == "hf")
        c.get(chat, "file", "tokenizer.chat_template", "a file name inside the exported folder",
              lambda v: _inside(folder, v))
        c.get(chat, "sha256", "tokenizer.chat_template", "64 lowercase hex digits",
              lambda v: isinstance(v, str) and SHA256.fullmatch(v))
        c.get(chat, "bytes", "tokenizer.chat_template", "a byte count (integer >= 0)", _int(0))
        c.get(chat, "special_tokens", "tokenizer.chat_template", "an object of token names to strings",
              lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), optional=True)
    graphs = c.get(m, "graphs", "", f"an object with the graphs {list(family.graphs)}",
                   lambda v: isinstance(v, dict))
    if set(graphs) != set(family.graphs):
        c.fail("graphs", f"exactly the {name} graphs {list(family.graphs)}", sorted(graphs))
    for g, entry in graphs.items():
        _check_graph_entry(c, f"graphs.{g}", entry, folder)
    weights = c.get(m, "weights", "", "null or an object (file, sha256, bytes, tensors)",
                    lambda v: v is None or isinstance(v, dict), optional=True)
    if weights:  # one external-data file every graph reads its weights from
        c.get(weights, "file", "weights", "a file name inside the exported folder", lambda v: _inside(folder, v))
        c.get(weights, "sha256", "weights", "64 lowercase hex digits",
              lambda v: isinstance(v, str) and SHA256.fullmatch(v))
        size = c.get(weights, "bytes", "weights", "a byte count (integer >= 0)", _int(0))
        c.get(weights, "tensors", "weights", "an object: name -> {offset, length, dtype, dims} inside the file",
              lambda v: isinstance(v, dict) and all(_stored_ok(t, size) for t in v.values()))
    generation = m.get("generation")
    if generation is not None and (problem := check_record(generation)) is not None:
        c.fail("generation", f"null or the checkpoint's generation defaults: {problem}", generation)
    for key in ("source", "export_options", "parity", "versions", "quantization"):
        c.get(m, key, "", "an object", lambda v: v is None or isinstance(v, dict), optional=True)


def _check_graph_entry(c: "_Check", where: str, entry, folder: Path) -> None:
    """One graph's entry: its file and hash, its I/O, its feeds/appends, its own data file."""
    if not isinstance(entry, dict):
        c.fail(where, "an object (file, sha256, bytes, inputs, outputs)", entry)
    c.get(entry, "file", where, "a file name inside the exported folder", lambda v: _inside(folder, v))
    c.get(entry, "sha256", where, "64 lowercase hex digits", lambda v: isinstance(v, str) and SHA256.fullmatch(v))
    c.get(entry, "bytes", where, "a byte count (integer >= 0)", _int(0))
    for kind in ("inputs", "outputs"):
        c.get(entry, kind, where, "a list of {name, dtype, dims} with known dtypes and dim names",
              lambda v: isinstance(v, list) and v and all(_tensor_ok(t) for t in v))
    for key in ("feeds", "appends"):
        c.get(entry, key, where, "a list of [output, state input] pairs",
              lambda v: isinstance(v, list) and all(isinstance(f, list) and len(f) == 2
                                                    and all(isinstance(x, str) for x in f) for f in v),
              optional=True)
    if "data_file" in entry:
        c.get(entry, "data_file", where, "a file name inside the exported folder", lambda v: _inside(folder, v))
        c.get(entry, "data_sha256", where, "64 lowercase hex digits",
              lambda v: isinstance(v, str) and SHA256.fullmatch(v))
        c.get(entry, "data_bytes", where, "a byte count (integer >= 0)", _int(0))
