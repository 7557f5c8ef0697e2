"""Adding an analysis is one module and one table row (docs/layout.md): a toy analysis in a package
of its own, registered from outside, runs through the command-line runner and the Python call,
and its `--out` is written as every tool's is (whole, with run.json and the output marker)."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import textwrap

import pytest

from analysis import api, tools
from bertjax import runinfo
from bertjax.errors import UserError

TOY = '''
"""A toy analysis: the length of each word given."""

import dataclasses
from pathlib import Path

from analysis.common.figures import save_figure
from analysis.common.flags import figure_format_setting
from analysis.tools import Tool, register
from bertjax.settings import setting


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    words: tuple[str, ...] = setting(help="the words (a flag's text: comma-separated)")
    scale: int = setting(1, help="what each length is multiplied by")
    out: str = setting("toy_out", help="output directory")
    overwrite: bool = setting(False, help="replace an earlier toy output")
    figure_format: tuple[str, ...] = figure_format_setting()


def draw(lengths, directory):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.bar(range(len(lengths)), list(lengths.values()))
    return save_figure(fig, Path(directory), "lengths")


class Toy:
    output_kind = "toy output"

    def prepare(self, config):
        return config.words  # parsed once, where the flag or the keyword came in

    def compute(self, config, words):
        return {w: len(w) * config.scale for w in words}

    def write(self, lengths, directory):
        (directory / "lengths.csv").write_text("".join(f"{w},{n}\\n" for w, n in lengths.items()))
        return {"results": {"words": len(lengths)}}

    def text(self, lengths):
        return f"{len(lengths)} words, longest {max(lengths.values())}"

    def figures(self, lengths, directory):
        return [(draw, (lengths, directory))]


ANALYSIS = Toy()
register(Tool("toy", "toy_analysis_package.toy:ToyConfig", analysis="toy_analysis_package.toy:ANALYSIS", positional=("words",)))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    package = tmp_path / "packages" / "toy_analysis_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path / "packages"))
    monkeypatch.setattr(tools, "TOOLS", dict(tools.TOOLS))  # the table as it was after the test
    importlib.import_module("toy_analysis_package.toy")
    yield
    tools.api_function.cache_clear()
    for name in [m for m in sys.modules if m.startswith("toy_analysis_package")]:
        del sys.modules[name]


def test_a_toy_analysis_runs_through_the_command_line(toy, tmp_path, capsys):
    out = tmp_path / "out"
    tools.main("toy", ["--words", "a,bcd,ef", "--scale", "2", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["3 words, longest 6", f"wrote {out.resolve()}"]
    assert (out / "lengths.csv").read_text() == "a,2\nbcd,6\nef,4\n"
    assert (out / runinfo.OUTPUT_MARKER).read_text() == "toy output\n"
    info = json.loads((out / "run.json").read_text())
    assert info["results"] == {"words": 3}
    assert info["config"]["scale"] == 2 and info["config"]["words"] == ["a", "bcd", "ef"]
    assert info["figures"] == ["lengths.png"]
    assert (out / "lengths.png").is_file()
    assert {"prepare", "compute", "write", "figures", "total"} <= set(info["timings_s"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "packages"]  # no temporary sibling left


def test_the_toy_command_refuses_a_full_out_and_takes_its_flags(toy, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError):
        tools.main("toy", ["--words", "a", "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    with pytest.raises(SystemExit):
        tools.main("toy", ["--help"])
    shown = capsys.readouterr().out
    assert "--words WORDS" in shown and "the length of each word given" in shown.lower()


def test_the_toy_analysis_is_a_python_call(toy, tmp_path):
    assert api.toy("a,bcd", scale=3) == {"a": 3, "bcd": 9}  # held in memory: nothing written
    assert api.toy(["a", "bcd"], scale=3) == {"a": 3, "bcd": 9}  # a list as the flag's text
    assert not (tmp_path / "toy_out").exists()
    with pytest.raises(TypeError):
        api.toy("a", colour="red")
    # ToyConfig checks nothing itself: the settings mechanism refuses a value of another type.
    with pytest.raises(UserError, match="scale: expected an integer, got 'x'"):
        api.toy("a", scale="x")
    out = tmp_path / "saved"
    assert api.toy(words="xy", out=out) == {"xy": 2}
    assert (out / "lengths.csv").read_text() == "xy,2\n"
    assert (out / runinfo.OUTPUT_MARKER).read_text() == "toy output\n"
    assert json.loads((out / "run.json").read_text())["results"] == {"words": 1}
    assert "toy" in dir(api)
    assert list(inspect.signature(api.toy).parameters)[:3] == ["words", "out", "scale"]
