"""The figure pipeline: `--figures` and `--figure-format` write only what they ask for and change
nothing in what is drawn; figure workers die with the process that started them."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from test_plots import ALPHA, TAU, synthetic  # noqa: F401 — `synthetic` is a fixture

from analysis import ablate, clark, finetune_effect, prune, track
from analysis import roles as roles_cli
from analysis.common import figures as common_figures
from analysis.common import flags
from analysis.heads import figures as heads_figures
from bertjax.errors import UserError
from bertjax.settings import comma_list

ROOT = Path(__file__).resolve().parents[1]


def _names(paths) -> set[str]:
    return {Path(p).name for p in paths}


def test_only_the_asked_kinds_and_formats_are_written(synthetic, tmp_path):  # noqa: F811
    roles, scores = synthetic
    kinds = flags.select_figures(("p_heatmaps", "role_grid"), heads_figures.ROLES_FIGURES)
    with common_figures.figure_formats(flags.select_formats(("svg", "pdf"))):
        paths = heads_figures.plot_all(roles, scores, tmp_path, TAU, ALPHA, kinds=kinds)
    expected = {f"{t}_{k}.{f}" for t in ("mrpc", "sst2") for k in ("p_heatmaps", "role_grid") for f in ("svg", "pdf")}
    assert _names(paths) == expected == {p.name for p in tmp_path.iterdir()}
    assert heads_figures.plot_all(roles, scores, tmp_path / "none", TAU, ALPHA, kinds=()) == []


def test_the_default_is_every_kind_as_png(synthetic, tmp_path):  # noqa: F811
    roles, scores = synthetic
    paths = heads_figures.plot_all(roles, scores, tmp_path, TAU, ALPHA)
    assert _names(paths) == {f"{t}_{k}.png" for t in ("mrpc", "sst2") for k in heads_figures.ROLES_FIGURES}


def test_a_figure_drawn_alone_or_in_another_format_set_is_the_same_picture(synthetic, tmp_path):  # noqa: F811
    """Same data drawn: a kind asked alone, in one worker or two, with or without vector files
    beside it, gives the PNG of the full default run byte for byte (PNG pixels are deterministic;
    SVGs carry random clip-path ids)."""
    roles, scores = synthetic
    every = heads_figures.plot_all(roles, scores, tmp_path / "all", TAU, ALPHA, workers=2)
    for kind in heads_figures.ROLES_FIGURES:
        with common_figures.figure_formats(("png", "svg")):
            alone = heads_figures.plot_all(roles, scores, tmp_path / kind, TAU, ALPHA, kinds=(kind,), workers=0)
        for path in alone:
            if path.suffix == ".png":
                assert path.read_bytes() == (tmp_path / "all" / path.name).read_bytes(), path.name
    assert len(every) == 2 * len(heads_figures.ROLES_FIGURES)


@pytest.mark.parametrize("spec", ["heatmaps", "role_grid,bogus", "", ","])
def test_an_unknown_kind_is_one_line(spec):
    with pytest.raises(UserError, match=r"^--figures: ") as e:
        flags.select_figures(comma_list(spec), heads_figures.ROLES_FIGURES)  # the flag's text, as parsed
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "main,argv",
    [
        (roles_cli.main, ["--ckpt", "unused"]),
        (track.main, ["--run", "unused"]),
        (finetune_effect.main, ["--pre", "unused", "--post", "unused:mrpc"]),
    ],
)
@pytest.mark.parametrize("flag,spec", [("--figures", "role_grid,bogus"), ("--figure-format", "jpeg")])
def test_every_cli_refuses_an_unknown_kind_or_format_in_one_line_before_anything(
    main, argv, flag, spec, cli_error, tmp_path
):
    line = cli_error(main, [*argv, "--out", str(tmp_path / "out"), flag, spec])
    assert line.startswith(f"error: {flag}: unknown value")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("main", [ablate.main, prune.main, clark.main])
def test_the_other_figure_clis_refuse_an_unknown_format_in_one_line_before_anything(main, cli_error, tmp_path):
    line = cli_error(main, ["--ckpt", "unused", "--out", str(tmp_path / "out"), "--figure-format", "png,jpeg"])
    # "give or a comma-separated list" before: the formats have no word such as `all`.
    assert line == "error: --figure-format: unknown value 'jpeg'; give a comma-separated list of png, svg, pdf"
    assert not list(tmp_path.iterdir())


def test_every_figure_cli_spells_the_flags_the_same(capsys):
    for parse in (roles_cli.parse_args, track.parse_args, finetune_effect.parse_args):
        with pytest.raises(SystemExit):
            parse(["--help"])
        usage = capsys.readouterr().out
        assert "--figures FIGURES" in usage and "--figure-format FIGURE_FORMAT" in usage and "--no-figures" in usage


def test_the_flags_reach_the_config():
    config = roles_cli.parse_args(["--ckpt", "x", "--figures", "role_grid", "--figure-format", "png,svg"])
    assert (config.figures, config.figure_format) == (("role_grid",), ("png", "svg"))
    assert roles_cli.parse_args(["--ckpt", "x", "--no-figures"]).figures == ("none",)
    # By default the figure a user looks at first; every paper figure on request.
    assert roles_cli.parse_args(["--ckpt", "x"]).figures == ("role_grid",)
    assert roles_cli.parse_args(["--ckpt", "x", "--figures", "all"]).figures == ("all",)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_figure_workers_die_with_a_killed_parent_and_leave_no_temporaries(synthetic, tmp_path):  # noqa: F811
    """Issue 24, defect 9: SIGKILL of the process drawing figures used to orphan its workers,
    which kept drawing into the output and left `bertjax-figures-*` in the system temp dir."""
    roles, scores = synthetic
    # Many tasks: the workers are still drawing when the parent is killed.
    many = pd.concat([roles[roles["task"] == t].assign(task=f"{t}{i}") for i in range(20) for t in ("mrpc", "sst2")])
    many_scores = {(f"{t}{i}", r): v for i in range(20) for (t, r), v in scores.items()}
    inputs = tmp_path / "inputs.pkl"
    inputs.write_bytes(pickle.dumps((many, many_scores)))
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    script = (
        "import pickle, sys; from pathlib import Path; from analysis.heads import figures as heads_figures\n"
        "roles, scores = pickle.loads(Path(sys.argv[1]).read_bytes())\n"
        f"heads_figures.plot_all(roles, scores, Path(sys.argv[2]), {TAU}, {ALPHA}, workers=2)\n"
    )
    env = {**os.environ, "TMPDIR": str(system_tmp), "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", script, str(inputs), str(tmp_path / "out")], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(workers := _children(parent.pid)) < 2:
            assert parent.poll() is None and time.monotonic() < deadline, "no figure worker started"
            time.sleep(0.05)
        time.sleep(1)  # into their imports or their first figures
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in workers if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "figure workers outlived their parent"
    assert not list(system_tmp.iterdir())


def test_a_failing_run_stops_its_workers_at_once():
    with pytest.raises(KeyError), common_figures.FigurePool(2) as pool:
        workers = list(pool._processes)
        raise KeyError("the run failed while the workers were importing")
    # Killed, not asked to stop: a worker asked to stop first finishes its imports (seconds) and
    # exits with status 0.
    assert [p.returncode for p in workers] == [-signal.SIGKILL] * 2
