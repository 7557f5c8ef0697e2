"""`analysis.api`: a call gives what its CLI writes (tables byte for byte, scores to float rounding),
takes the flags' names and defaults, raises the CLI's one-line errors, reuses its compiled functions
across calls without growing memory, and `head_view`'s β is the roles run's for that sequence."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bertjax
from analysis import api, report, track
from analysis import roles as roles_cli
from bertjax.errors import UserError


def _settings(shared_data: Path, cache: Path) -> dict:
    # Length 32 and 12 examples: one padded shape, one compile, and two batches of 8 (the second padded).
    return dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=12, batch_size=8, max_length=32,
                cache_dir=str(cache), figures="none")  # fmt: skip


def _flags(settings: dict) -> list[str]:
    flags = []
    for name, value in settings.items():
        flags += ["--no-figures"] if name == "figures" else [f"--{name.replace('_', '-')}", str(value)]
    return flags


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("api")


@pytest.fixture(scope="module")
def second_hf(work, tiny_hf) -> Path:
    """Another tiny checkpoint with tiny_hf's tokenizer (seed 2), for a series of two."""
    directory = work / "tiny_hf_2"
    bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), seed=2), directory)
    bertjax.load_tokenizer(tiny_hf).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def roles_pair(work, tiny_hf, shared_data):
    """(the CLI's output directory, the call's result) on the same settings."""
    settings = _settings(shared_data, work / "parses")
    roles_cli.main(["--ckpt", str(tiny_hf), "--out", str(work / "cli"), *_flags(settings)])
    return work / "cli", api.roles(str(tiny_hf), **settings)


def test_the_call_gives_the_clis_tables_and_scores(roles_pair):
    cli_out, result = roles_pair
    assert result.table.to_csv(index=False).encode() == (cli_out / "roles.csv").read_bytes()
    assert result.summary.equals(pd.read_csv(cli_out / "summary.csv"))
    with np.load(cli_out / "scores.npz") as stored:
        keys = {f"{t}/{r}" for t, roles in result.scores.items() for r in roles}
        assert keys | {f"{k}/index" for k in keys} == set(stored.files)
        for key in keys:
            task, role = key.split("/")
            # One process, one compiled function, the same batches: the same float32 sums, so the
            # same bits; a tolerance would only hide a different computation.
            np.testing.assert_array_equal(result.scores[task][role], stored[key])
            np.testing.assert_array_equal(result.indices[task][role], stored[f"{key}/index"])
    cli_config = json.loads((cli_out / "run.json").read_text())["config"]
    assert {**result.info["config"], "out": None} == {**cli_config, "out": None}
    assert result.settings.max_length == cli_config["max_length"]


def test_save_writes_the_outputs_as_out_would(roles_pair, tmp_path):
    _, result = roles_pair
    saved = result.save(tmp_path / "saved")
    for name in ("roles.csv", "summary.csv", "scores.npz"):
        assert (saved / name).read_bytes() == (result.directory / name).read_bytes()
    with pytest.raises(UserError, match="is not empty; pass --overwrite"):
        result.save(tmp_path / "saved")
    assert result.save(tmp_path / "saved", overwrite=True) == saved


def test_the_result_renders_the_reports_grid_and_cards_inline(roles_pair):
    _, result = roles_pair
    page = result._repr_html_()
    assert page.startswith('<iframe class="bertjax-report" srcdoc="&lt;!DOCTYPE html&gt;')
    # Offline: nothing is fetched (no src or href attribute in the page; the SVG namespace is a name).
    assert "id=&quot;report-data&quot;" in page and "src=" not in page.split("srcdoc=", 1)[1] and "href=" not in page
    (figure,) = result.figure("role_grid")
    assert figure.path.name == "mrpc_role_grid.png" and figure._repr_png_()[:4] == b"\x89PNG"


def test_the_keywords_default_as_the_flags(tiny_hf):
    assert api.roles_config("ckpt", {"out": "roles_out"}) == roles_cli.parse_args(["--ckpt", "ckpt"])
    given = {"roles": "local,cls", "tau": 2.5, "special_rows": False, "n": 7}
    assert api.roles_config("ckpt", given | {"out": "roles_out"}) == roles_cli.parse_args(
        ["--ckpt", "ckpt", "--roles", "local,cls", "--tau", "2.5", "--no-special-rows", "--n", "7"]
    )
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        api.roles_config("ckpt", {"max_len": 3})
    with pytest.raises(TypeError, match="block_score"):
        api.track(ckpt=[str(tiny_hf)], block_score="entropy")


@pytest.mark.parametrize(
    ("keywords", "flags"),
    [
        ({"n": 0}, ["--n", "0"]),
        ({"tau": "x"}, ["--tau", "x"]),
        ({"roles": "local,nope"}, ["--roles", "local,nope"]),
        ({"alpha": 2.0}, ["--alpha", "2"]),
        ({"window": 0}, ["--window", "0"]),
        ({"task": "mnli"}, ["--task", "mnli"]),
    ],
)
def test_errors_are_the_clis_lines(keywords, flags, tiny_hf, tmp_path, cli_error):
    line = cli_error(roles_cli.main, ["--ckpt", str(tiny_hf), "--out", str(tmp_path / "cli"), *flags])
    with pytest.raises(UserError) as raised:
        api.roles(str(tiny_hf), out=tmp_path / "api", **keywords)
    assert line == f"error: {' '.join(str(raised.value).split())}"
    assert not (tmp_path / "api").exists()


