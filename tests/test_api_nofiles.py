"""An API call given no `out`, and its inline views, create no file or folder: with every
`tempfile` function and `os.mkdir`/`os.makedirs` made to raise, `roles`, `track` and `clark` still
return their results, which still show their report page and figures inline (issue 51 item 3);
and the page built from a result held in memory is the page read back from its saved files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from analysis import api
from analysis.heads import report as heads_report

# The roles the calls score: none needs a parse, so no parse cache is opened (its folder and
# database are a cache the settings name, as JAX's compilation cache is).
ROLES = "local,prev,next,cls,sep"


class Created(Exception):
    """What a patched `tempfile` or `os` function raises: something tried to create a file or folder."""


@pytest.fixture
def no_files(monkeypatch) -> list[str]:
    """Every way to a temporary file or folder, and os.mkdir/os.makedirs, made to raise; the
    names of those called (a caller catching the error is still caught here). Imported first:
    importing matplotlib creates its config and cache folders, once per machine, not per call."""
    import matplotlib.pyplot  # noqa: F401

    assert api.roles and api.track and api.clark  # the modules behind them, imported on first use
    called: list[str] = []

    def refuse(module, name: str) -> None:
        def raising(*args, **kwargs):
            called.append(name)
            raise Created(f"{name}{args}")

        monkeypatch.setattr(module, name.split(".")[-1], raising)

    for name in ("mkdtemp", "mkstemp", "TemporaryDirectory", "NamedTemporaryFile"):
        refuse(tempfile, f"tempfile.{name}")
    for name in ("mkdir", "makedirs"):
        refuse(os, f"os.{name}")
    return called


def _small(shared_data: Path) -> dict:
    return dict(glue_dir=str(shared_data / "glue"), n=8, batch_size=8, max_length=32)


def test_calls_and_their_inline_views_create_no_file_or_folder(tiny_hf, second_hf, shared_data, no_files):
    small = _small(shared_data)
    roles = api.roles(str(tiny_hf), task="mrpc", roles=ROLES, **small)
    page = roles._repr_html_()
    assert "id=&quot;report-data&quot;" in page and roles.report_html(examples=1).startswith("<!DOCTYPE html>")
    (figure,) = roles.figure("role_grid")
    assert figure._repr_png_()[:4] == b"\x89PNG"

    track = api.track(ckpt=[f"{tiny_hf}@0", f"{second_hf}@5"], task="mrpc", roles=ROLES, bootstrap=20, **small)
    assert "id=&quot;report-data&quot;" in track._repr_html_()

    clark = api.clark(str(tiny_hf), analyses="surface", inputs="mrpc", data_dir=str(shared_data), **small)
    page = clark._repr_html_()
    assert "data:image/png;base64," in page and "surface.csv" in page
    assert no_files == []


def test_the_other_calls_and_their_inline_views_create_none_either(tiny_hf, second_hf, classifier, shared_data,
                                                                    no_files):  # fmt: skip
    small = _small(shared_data) | {"task": "mrpc"}
    effect = api.finetune_effect(str(tiny_hf), f"{second_hf}:mrpc", roles=ROLES, **small)
    assert effect._repr_html_().count("<img") == 2  # beta_change and attention_similarity
    ablation = api.ablate(str(classifier), analyses="patterns,disable", **small)
    assert "<img" in ablation._repr_html_()
    pruned = api.prune(str(classifier), prune_step=0.5, random_seeds=1, **small)
    assert "<img" in pruned._repr_html_()
    assert no_files == []


def test_the_inline_header_names_the_checkpoint_not_a_folder(tiny_hf, shared_data, no_files):
    roles = api.roles(str(tiny_hf), task="mrpc", roles=ROLES, **_small(shared_data))
    data = heads_report.report_data(roles.report_run(), heads_report.ReportConfig("", 0))
    assert data["run_dir"] == "not saved" and data["title"] == f"{tiny_hf}: head roles"
    assert "bertjax-roles-" not in roles.report_html(examples=0)  # the temporary folder it once named
    assert no_files == []


@pytest.mark.parametrize("kind", ["roles", "track"])
def test_the_page_held_in_memory_is_the_page_of_the_saved_files(kind, tiny_hf, second_hf, shared_data, tmp_path):
    small = _small(shared_data) | {"task": "mrpc", "roles": ROLES}
    if kind == "roles":
        result = api.roles(str(tiny_hf), **small)
    else:
        result = api.track(ckpt=[f"{tiny_hf}@0", f"{second_hf}@5"], bootstrap=20, **small)
    saved = result.save(tmp_path / "saved")
    config = heads_report.ReportConfig(str(saved), 2)
    held = heads_report.report_data(result.report_run(), config)
    read = heads_report.report_data(heads_report.read_run(saved), config)
    assert held["run_dir"] == "not saved" and read["run_dir"] != "not saved"
    # As the page holds them (JSON): a list read back is the tuple held in memory.
    shown = lambda data: json.dumps({k: v for k, v in data.items() if k not in ("title", "run_dir")}, sort_keys=True)
    assert shown(held) == shown(read)
    assert held["examples"] and held["stats"] and not held["examples_missing"]
