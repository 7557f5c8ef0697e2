"""A call of `roles`, `track`, `finetune_effect`, `clark`, `ablate` and `prune` without `out` returns its result held in memory:
nothing is written into the system's temporary directory or the working directory (its figures
and report page drawn on demand leave nothing either), and calling again compiles nothing new."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax
import pytest

from analysis import api
from bertjax.errors import UserError

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
compiles: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: compiles.append(event) if event == COMPILE_EVENT else None
)


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.slow  # ~45 s: six tools twice, a figure and a report page
def test_calls_write_nothing_and_compile_nothing_new_when_repeated(
    tiny_hf, second_hf, classifier, shared_data, tmp_path, monkeypatch
):
    # Fresh, empty stand-ins for the system's temporary directory and the working directory (the
    # real ones are shared with other processes); the parse cache is where the settings say.
    temporary, here = tmp_path / "tmp", tmp_path / "cwd"
    temporary.mkdir()
    here.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.chdir(here)
    assert tempfile.gettempdir() == str(temporary)
    small = dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=8, batch_size=8, max_length=32,
                 cache_dir=str(tmp_path / "parses"))  # fmt: skip
    calls = {
        "roles": lambda: api.roles(str(tiny_hf), **small),
        "track": lambda: api.track(ckpt=[f"{tiny_hf}@0", f"{second_hf}@5"], bootstrap=20, **small),
        "finetune_effect": lambda: api.finetune_effect(str(tiny_hf), f"{second_hf}:mrpc", **small),
        "clark": lambda: api.clark(
            str(tiny_hf),
            analyses="surface,depheads",
            inputs="mrpc",
            data_dir=str(shared_data),
            ewt_n=8,
            **{k: v for k, v in small.items() if k not in ("task", "cache_dir")},
        ),
        "ablate": lambda: api.ablate(str(classifier), analyses="patterns,disable", **small),
        "prune": lambda: api.prune(
            str(classifier), prune_step=0.5, random_seeds=1, **{k: v for k, v in small.items() if k != "cache_dir"}
        ),
    }
    for name, call in calls.items():
        result = call()
        assert _listing(temporary) == [] and _listing(here) == [], name
        assert result.written is None and result.info["figures"] == [], name
        before = len(compiles)
        again = call()
        assert len(compiles) == before, f"{name}: the second call compiled {len(compiles) - before} programs"
        tables = (lambda r: {"table": r.table}) if name in ("roles", "track") else (lambda r: r.tables)
        assert all(tables(again)[k].equals(table) for k, table in tables(result).items()), name
        assert _listing(temporary) == [] and _listing(here) == [], name
    # Drawn on demand, in memory: a figure and the report page leave nothing.
    roles = calls["roles"]()
    (figure,) = roles.figure("role_grid")
    assert figure.path == Path("mrpc_role_grid.png") and figure._repr_png_()[:4] == b"\x89PNG"
    assert "report-data" in roles._repr_html_()
    effect, ablation = calls["finetune_effect"](), calls["ablate"]()
    assert effect._repr_html_().count("<img") == 2  # beta_change and attention_similarity
    assert "<img" in ablation._repr_html_() and ablation.figure_names()
    assert _listing(temporary) == [] and _listing(here) == []
    # `directory` is asked for: then, and only then, the files are written (into the temporary folder).
    assert (roles.directory / "roles.csv").is_file() and roles.directory.is_relative_to(temporary)
    del roles


def test_the_tools_print_nothing_but_their_progress(tiny_hf, shared_data, tmp_path, capsys):
    """What the CLI prints is the result's to give (`run.text()`); a call prints none of it."""
    result = api.roles(str(tiny_hf), task="mrpc", glue_dir=str(shared_data / "glue"), n=4, batch_size=4,
                       max_length=32, cache_dir=str(tmp_path / "parses"), roles="local,cls")  # fmt: skip
    assert capsys.readouterr().out == ""
    assert result.run.text().startswith("mrpc: N = 4 sequences")
    assert set(os.listdir(tmp_path)) <= {"parses"}


def test_a_shard_without_a_scores_cache_is_one_line(tiny_hf, tmp_path):
    with pytest.raises(UserError, match=r"^shard: a shard scores into the scores cache only; give it scores_cache$"):
        api.track(ckpt=[f"{tiny_hf}@0", f"{tiny_hf}@1"], shard="0/2")
