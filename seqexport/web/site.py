"""`seqexport web`: a static site that decodes exported models in the browser.

    build_site(["exported/mamba-dates"], "site")   # then: python -m http.server -d site

The site holds everything the page loads, so it never reaches past its own server:

    site/
      index.html app.mjs style.css          the page
      seqexport.mjs sampling.mjs            the runtime contract in JavaScript
      beams.mjs tokenizers.mjs
      site.json                             the models and what the Python runtime says of each
      ort/                                  onnxruntime-web's ES module and WASM files (npm package)
      vendor/tokenizers.min.mjs             @huggingface/tokenizers (Hugging Face tokenizer.json)
      vendor/jinja.mjs                      @huggingface/jinja (a checkpoint's chat template)
      models/<name>/                        manifest.json, graphs, weights, tokenizer's files

onnxruntime-web, @huggingface/tokenizers and @huggingface/jinja come from npm at the versions
locked in this package's package-lock.json: from `seqexport/web/node_modules` (a checkout after `npm ci`),
from `--node-modules`, or installed by `npm ci` into a cache folder on first use.
"""

import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from seqexport.errors import ArtifactError, UsageError
from seqexport.export.atomic import atomic_folder
from seqexport.manifest import MANIFEST, read_manifest, tokenizer_files

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
PAGE_FILES = ("index.html", "app.mjs", "style.css", "seqexport.mjs", "sampling.mjs", "beams.mjs",
              "tokenizers.mjs")
# onnxruntime-web's builds the page may import (dist/), by backend
ORT_FILES = {
    "wasm": ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"),
    "webgpu": ("ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm"),
}
ORT = "onnxruntime-web"
HF_TOKENIZERS = "@huggingface/tokenizers"
HF_JINJA = "@huggingface/jinja"
PACKAGES = (ORT, HF_TOKENIZERS, HF_JINJA)
RUNTIME_JSON = "runtime.json"  # beside each model's manifest.json in the site
MAX_PROMPT_TOKENS = 2048  # the page refuses longer prompts (as `seqexport serve` does by default)


def locked_versions() -> dict[str, str]:
    """npm package -> the version package-lock.json pins."""
    lock = json.loads((HERE / "package-lock.json").read_text())
    return {name: lock["packages"][f"node_modules/{name}"]["version"] for name in PACKAGES}


def _installed(node_modules: Path, name: str) -> str | None:
    try:
        return json.loads((node_modules / name / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def _cache_folder() -> Path:
    lock = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "seqexport" / f"web-{lock}"


def find_node_modules(given: str | Path | None = None, log=None) -> Path:
    """The node_modules folder holding the PACKAGES (onnxruntime-web, tokenizers.js, jinja): `given`
    (any versions), else one at the locked versions (the package's own after `npm ci`, or the
    cache), else `npm ci` into the cache. UsageError saying what to do when none can be had."""
    want = locked_versions()
    if given is not None:
        folder = Path(given)
        missing = [n for n in want if _installed(folder, n) is None]
        if missing:
            raise UsageError(f"--node-modules {given}: no {', '.join(missing)} in it; expected a node_modules folder "
                             f"(npm install {' '.join(f'{n}@{v}' for n, v in want.items())})")
        return folder
    cache = _cache_folder()
    for folder in (HERE / "node_modules", cache / "node_modules"):
        if all(_installed(folder, n) == v for n, v in want.items()):
            return folder
    npm = shutil.which("npm")
    if npm is None:
        raise UsageError(f"onnxruntime-web is not installed and npm is not found: install Node.js (npm), or run "
                         f"`npm ci` in {HERE}, or pass --node-modules DIR")
    if log:
        log(f"installing {', '.join(f'{n}@{v}' for n, v in want.items())} with npm ci into {cache}")
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(HERE / name, cache / name)
    done = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], cwd=cache,
                          capture_output=True, text=True)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(f"npm ci in {cache} failed: {detail[-1] if detail else done.returncode}; "
                         "pass --node-modules DIR to use an installed onnxruntime-web")
    return cache / "node_modules"


def export_files(folder: Path, manifest: dict) -> list[str]:
    """The files of an export the runtime reads: manifest, graphs (and their data), the shared
    weights, the tokenizer's files. (A preset export's checkpoint/ is for validation only.)"""
    files = [MANIFEST]
    for g in manifest["graphs"].values():
        files.append(g["file"])
        if "data_file" in g:
            files.append(g["data_file"])
    if manifest.get("weights"):
        files.append(manifest["weights"]["file"])
    files += tokenizer_files(manifest)
    return list(dict.fromkeys(files))


def describe_model(folder: Path, name: str, max_prompt_tokens: int, examples) -> tuple[dict, list[str]]:
    """site.json's record of one export, from its manifest and the Python runtime model (which
    frames prompts and knows the positional limit), and the files to copy. ArtifactError for a
    folder that is not an intact export."""
    from seqexport.runtime.models import load

    manifest = read_manifest(folder)  # every graph, weights and tokenizer file against its sha256
    model = load(folder, provider="cpu", verify=False, manifest=manifest)  # the graphs load in ORT
    limit = model.max_new_tokens_limit
    files = export_files(folder, manifest)
    # a positional table bounds the prompt too (a transformer's source, an LM's context)
    prompt_limit = min(max_prompt_tokens, limit) if limit else max_prompt_tokens
    record = {
        "name": name,
        "family": manifest["family"],
        "path": f"models/{name}/",
        "prompt_frame": model.prompt_frame,
        "max_prompt_tokens": prompt_limit,
        "max_new_tokens_limit": limit,
        "tokenizer": (manifest.get("tokenizer") or {}).get("type"),
        "bytes": sum((folder / f).stat().st_size for f in files),
        "examples": _checked_examples(model, name, examples, prompt_limit),
    }
    return record, files


