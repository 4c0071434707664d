"""The README's and docs/*.md's examples run as written.

Every ```python block runs as a script, and every command line of a ```bash / ```sh /
```console block that starts with `seqexport` runs through bash. They run in one temporary
working folder per test session, laid out as the repository's root after `make demo`: the
bundled transformer and Mamba models exported as `seqexport demo` names them
(exported/transformer-dates, exported/mamba-dates) and a `models` link to the bundled checkpoints. Each test runs one
page, its blocks in order; a page may use what its own earlier blocks wrote, never another
page's (so `--out` folders are unique across pages).

What the Markdown itself can say:
- `<!-- not-run: reason -->` on the line before a block's opening fence: the block is not run
  (a server, a cluster, a long benchmark). `test_not_run_blocks_are_few_and_say_why` counts
  and lists them; keep them rare.
- a trailing `# exit N` on a command line: the exit code the docs say it returns (default 0).
- in a ```console block, `$ ` marks a command and the lines after it are its output: each must
  appear in what it printed (`...` skips).
Lines that do not start with `seqexport` (make, pip, curl, `python scripts/...`) are not run.
docs/adding-a-family.md quotes excerpts of a family's source files: its blocks are compiled,
not run.
"""

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT_PAGES = {"docs/adding-a-family.md": "excerpts of a family's source files, compiled only"}
MAX_NOT_RUN = 8  # not-run blocks across all pages; raise it only with a reason the reader accepts
README_MAX_LINES = 300
TIMEOUT_S = 300  # one block or command

SHELL_LANGS = {"bash", "sh", "shell", "console"}
PYTHON_LANGS = {"python", "py"}
NOT_RUN = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*seqexport(?:\s|$)")  # env assignments may lead
EXIT = re.compile(r"#\s*exit\s+(\d+)\b")
# The bundled models as `make demo` leaves them, made with the CLI's own code in one process.
SETUP = """
from pathlib import Path
from seqexport.cli import cli
for family in ("transformer", "mamba"):
    cli.main(["export", family, "--out", f"exported/{family}-dates"], standalone_mode=False)
    assert Path(f"exported/{family}-dates/manifest.json").is_file(), family
"""


@dataclass
class Block:
    page: str  # path relative to the repository root
    line: int  # line of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the marker's reason, "" for a marker without one


