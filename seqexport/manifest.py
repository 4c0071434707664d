"""manifest.json of an exported folder: what the graphs are and how to check them.

Torch-free: the runtime reads it. `read_manifest` refuses a missing, corrupt or
unknown-version manifest and (by default) any graph file whose size or sha256
differs from what export recorded.
"""

import hashlib
import json
import os
from pathlib import Path

from seqexport.errors import ArtifactError
from seqexport.generation_config import current_record, generation_lines
from seqexport.jsonfile import read_json_object
from seqexport.manifest_schema import check_manifest
from seqexport.specs import GraphSpec

MANIFEST = "manifest.json"
FORMAT = "seqexport"
FORMAT_VERSION = 1


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def graph_entry(folder: Path, spec: GraphSpec, file: str) -> dict:
    """The manifest record of one graph file already written into `folder`."""
    entry = {"file": file, "sha256": sha256_file(folder / file), "bytes": (folder / file).stat().st_size}
    data = folder / (file + ".data")
    if data.exists():  # external weights (graphs over the 2 GB protobuf limit)
        entry["data_file"] = data.name
        entry["data_sha256"] = sha256_file(data)
        entry["data_bytes"] = data.stat().st_size
    return entry | spec.to_dict()


def write_manifest(folder: str | Path, manifest: dict) -> None:
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION} | manifest
    (Path(folder) / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def read_manifest(folder: str | Path, verify: bool = True) -> dict:
    """Load and check manifest.json; with `verify`, hash every graph file against it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"{str(folder)!r} is not an exported folder (no such directory)")
    path = folder / MANIFEST
    m = read_json_object(path, ArtifactError,
                         f"{str(folder)!r} has no {MANIFEST}; is it the output of `seqexport export`?")
    if m.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not a seqexport manifest (expected \"format\": \"{FORMAT}\")")
    if m.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{path} has format_version {m.get('format_version')!r}; this seqexport reads version {FORMAT_VERSION}"
        )
    check_manifest(m, folder, path)
    if m.get("generation"):  # (an older export's record: keys applied since then read as applied)
        m["generation"] = current_record(m["generation"])
    graph_specs(m)  # the specs must build (e.g. every feed names an output of its graph)
    if verify:
        _verify_files(folder, m)
    return m


def _verify_files(folder: Path, m: dict) -> None:
    """Every file the manifest names against its size and sha256."""
    for name, g in m["graphs"].items():
        verify_file(folder, name, g["file"], g["sha256"], g["bytes"])
        if "data_file" in g:
            verify_file(folder, name, g["data_file"], g["data_sha256"], g["data_bytes"])
    weights = m.get("weights")
    if weights:
        verify_file(folder, "weights", weights["file"], weights["sha256"], weights["bytes"])
    tok = m.get("tokenizer") or {}
    if "file" in tok:
        verify_file(folder, "tokenizer", tok["file"], tok["sha256"], tok["bytes"])
    if "chat_template" in tok:
        chat = tok["chat_template"]
        verify_file(folder, "chat template", chat["file"], chat["sha256"], chat["bytes"])


def tokenizer_files(manifest: dict) -> list[str]:
    """The files the manifest's tokenizer record names: its tokenizer file, its chat template."""
    tok = manifest.get("tokenizer") or {}
    return [f["file"] for f in (tok, tok.get("chat_template") or {}) if "file" in f]


def verify_file(folder: Path, graph: str, file: str, sha: str, size: int) -> None:
    what = {"weights": "shared weights", "tokenizer": "tokenizer", "chat template": "chat template"}.get(
        graph, f"graph {graph!r}")
    path = folder / file
    if not path.is_file():
        raise ArtifactError(f"{what}: file {path} is missing")
    actual = path.stat().st_size
    if actual != size:
        raise ArtifactError(f"{what}: {path} has {actual} bytes, the manifest says {size} (truncated or replaced)")
    digest = sha256_file(path)
    if digest != sha:
        raise ArtifactError(f"{what}: sha256 of {path} is {digest[:12]}…, the manifest says {sha[:12]}… (file altered)")


def graph_specs(manifest: dict) -> dict[str, GraphSpec]:
    # For manifests of seqexport 0.1.0 (no declared token ranges): the smallest vocabulary.
    vocab = min((v for k, v in manifest["config"].items() if k.endswith("vocab_size")), default=2)
    try:
        return {name: GraphSpec.from_dict(name, g, vocab) for name, g in manifest["graphs"].items()}
    except (KeyError, ValueError) as e:  # e.g. a feed naming no output of its graph
        raise ArtifactError(f"{MANIFEST}: malformed graph spec: {e}") from None


def update_manifest(folder: str | Path, **fields) -> None:
    """Set top-level fields of an existing manifest.json, atomically (temp file + rename)."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text()) | fields
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)


def _quantization_line(q: dict) -> str:
    """A quantised copy's record in one line: its weights, head, experts and source."""
    if q.get("bits") == 4:
        how = f"int4 weight-only (block {q.get('block_size')}, accuracy level {q.get('accuracy_level')})"
    else:
        how = f"int8 ({q.get('mode')}{', per channel' if q.get('per_channel') else ''})"
    parts = [how, f"head {q.get('head', 'float32')}"]
    if q.get("experts"):
        e = q["experts"]
        block = f"block {e['block_size']}" if e.get("block_size") else "a scale per row"
        parts.append(f"experts {e['op']} int{e['bits']} ({block})"
                     + (f", the dense ones int{e['dense_bits']}" if e.get("dense_bits") else ""))
    source = (q.get("source") or {}).get("folder")
    return "quantization: " + ", ".join(parts) + (f"; from {source}" if source else "")


def describe(folder, m: dict) -> str:
    """A manifest as a person reads it (`seqexport inspect`)."""
    versions = m.get("versions") or {}
    lines = [f"{folder}: {m['family']} · opset {m['opset']} · {m['dtype']}"
             + (f" · seqexport {versions['seqexport']}" if "seqexport" in versions else "")]
    source = m.get("source") or {}
    if source:
        what = f"preset {source['preset']} (weights in {source['checkpoint']}/)" if source.get("preset") \
            else f"checkpoint {source.get('checkpoint')}"
        lines.append(f"source: {what}, sha256 {str(source.get('sha256'))[:12]}…")
    tok = m.get("tokenizer")
    lines.append("tokenizer: " + ("none (prompts as ids)" if not tok else
                                  ", ".join(f"{k} {v}" for k, v in tok.items() if not isinstance(v, dict))))
    if tok and tok.get("chat_template"):
        lines.append(f"chat template: {tok['chat_template']['file']} (POST /v1/chat/completions, generate --chat)")
    lines += generation_lines(m.get("generation"))
    options = {k: v for k, v in (m.get("export_options") or {}).items() if v is not None}
    if options:
        lines.append("export options: " + ", ".join(f"{k}={v}" for k, v in options.items()))
    if m.get("quantization"):
        lines.append(_quantization_line(m["quantization"]))
    weights = m.get("weights")
    if weights:
        lines.append(f"weights: {weights['file']} ({weights['bytes'] / 1e6:.2f} MB, {len(weights['tensors'])} "
                     "tensors, shared by every graph)")
    for name, g in m["graphs"].items():
        size = g["bytes"] + g.get("data_bytes", 0)
        lines.append(f"  {name}: {g['file']} ({size / 1e6:.2f} MB)")
        for kind in ("inputs", "outputs"):
            for t in g[kind]:
                lines.append(f"    {kind[:-1]:6} {t['name']:40} {t['dtype']:8} {t['dims']}")
    parity = (m.get("parity") or {}).get("summary")
    if parity:
        checks = ", ".join(f"{k} {'ok' if v else 'FAIL'}" for k, v in parity.get("checks", {}).items())
        lines.append(f"parity: {'PASS' if parity.get('passed') else 'FAIL'} on {parity.get('provider')} "
                     f"at {m['parity'].get('when', '?')}, atol {parity.get('atol')} rtol {parity.get('rtol')}: {checks}")
        lines += [f"  {f}" for f in parity.get("failures", [])]
    else:
        lines.append("parity: not validated yet (seqexport validate)")
    return "\n".join(lines)
