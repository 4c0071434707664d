"""The tree keeps its shape: no import cycle, no family-name branch outside the families,
a torch-free runtime, and a regular install that works beside a user's own `models/`."""

import ast
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "seqexport"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the seqexport modules it imports (anywhere in the file, lazy imports included)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import mod` imports the module pkg.mod when there is one
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            for t in (t for t in targets if t in modules):
                # importing a.b.c first runs a/__init__ and a/b/__init__: packages the importer
                # is not itself inside are imported too
                own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
                parents = {".".join(t.split(".")[:i]) for i in range(1, t.count(".") + 1)}
                graph[name] |= ({t} | parents - own) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_inside_seqexport():
    graph = import_graph()
    assert len(graph) > 40  # the walk found the package
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_family_name_branches_outside_the_families():
    pattern = re.compile(r"family\w*\s*(==|!=|\bin\b)\s*[\(\[\{]?\s*['\"](transformer|mamba|rwkv)")
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in PACKAGE.rglob("*.py") if "families" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)


def test_runtime_and_family_declarations_import_no_torch():
    """The runtime, the registry and every family's torch-free parts load where torch cannot."""
    code = textwrap.dedent("""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is not installed here")
        sys.meta_path.insert(0, NoTorch())
        import seqexport.runtime
        from seqexport import families
        for f in families.REGISTRY.values():
            f.specs; f.runtime
        print("ok", sorted(families.REGISTRY))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


README_EXAMPLE = """
from seqexport.checkpoints import build_preset
from seqexport.export import export_model
from seqexport.parity.validate import validate
import numpy as np
import seqexport.runtime as rt

ckpt = build_preset("transformer", "tiny")
export_model(ckpt, "tiny", "exported/my-model")
report = validate("exported/my-model", steps=4)
assert report.passed, "\\n".join(report.failures())
model = rt.load("exported/my-model")
print(rt.generate(model, [[5, 6, 7], [8, 9]], rt.SearchOptions(max_new_tokens=3, num_beams=2)))
import models  # the user's own package, untouched by ours
print(models.MINE, build_preset("mamba", "tiny").family)
"""


def test_regular_install_works_beside_a_users_models_package(tmp_path):
    """`pip install .` (not editable) into a fresh venv, then the README's example from a folder
    that has its own models/ package: nothing of ours is installed as a top-level `models`."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in (f for f in files if (ROOT / f).is_file()):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_bytes((ROOT / f).read_bytes())
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("seqexport-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # Dependencies come from the test environment (no network); a .pth only appends the folder,
    # so the editable install registered there stays invisible.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    assert not (site / "models").exists() and (site / "seqexport" / "models" / "pretrained").is_dir()
    user = tmp_path / "user"
    (user / "models").mkdir(parents=True)
    (user / "models" / "__init__.py").write_text("MINE = 'the user models package'\n")
    (user / "models" / "mamba.py").write_text("raise ImportError('not the seqexport one')\n")
    proc = subprocess.run([python, "-c", README_EXAMPLE], cwd=user, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the user models package mamba" in proc.stdout
    origin = subprocess.run([python, "-c", "import seqexport; print(seqexport.__file__)"], cwd=user,
                            capture_output=True, text=True, check=True).stdout
    assert origin.startswith(str(site)), origin