@dataclass
class Command:
    line: int
    text: str
    exit_code: int
    output: list[str]  # console blocks: lines that must appear in what it printed


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def parse_blocks(text: str, page: str) -> list[Block]:
    """Fenced blocks (indented ones too, e.g. inside a list item) with their not-run marker."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.startswith("```"):
            i += 1
            continue
        indent, lang, start = len(lines[i]) - len(stripped), stripped[3:].strip().lower(), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if not lines[i][:indent].strip() else lines[i].lstrip())
            i += 1
        prev = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(prev)
        blocks.append(Block(page, start + 1, lang, "\n".join(body) + "\n",
                            marker.group(1).strip() if marker else None))
        i += 1
    return blocks


def page_blocks(path: Path) -> list[Block]:
    return parse_blocks(path.read_text(), rel(path))


def commands(block: Block) -> list[Command]:
    """The `seqexport` command lines of a shell block (continuations joined)."""
    out: list[Command] = []
    lines = block.code.splitlines()
    i = 0
    while i < len(lines):
        line_no, text = block.line + 1 + i, lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        i += 1
        if block.lang == "console":
            if not text.startswith("$ "):
                if out and text.strip():
                    out[-1].output.append(text.strip())
                continue
            text = text[2:]
        if COMMAND.match(text.strip()):
            want = EXIT.search(text)
            out.append(Command(line_no, text.strip(), int(want.group(1)) if want else 0, []))
    return out


def run_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's seqexport
    return env


def run_block(block: Block, cwd: Path) -> list[str]:
    """Run one block in `cwd`; a line per failure ("page:line: what went wrong")."""
    where = f"{block.page}:{block.line}"
    if block.lang in PYTHON_LANGS:
        if block.page in FRAGMENT_PAGES:
            try:
                compile(block.code, where, "exec")
            except SyntaxError as e:
                return [f"{where}: does not compile: {e}"]
            return []
        script = cwd / f"_block_{re.sub(r'[^A-Za-z0-9]+', '_', block.page)}_{block.line}.py"
        script.write_text(block.code)
        proc = subprocess.run([sys.executable, script.name], cwd=cwd, env=run_env(), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        if proc.returncode != 0:
            return [f"{where}: python block exited {proc.returncode}\n{proc.stderr[-3000:]}"]
        return []
    failures = []
    for cmd in commands(block) if block.lang in SHELL_LANGS else []:
        proc = subprocess.run(["bash", "-c", cmd.text], cwd=cwd, env=run_env(), capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        said = f"{block.page}:{cmd.line}: `{cmd.text}`"
        if proc.returncode != cmd.exit_code:
            failures.append(f"{said} exited {proc.returncode}, the docs say {cmd.exit_code}\n"
                            f"{(proc.stderr or proc.stdout)[-3000:]}")
            continue
        printed = {ln.strip() for ln in (proc.stdout + proc.stderr).splitlines()}
        missing = [ln for ln in cmd.output if ln != "..." and ln not in printed]
        if missing:
            failures.append(f"{said} did not print {missing}; it printed:\n{proc.stdout[-2000:]}")
    return failures


@pytest.fixture(scope="session")
def docs_cwd(tmp_path_factory):
    """A working folder like the repository root after `make demo` (see the module docstring)."""
    cwd = tmp_path_factory.mktemp("docs")
    (cwd / "models").symlink_to(ROOT / "models", target_is_directory=True)
    proc = subprocess.run([sys.executable, "-c", SETUP], cwd=cwd, env=run_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_page_examples_run(page, docs_cwd):
    failures = []
    for block in page_blocks(page):
        if block.not_run is None:
            failures += run_block(block, docs_cwd)
    assert not failures, "\n\n".join(failures)


def test_not_run_blocks_are_few_and_say_why():
    blocks = [b for page in PAGES for b in page_blocks(page)]
    runnable = [b for b in blocks if b.lang in PYTHON_LANGS or (b.lang in SHELL_LANGS and commands(b))]
    skipped = [b for b in runnable if b.not_run is not None]
    fragments = [b for b in runnable if b.page in FRAGMENT_PAGES and b.not_run is None]
    listing = "\n".join(f"  {b.page}:{b.line}: {b.not_run or '(no reason given)'}" for b in skipped)
    print(f"{len(runnable) - len(skipped) - len(fragments)} blocks run, {len(fragments)} compiled only "
          f"({', '.join(FRAGMENT_PAGES)}), {len(skipped)} not run:\n{listing}")
    assert all(b.not_run for b in skipped), f"a not-run marker without a reason:\n{listing}"
    assert len(skipped) <= MAX_NOT_RUN, f"{len(skipped)} blocks are not run (at most {MAX_NOT_RUN}):\n{listing}"
    markers = [b for b in blocks if b.not_run is not None and b not in runnable]
    assert not markers, f"not-run markers on blocks that would not run anyway: {[(b.page, b.line) for b in markers]}"


def test_runner_fails_on_a_broken_block(tmp_path):
    """The runner itself: a typo, a wrong exit code and missing output fail; markers are obeyed."""
    text = "\n".join([
        "```python", "prnt('typo')", "```",
        "```bash", "seqexport inspect exported/no-such-folder", "```",
        "```bash", "seqexport inspect exported/no-such-folder   # exit 2", "```",
        "<!-- not-run: a server -->", "```bash", "seqexport serve exported/no-such-folder", "```",
        "```console", "$ seqexport --version", "not what it prints", "```",
        "```text", "seqexport nonsense", "```",
    ])
    blocks = parse_blocks(text, "synthetic.md")
    results = [run_block(b, tmp_path) if b.not_run is None else [] for b in blocks]
    assert [bool(r) for r in results] == [True, True, False, False, True, False], results
    assert "NameError" in results[0][0] and "exited 2, the docs say 0" in results[1][0]
    assert blocks[3].not_run == "a server"


def _cli_options():
    """Command path -> the options it takes, from the click group itself."""
    import click

    from seqexport.cli import cli

    table = {}

    def walk(cmd, path):
        table[path] = {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
        table[path] |= {"--help"}
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))

    walk(cli, ())
    return table


def _written_commands(page: Path):
    """(where, tokens) of every `seqexport ...` the page writes: in inline code and in shell and text blocks."""
    text = page.read_text()
    prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    found = [(rel(page), span) for span in re.findall(r"`([^`\n]+)`", prose)]
    for b in page_blocks(page):
        if b.lang in SHELL_LANGS | {"text", ""}:
            found += [(f"{b.page}:{b.line}", ln) for ln in b.code.replace("\\\n", " ").splitlines()]
    for where, snippet in found:
        for m in re.finditer(r"(?:^|[\s($])seqexport\s+(.*)", snippet):
            rest = re.split(r"\s(?:&&|\|\||;|#)\s|\bseqexport\s", " " + m.group(1) + " ")[0]
            yield where, [t.strip("[](){}|,'\"") for t in rest.split()]


def test_every_command_and_option_written_exists():
    """Every `seqexport COMMAND --option` the README and docs write, in code or in a synopsis, exists."""
    table = _cli_options()
    wrong = []
    for page in PAGES:
        for where, tokens in _written_commands(page):
            path, i = (), 0
            while i < len(tokens) and tokens[i] in table[()]:  # group options: --debug, --version
                i += 1
            while i < len(tokens) and (*path, tokens[i]) in table:
                path, i = (*path, tokens[i]), i + 1
            if not path:
                if i < len(tokens) and re.fullmatch(r"[a-z][a-z0-9-]*", tokens[i]):
                    wrong.append(f"{where}: no command `seqexport {tokens[i]}`")
                continue  # a placeholder (COMMAND) or the bare group
            for t in tokens[i:]:
                flag = re.match(r"^(--?[a-z][a-z0-9-]*)", t)
                if flag and flag.group(1) not in table[path]:
                    wrong.append(f"{where}: `seqexport {' '.join(path)}` has no option {flag.group(1)}")
    assert not wrong, "\n".join(wrong)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_and_paths_resolve():
    """Relative links (and their #anchors) point at files and headings that exist; so do the
    repository paths the pages name (scripts/…, tests/…, seqexport/…)."""
    wrong = []
    for page in PAGES:
        text = page.read_text()
        prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                wrong.append(f"{rel(page)}: link to missing {target}")
            elif anchor and dest.suffix == ".md":
                body = re.sub(r"^\s*```.*?^\s*```", "", dest.read_text(), flags=re.S | re.M)
                if anchor not in {_slug(h) for h in re.findall(r"^#+\s+(.*)$", body, re.M)}:
                    wrong.append(f"{rel(page)}: no heading #{anchor} in {rel(dest)}")
        for path in re.findall(r"(?<![\w/.-])((?:scripts|tests|models|seqexport|docs)/[\w./-]*\w)(?![\w*<{])", text):
            if not (ROOT / path).exists():
                wrong.append(f"{rel(page)}: names {path}, which does not exist")
    assert not wrong, "\n".join(wrong)


def test_out_folders_are_not_shared_between_pages():
    """Pages run independently (each test one page), so no two write the same --out."""
    seen: dict[str, str] = {}
    clashes = []
    for page in PAGES:
        for b in page_blocks(page):
            for cmd in commands(b) if b.lang in SHELL_LANGS and b.not_run is None else []:
                for out in re.findall(r"--out\s+(\S+)", cmd.text):
                    if seen.setdefault(out, b.page) != b.page:
                        clashes.append(f"{b.page}:{cmd.line} writes {out}, as {seen[out]} does")
    assert not clashes, "\n".join(clashes)


def test_readme_is_short_and_its_python_example_matches_the_install_test():
    """The README stays a first ten minutes, and its Python example does what
    tests/test_architecture.py's README_EXAMPLE runs from a regular install (the same imports,
    preset, folder and runtime calls)."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    tree = ast.parse((ROOT / "tests" / "test_architecture.py").read_text())
    example = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", None) == "README_EXAMPLE" for t in n.targets))
    (ours,) = [b.code for b in page_blocks(README) if b.lang in PYTHON_LANGS]
    for node in ast.walk(ast.parse(example)):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("seqexport"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                assert name in text or f"from {node.module} import {alias.name}" in ours, name
    for call in set(re.findall(r"\brt\.\w+\(", example)) | set(re.findall(r'"exported/[\w-]+"', example)):
        assert call in ours, call
    assert re.search(r'build_preset\("transformer", "tiny"\)', ours)
