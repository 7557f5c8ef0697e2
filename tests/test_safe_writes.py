"""Every file the tools and the API write goes through one writer (no write through a link, no file
replaced that the call did not make unless asked), and a refused run removes only what it made."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

from bertjax import runinfo
from bertjax.errors import UserError


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


def test_a_head_view_is_saved_only_to_a_new_file_unless_asked(tmp_path):
    """Probe 1.28–1.30: an existing file and a link's target were replaced by the page; a
    directory gave IsADirectoryError."""
    from analysis.api.heads import HeadView

    view = HeadView("<html>page</html>", {})
    keep = tmp_path / "keep.txt"
    keep.write_text("x")
    with pytest.raises(UserError, match=r"keep\.txt exists; it is left as it is \(pass overwrite=True"):
        view.save(keep)
    assert keep.read_text() == "x"
    victim = _victim(tmp_path)
    (tmp_path / "link.html").symlink_to(victim)
    for overwrite in (False, True):
        with pytest.raises(UserError, match=r"link\.html is a symbolic link; refusing to write through it"):
            view.save(tmp_path / "link.html", overwrite=overwrite)
    assert victim.read_text() == "precious\n"
    with pytest.raises(UserError, match=f"{tmp_path} is a directory; name the file to write"):
        view.save(tmp_path)
    assert view.save(keep, overwrite=True) == keep and keep.read_text() == "<html>page</html>"
    assert view.save(tmp_path / "new.html").read_text() == "<html>page</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "link.html", "new.html", "victim.txt"]


def test_a_file_that_appears_while_it_is_written_is_kept(tmp_path):
    path = tmp_path / "page.html"
    with pytest.raises(UserError, match="exists; it is left as it is"), runinfo.atomic_file(path) as f:
        f.write("mine")
        path.write_text("theirs")
    assert path.read_text() == "theirs" and [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_save_pretrained_replaces_a_saved_model_only_when_asked(tmp_path):
    import bertjax

    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=16))
    (tmp_path / "config.json").write_text("{}\n")
    with pytest.raises(UserError, match=r"config\.json exists"):
        bertjax.save_pretrained(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # no weights without their config
    bertjax.save_pretrained(model, tmp_path, overwrite=True)
    assert bertjax.from_pretrained(tmp_path).config.num_hidden_layers == model.config.num_hidden_layers


def test_a_result_saved_inside_its_own_directory_holds_no_lock_or_temporary(tiny_hf, shared_data, tmp_path):
    """Probe 1.20: `r.save(r.directory / "sub")` copied its own `.sub.lock` and `.sub.tmp-…` in;
    where `r.directory` is the temporary folder of a result given no `out`, the copy would go with
    it. A save writes the result afresh through the writer, so it holds the result's files only."""
    from analysis import api

    settings = dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=4, batch_size=4, max_length=32,
                    roles="local,cls", figures="none", cache_dir=str(tmp_path / "parses"))  # fmt: skip
    result = api.roles(str(tiny_hf), out=tmp_path / "run", **settings)
    written = sorted(os.listdir(tmp_path / "run"))
    assert runinfo.OUTPUT_MARKER in written and "roles.csv" in written
    result.save(result.directory / "sub")
    assert sorted(os.listdir(tmp_path / "run" / "sub")) == written
    result.save(result.directory / "sub", overwrite=True)  # the earlier copy is in `directory` now
    assert sorted(os.listdir(tmp_path / "run" / "sub")) == written
    held = api.roles(str(tiny_hf), **settings)
    with pytest.raises(UserError, match=r"inside this result's temporary folder .* removed with the result"):
        held.save(held.directory / "sub")
    assert not (held.directory / "sub").exists()


@pytest.mark.slow
def test_a_saved_track_result_keeps_the_scores_its_run_json_names(shared_data, tmp_path):
    """Probe 1.35: the scores cache of a track result with no `out` lived in its temporary folder;
    a saved copy's run.json named those files, deleted with the result."""
    from test_track import write_run

    from analysis import api
    from analysis.heads import tracking

    run = write_run(tmp_path / "tiny", shared_data, [1, 3])
    result = api.track(run=str(run), task="mrpc", glue_dir=str(shared_data / "glue"), n=8, max_length=32,
                       figures="none", roles="local,cls")  # fmt: skip
    scores = result.scores
    result.save(tmp_path / "ts")
    del result
    gc.collect()
    named = json.loads((tmp_path / "ts" / "run.json").read_text())["scores_cache"]
    assert sorted(named) == ["1", "3"]
    for step, path in named.items():
        assert Path(path).parent == tmp_path / "ts.cache"
        assert (tracking.load_scores(Path(path))["mrpc"].scores["cls"] == scores[int(step)]["mrpc"]["cls"]).all()


def test_a_refused_run_removes_no_folder_holding_another_runs_files(tmp_path):
    """Probe 4.22: a refused trainer removed the parent folder it had created, with another live
    run's workdir inside."""
    new = tmp_path / "new"
    with pytest.raises(UserError, match="refused"), runinfo.one_writer(new / "x"):
        (new / "y" / "checkpoints").mkdir(parents=True)  # the other run, started meanwhile
        (new / "x" / "data").mkdir(parents=True)  # this run's own
        raise UserError("refused")
    assert sorted(p.name for p in new.iterdir()) == ["y"]
    assert (new / "y" / "checkpoints").is_dir()
    with pytest.raises(UserError, match="refused"), runinfo.one_writer(tmp_path / "a" / "b" / "c"):
        raise UserError("refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]  # empty folders it made: removed


def test_a_run_refused_the_lock_leaves_the_holders_workdir(tmp_path, monkeypatch):
    """The refused run found no workdir at its start; the lock's holder made it meanwhile."""
    workdir = tmp_path / "new" / "work"
    workdir.parent.mkdir()
    locked = runinfo.exclusive

    def holder_writes_meanwhile(out, flag):
        workdir.mkdir()
        (workdir / "config.yaml").write_text("theirs\n")
        return locked(out, flag)

    with runinfo.exclusive(workdir, "--workdir"):
        monkeypatch.setattr(runinfo, "exclusive", holder_writes_meanwhile)
        with pytest.raises(UserError, match="is being written by another run"), runinfo.one_writer(workdir):
            pass
    assert (workdir / "config.yaml").read_text() == "theirs\n"


def test_a_figure_is_never_drawn_through_a_link(tmp_path):
    """A result's figure drawn on request (`r.figure(...)`) goes into the output directory the user
    chose; `save_figure` writes every figure through `atomic_file`."""
    import matplotlib.pyplot as plt

    from analysis.common.figures import figure_formats, save_figure

    victim = _victim(tmp_path)
    (tmp_path / "grid.png").symlink_to(victim)
    fig = plt.figure()
    try:
        with figure_formats(["png", "svg"]):
            with pytest.raises(UserError, match=r"grid\.png is a symbolic link; refusing to write through it"):
                save_figure(fig, tmp_path, "grid")
            paths = save_figure(fig, tmp_path / "new", "grid")
    finally:
        plt.close(fig)
    assert victim.read_text() == "precious\n"
    assert paths[0].read_bytes().startswith(b"\x89PNG") and b"<svg" in paths[1].read_bytes()