def runtime_record(record: dict) -> dict:
    """The part of a model's site.json record that its page's runtime needs beside the manifest
    (written as models/<name>/runtime.json: `loadModel(folder)` with no options knows its limits)."""
    return {k: record[k] for k in ("name", "prompt_frame", "max_prompt_tokens", "max_new_tokens_limit")}


def _checked_examples(model, name: str, examples, max_prompt_tokens: int) -> list[str]:
    """The --example prompts, each one the page will take: not empty, and (where the model has
    a tokenizer) no longer than its prompt limit; UsageError naming the first that is not."""
    for i, text in enumerate(examples, 1):
        if not text.strip():
            raise UsageError(f"--example #{i} is empty; expected a prompt the page offers")
        if model.tokenizer is not None and (n := len(model.encode(text))) > max_prompt_tokens:
            raise UsageError(f"--example #{i} {text!r} is {n} tokens for {name}; its page takes at most "
                             f"{max_prompt_tokens} (--max-prompt-tokens)")
    return list(examples)


def _check_out(out: Path, folders: list[Path], overwrite: bool) -> bool:
    """Whether `out` is to be replaced; UsageError for an out that must not be written."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    resolved = out.resolve()
    for f in folders:
        if resolved == f.resolve() or resolved in f.resolve().parents:
            raise UsageError(f"--out {out}: holds the export {f}; writing the site there would replace it")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise UsageError(f"--out {out}: exists and is not empty; pass --overwrite to replace it")
        if not (out / "site.json").is_file():
            raise UsageError(f"--out {out}: is not a site built by `seqexport web` (no site.json); "
                             "refusing to replace it, even with --overwrite")
    return out.exists()


def _names(folders: list[Path]) -> list[str]:
    names, seen = [], {}
    for f in folders:
        base = Path(os.path.abspath(f)).name  # the name given (a link keeps its own)
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return names


def build_site(folders, out, overwrite: bool = False, webgpu: bool = True, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
               examples=(), node_modules=None, log=None) -> dict:
    """Write the site for these exported folders into `out` (atomically: a temporary folder
    renamed into place). Returns site.json's content with the sizes of what was written."""
    folders = [Path(f) for f in folders]
    if not folders:
        raise UsageError("give at least one exported folder")
    out = Path(out)
    replace = _check_out(out, folders, overwrite)
    records, copies = [], []
    for folder, name in zip(folders, _names(folders)):
        try:
            record, files = describe_model(folder, name, max_prompt_tokens, examples)
        except ArtifactError as e:
            raise ArtifactError(f"{folder}: not an export the site can serve: {e}") from None
        records.append(record)
        copies += [(folder / f, Path("models") / name / f) for f in files]
    modules = find_node_modules(node_modules, log)
    versions = {n: _installed(modules, n) for n in PACKAGES}
    backends = ["wasm", "webgpu"] if webgpu else ["wasm"]
    dist = modules / ORT / "dist"
    copies += [(dist / f, Path("ort") / f) for b in backends for f in ORT_FILES[b]]
    # (onnxruntime-web's licence header is in its bundles; the npm package has no LICENSE file)
    copies += [(modules / HF_TOKENIZERS / "dist/tokenizers.min.mjs", Path("vendor/tokenizers.min.mjs")),
               (modules / HF_TOKENIZERS / "LICENSE", Path("vendor/LICENSE-tokenizers")),
               (modules / HF_JINJA / "dist/index.js", Path("vendor/jinja.mjs")),
               (modules / HF_JINJA / "LICENSE", Path("vendor/LICENSE-jinja"))]
    copies += [(STATIC / f, Path(f)) for f in PAGE_FILES]
    for src, _ in copies:
        if not src.is_file():
            raise UsageError(f"{src} is missing; reinstall the npm packages (npm ci in {HERE}) or the seqexport package")
    from seqexport import __version__

    site = {
        "seqexport": __version__,
        "onnxruntime_web": versions[ORT],
        "tokenizers_js": versions[HF_TOKENIZERS],
        "jinja_js": versions[HF_JINJA],
        "built": dt.date.today().isoformat(),
        "backends": backends,
        "models": records,
    }
    with atomic_folder(out, overwrite=replace) as tmp:
        for src, rel in copies:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / rel)
        (tmp / "site.json").write_text(json.dumps(site, indent=2) + "\n")
        for record in records:  # what a model loaded from its folder alone reads (seqexport.mjs)
            (tmp / record["path"] / RUNTIME_JSON).write_text(json.dumps(runtime_record(record), indent=2) + "\n")
    ort_bytes = sum((out / "ort" / f).stat().st_size for b in backends for f in ORT_FILES[b])
    return site | {"bytes": {"models": sum(r["bytes"] for r in records), "runtime_wasm": _size(out, "wasm"),
                             "runtime_all": ort_bytes, "total": _tree_size(out)}}


def _size(out: Path, backend: str) -> int:
    return sum((out / "ort" / f).stat().st_size for f in ORT_FILES[backend])


def _tree_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def summary(result: dict, out) -> str:
    """What `seqexport web` prints: the site, its sizes, how to serve it."""
    mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
    b = result["bytes"]
    models = ", ".join(f"{r['name']} ({r['family']}, {mb(r['bytes'])})" for r in result["models"])
    return (f"site in {out}: {models}; onnxruntime-web {result['onnxruntime_web']} "
            f"(WASM {mb(b['runtime_wasm'])}" + (f", with WebGPU {mb(b['runtime_all'])}" if "webgpu" in result["backends"]
                                               else "") + f"); {mb(b['total'])} in all\n"
            f"serve it: python -m http.server -d {out}   (then open http://127.0.0.1:8000/)")