def test_a_choice_the_cli_parser_checks_is_one_line_too(tiny_hf):
    with pytest.raises(UserError, match=r"^--test must be one of t, z, got 'x'$"):
        api.roles(str(tiny_hf), test="x")
    with pytest.raises(UserError, match="one of the arguments --run --ckpt is required"):
        api.track()


def test_track_call_gives_the_clis_table(work, tiny_hf, second_hf, shared_data):
    settings = _settings(shared_data, work / "parses")
    series = [f"{tiny_hf}@0", f"{second_hf}@5"]
    out = work / "track-cli"
    track.main([*(a for s in series for a in ("--ckpt", s)), "--out", str(out), *_flags(settings)])
    result = api.track(ckpt=series, **settings)
    assert result.table.to_csv(index=False).encode() == (out / "track.csv").read_bytes()
    assert result.onset.equals(pd.read_csv(out / "onset.csv"))
    assert sorted(result.scores) == [0, 5]
    first = result.scores[0]["mrpc"]["local"]
    assert first.shape == (12, 2, 2)  # 12 sequences, tiny: 2 layers × 2 heads
    assert result.table["step"].unique().tolist() == [0, 5]


def test_report_call_writes_the_clis_page(roles_pair, tmp_path):
    cli_out, _ = roles_pair
    report.main([str(cli_out), "--examples", "0", "--out", str(tmp_path / "cli.html")])
    page = api.report(cli_out, examples=0, out=tmp_path / "api.html")
    strip = lambda p: p.read_text().replace(str(tmp_path / "cli.html"), "").replace(str(tmp_path / "api.html"), "")
    assert strip(page.path) == strip(tmp_path / "cli.html")
    assert "srcdoc" in page._repr_html_()


def test_head_view_beta_is_the_roles_runs(work, tiny_hf, shared_data):
    pair = ("The cat sat on the mat.", "A cat was sitting on the mat.")
    text = work / "pair.txt"
    text.write_text("\t".join(pair) + "\n")
    settings = _settings(shared_data, work / "parses") | {"task": f"text:{text}"}
    result = api.roles(str(tiny_hf), **settings)
    (task,) = result.scores
    view = api.head_view(str(tiny_hf), pair, layer=1, head=1, role="nsubj", cache_dir=settings["cache_dir"])
    assert view.data["open"] == {"layer": 1, "head": 1, "role": "nsubj"}
    (sequence,) = view.data["examples"]["your text"]["sequences"]
    checked = 0
    for role, scores in result.scores[task].items():
        if len(scores) == 0:  # the role has no row in this pair (no dobj in it)
            assert sequence["beta"]["model"][role] is None
            continue
        checked += 1
        # The same β kernel on the same attention, padded to 32 (the run) or to the sequence's own
        # length (the view): the padding adds exact zeros, so float32 sums agree to a few ulp of
        # the row sums (< 1e-6 relative for β of order 1..10).
        np.testing.assert_allclose(np.array(sequence["beta"]["model"][role]), scores[0].ravel(), rtol=1e-5)
    assert checked >= 9  # the positional, pair, delimiter roles and nsubj at least
    page = view._repr_html_()
    assert page.startswith("<iframe") and "&quot;open&quot;" in page


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"layer": 2, "head": 0}, r"layer 2, head 0 is not a head of this model \(2 layers × 2 heads\)"),
        ({"layer": 0, "head": 0, "role": "block"}, "role 'block' is not defined for this input"),
        ({"layer": 0, "head": 0, "role": "nope"}, "unknown role"),
    ],
)
def test_head_view_errors_are_one_line(keywords, message, tiny_hf):
    with pytest.raises(UserError, match=message):
        api.head_view(str(tiny_hf), "One sentence here.", **keywords)
    with pytest.raises(UserError, match="a loaded model needs its tokenizer"):
        api.head_view(bertjax.from_pretrained(tiny_hf), "One sentence.", layer=0, head=0)


REPEATED = r"""
import json, resource, sys
import jax
from analysis import api

compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
)
ckpt, glue, cache = sys.argv[1:4]
calls = []
for _ in range(3):
    before = len(compiles)
    result = api.roles(ckpt, task="mrpc", glue_dir=glue, n=24, batch_size=8, max_length=64, cache_dir=cache, figures="none")
    del result
    calls.append({"compiles": len(compiles) - before, "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
print(json.dumps(calls))
"""


def test_repeated_calls_compile_nothing_new_and_keep_memory(minilm_path, shared_data, tmp_path):
    # A fresh process: its peak RSS is this job's alone, and no earlier test has compiled anything.
    done = subprocess.run(
        [sys.executable, "-c", REPEATED, str(minilm_path), str(shared_data / "glue"), str(tmp_path / "parses")],
        capture_output=True, text=True, timeout=600, check=False, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first, second, third = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["compiles"] > 0
    assert second["compiles"] == third["compiles"] == 0
    assert third["peak_rss_kb"] <= 1.05 * first["peak_rss_kb"], (first, second, third)


def test_results_are_dataclasses_with_the_run_settings(roles_pair):
    _, result = roles_pair
    assert dataclasses.is_dataclass(result) and result.settings.n == 12
    assert result.info["config"]["ckpt"] == result.settings.ckpt
