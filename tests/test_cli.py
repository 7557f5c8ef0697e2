"""Every entry point goes through `bertjax.cli.run` and takes `-v/--verbose`; the quiet filter hides
the libraries' INFO lines only."""

from __future__ import annotations

import argparse
import importlib
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from bertjax import cli

ROOT = Path(__file__).resolve().parents[1]
# A worker process started by analysis.common.figures.FigurePool, not a command a user runs.
INTERNAL = {"analysis.figure_worker"}


def entry_points() -> list[str]:
    found = []
    for package in ("analysis", "bertjax", "benchmarks", "train"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8") and name not in INTERNAL:
                found.append(name)
    return found


def test_the_entry_points_are_found():
    assert {"analysis.roles", "analysis.track", "train.pretrain", "bertjax.__main__", "benchmarks.scale"} <= set(
        entry_points()
    )


@pytest.mark.parametrize("name", entry_points())
def test_every_entry_point_runs_through_cli_and_takes_verbose(name, capsys):
    module = importlib.import_module(name)
    assert "cli.run(main)" in Path(module.__file__).read_text(encoding="utf-8").split('if __name__ == "__main__":')[1]
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert "-v, --verbose" in capsys.readouterr().out


# What a command's `--help` must not wait for: the libraries that take seconds to import, and the
# analyses other than the command's own (BENCHMARKS.md row 11 times it).
NOT_FOR_HELP = ("jax", "flax", "optax", "orbax", "matplotlib", "pandas", "scipy", "spacy", "transformers", "torch",
                "analysis.api", "analysis.ablation.kovaleva", "analysis.ablation.michel")  # fmt: skip


@pytest.mark.parametrize("name", [n for n in entry_points() if not n.startswith("benchmarks.")])
def test_help_imports_no_heavy_library(name):
    # A fresh interpreter: this one has imported everything already.
    code = f"""
import runpy, sys
sys.argv = [{name!r}, "--help"]
try:
    runpy.run_module({name!r}, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.startswith({NOT_FOR_HELP!r})))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "-v, --verbose" in done.stdout
    assert done.stdout.splitlines()[-1] == "[]", f"python -m {name} --help imports {done.stdout.splitlines()[-1]}"


COMMANDS = [n for n in entry_points() if not n.startswith("benchmarks.")]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_has_help_and_help_shows_every_default(name):
    parser = importlib.import_module(name).build_parser()
    assert parser.formatter_class is cli.HelpFormatter
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = "/".join(action.option_strings) or action.dest
        assert action.help, f"python -m {name}: {flag} has no help text"
        shown = formatter._expand_help(action)
        if action.nargs == 0 or not action.option_strings or action.required:
            continue
        if action.default is not None:  # a None default's meaning, where it has one, is said in words
            assert f"default: {action.default}" in shown or f"default {action.default}" in shown, (
                f"python -m {name}: {flag}: --help does not show its default {action.default!r}: {shown!r}"
            )


def _shown(name: str, level: int, message: str = "a line") -> bool:
    return cli.Quiet().filter(logging.LogRecord(name, level, __file__, 1, message, None, None))


def test_quiet_shows_own_info_and_every_warning_but_hides_library_info():
    assert _shown("__main__", logging.INFO)
    assert _shown("train.trainer", logging.INFO)
    assert _shown("analysis", logging.INFO)
    assert not _shown("absl", logging.INFO)
    assert not _shown("jax._src.xla_bridge", logging.INFO)
    assert not _shown("trainer", logging.INFO)  # a prefix of no package of ours
    assert _shown("absl", logging.WARNING)
    assert _shown("jax._src.xla_bridge", logging.ERROR)
    assert not _shown("absl", logging.WARNING, "Given directory is read only=/a/run/checkpoints")


def test_verbose_removes_the_filter_and_quiet_puts_it_back_once(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "")  # set_verbose sets it; restored for later tests
    handler = logging.StreamHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        cli.set_verbose(False)
        cli.set_verbose(False)
        assert sum(isinstance(f, cli.Quiet) for f in handler.filters) == 1
        cli.set_verbose(True)
        assert not handler.filters
    finally:
        root.removeHandler(handler)


@pytest.mark.parametrize(
    ("name", "new", "old", "argv"),
    [
        ("train.finetune", "--ckpt", "--init", ["--task", "mrpc", "--workdir", "W"]),
        ("analysis.clark", "--task", "--inputs", ["--ckpt", "C"]),
    ],
)
def test_an_old_spelling_still_works_and_says_so_once(name, new, old, argv, capsys):
    parser = importlib.import_module(name).build_parser()
    assert parser.parse_args([*argv, new, "mrpc"]) == parser.parse_args([*argv, old, "mrpc"])
    assert capsys.readouterr().err == f"warning: {old} is deprecated, use {new}\n"


def test_bertjax_needs_its_checkpoint_once(capsys):
    from bertjax import __main__ as command

    with pytest.raises(SystemExit):
        command.main(["--ckpt", "A", "B"])
    assert "give the checkpoint once" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        command.main([])
    assert "required: --ckpt" in capsys.readouterr().err


def test_show_called_without_a_checkpoint_says_so():
    """`show` through the API, with no checkpoint (the CLI refuses that first): one line, not a
    TypeError from deep in the loader."""
    from bertjax.errors import UserError
    from bertjax.show import ShowConfig, show

    with pytest.raises(UserError, match="no checkpoint to show"):
        show(ShowConfig())


def markdown_table(text: str, heading: str) -> list[list[str]]:
    """The rows (header first) of the first table under `heading`, cells stripped."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [rows[0], *rows[2:]]  # without the --- row


def test_the_flag_table_is_every_parser():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    types = {row[0].strip("`"): row[1] for row in markdown_table(text, "## The shared flags")[1:]}
    header, *rows = markdown_table(text, "## Each command's defaults")
    commands = [c.strip("`") for c in header[1:]]
    assert {row[0].strip("`") for row in rows} == set(types)
    parsers = {name: importlib.import_module(name if name != "bertjax" else "bertjax.__main__").build_parser()
               for name in commands}  # fmt: skip
    for row in rows:
        flag = row[0].strip("`")
        for name, cell in zip(commands, row[1:], strict=True):
            where = f"docs/cli.md: python -m {name} {flag} ({cell!r})"
            action = parsers[name]._option_string_actions.get(flag)
            if cell.startswith("—"):
                assert action is None, f"{where}: the command takes it"
                continue
            assert action is not None, f"{where}: the command does not take it"
            kind = "flag" if action.nargs == 0 else getattr(action.type, "__name__", "str")
            kind = {"comma_list": "list"}.get(kind, kind)  # a list setting's flag: its comma-separated text
            # `list or str`: a list where the command takes several (--task), one where it takes one.
            assert kind in types[flag].split(" or "), f"{where}: its type is {kind}, the table says {types[flag]}"
            if cell == "required":
                assert action.required, f"{where}: not required"
            elif cell.startswith("`") and cell.endswith("`"):
                assert not action.required and str(action.default) == cell.strip("`"), f"{where}: {action.default!r}"
            else:  # in words: what leaving it out means
                assert not action.required and action.default is None, f"{where}: default {action.default!r}"
