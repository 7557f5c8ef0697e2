"""Tracking roles over a run's checkpoints: rows equal `analysis.roles` per step, the per-step cache
skips what is done, layer groups and fractions against obvious counts, and the one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pandas as pd
import pytest
from flax import nnx
from matplotlib.colors import to_rgba
from transformers import BertTokenizerFast

import bertjax
from analysis import roles as roles_cli
from analysis import track
from analysis.common import examples
from analysis.heads import figures as heads_figures
from analysis.heads import onset, summary, tracking, tracking_figures
from bertjax import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[1]
STEPS = (1, 3, 10, 31, 96)


def write_checkpoint(
    workdir: Path,
    step: int,
    seed: int,
    tokenizer: str = "tokenizer",
    cls=bertjax.BertForPreTraining,
    positions: int = 128,
) -> None:
    """A random tiny model saved as a training step (params + meta), as the trainer does."""
    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=positions), cls, seed=seed)
    manager = ocp.CheckpointManager(workdir / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
    params = ckpt.flatten_params(nnx.state(model, nnx.Param))
    manager.save(step, args=ocp.args.Composite(**ckpt.save_args(params, ckpt.make_meta(model, tokenizer, {}))))
    manager.wait_until_finished()
    manager.close()


def write_run(workdir: Path, shared_data: Path, steps) -> Path:
    """A pre-training run's layout: the tokenizer and an orbax checkpoint (seed i) at each step."""
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(workdir / "tokenizer")
    for seed, step in enumerate(steps):
        write_checkpoint(workdir, step, seed)
    return workdir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, shared_data) -> Path:
    return write_run(tmp_path_factory.mktemp("run"), shared_data, STEPS)


@pytest.fixture(scope="module")
def parse_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("parses")


def _flags(shared_data: Path, parse_cache: Path) -> list[str]:
    # Length 32 keeps every batch in one padded shape: one compile.
    return ["--task", "mrpc,sst2", "--glue-dir", str(shared_data / "glue"), "--n", "12", "--batch-size", "8",
            "--max-length", "32", "--cache-dir", str(parse_cache)]  # fmt: skip


@pytest.fixture(scope="module")
def tracked(run_dir, shared_data, parse_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs") / "track"
    argv = ["--run", str(run_dir), "--out", str(out), *_flags(shared_data, parse_cache)]
    track.main([*argv, "--no-figures"])
    return out, argv


def test_outputs_cover_every_step_and_role(tracked):
    out, _ = tracked
    table = pd.read_csv(out / tracking.TRACK_CSV)
    assert list(table.columns) == ["step", "task", "layer", "head", "role", "n", "mean", "std", "ci_low", "ci_high",
                                   "lower_bound", "t", "p_value", "p_adjusted", "assigned"]  # fmt: skip
    assert sorted(pd.unique(table["step"])) == list(STEPS)
    # per step: mrpc 12 roles, sst2 11 (no block), each over 2 layers × 2 heads
    assert (table.groupby("step").size() == (12 + 11) * 4).all()
    run = json.loads((out / "run.json").read_text())
    assert run["analysed_steps"] == list(STEPS) and run["cached_steps"] == []


def test_onset_csv_holds_the_onsets_of_the_track(tracked):
    out, _ = tracked
    table = pd.read_csv(out / tracking.TRACK_CSV)
    written = pd.read_csv(out / onset.ONSET_CSV)
    assert list(written.columns) == onset.ONSET_COLUMNS
    assert len(written) == len(table[["task", "layer", "head", "role"]].drop_duplicates())
    expected = onset.role_onsets(table).reset_index(drop=True)
    point = ["task", "layer", "head", "role", "onset_step", "status", "mean_at_onset", "held_at_last_step"]
    pd.testing.assert_frame_equal(written[point], expected[point], check_dtype=False)
    # The intervals of the default 1000 replicates: shares are proportions, bounds are steps.
    assert written["no_onset_share"].between(0, 1).all() and written["held_at_last_share"].between(0, 1).all()
    assert set(written["onset_low"].dropna()) <= set(STEPS) and set(written["onset_high"].dropna()) <= set(STEPS)
    run = json.loads((out / "run.json").read_text())
    assert run["onsets"]["persistence"] == 2 and run["onsets"]["replicates"] == 1000
    assert run["tests"]["count"] == table["p_value"].notna().sum()


@pytest.mark.parametrize("tau", ["3", "auto"])
def test_rows_of_a_step_equal_what_roles_writes_for_it(tracked, run_dir, shared_data, parse_cache, tmp_path, tau):
    out, argv = tracked
    table = pd.read_csv(out / tracking.TRACK_CSV) if tau == "3" else None
    if tau == "auto":  # tests come from the cached scores: no checkpoint is scored again
        cache = out.parent / f"{out.name}.cache"
        track.main(
            [*argv, "--tau", "auto", "--out", str(tmp_path / "auto"), "--scores-cache", str(cache), "--no-figures"]
        )
        table = pd.read_csv(tmp_path / "auto" / tracking.TRACK_CSV)
    step = STEPS[2]
    roles_cli.main(["--ckpt", str(run_dir), "--step", str(step), "--tau", tau, "--out", str(tmp_path / "roles"),
                    "--no-figures", *_flags(shared_data, parse_cache)])  # fmt: skip
    expected = pd.read_csv(tmp_path / "roles" / "roles.csv")
    rows = table[table["step"] == step].drop(columns="step").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows, expected, check_exact=True)


def test_a_second_run_scores_only_new_checkpoints(tracked, run_dir, shared_data, parse_cache, monkeypatch, tmp_path):
    _, argv = tracked
    loaded = []
    real_load = tracking.from_pretrained

    def counting_load(source, **options):
        loaded.append(source.step)
        return real_load(source, **options)

    monkeypatch.setattr(tracking, "from_pretrained", counting_load)
    cache = tmp_path / "cache"
    argv = [*argv, "--scores-cache", str(cache), "--out", str(tmp_path / "first"), "--no-figures"]
    track.main(argv)
    assert loaded == list(STEPS)
    first_onsets = pd.read_csv(tmp_path / "first" / "onset.csv")

    loaded.clear()
    encoded = []
    monkeypatch.setattr(examples, "encode_tasks", lambda *a: encoded.append(a) or {})
    # the same --out, replaced without --overwrite as it holds a track output; figures this time
    track.main([*argv[:-1], "--figure-format", "png,svg"])
    assert loaded == [] and encoded == []
    # the onset intervals come back from the cached scores alone, the same resamples giving the same ones
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "first" / "onset.csv"), first_onsets)
    assert first_onsets["held_at_last_share"].notna().all()
    run = json.loads((tmp_path / "first" / "run.json").read_text())
    assert run["analysed_steps"] == [] and run["cached_steps"] == list(STEPS)
    figures = {p.name for p in (tmp_path / "first").iterdir()}
    for task in ("mrpc", "sst2"):
        for kind in ("role_fractions", "emergence", "mean_beta", "onset"):
            assert {f"{task}_{kind}.png", f"{task}_{kind}.svg"} <= figures

    monkeypatch.undo()
    monkeypatch.setattr(tracking, "from_pretrained", counting_load)
    write_checkpoint(run_dir, 300, seed=9)
    try:
        track.main(argv)
        assert loaded == [300]
        table = pd.read_csv(tmp_path / "first" / tracking.TRACK_CSV)
        assert sorted(pd.unique(table["step"])) == [*STEPS, 300]
    finally:
        (run_dir / ckpt.CHECKPOINTS / "300").rename(tmp_path / "step300")  # other tests expect STEPS


def test_layer_groups_are_thirds():
    sizes = {n: [len(layers) for _, layers in summary.layer_groups(n)] for n in (12, 6, 4, 2, 1)}
    assert sizes == {12: [4, 4, 4], 6: [2, 2, 2], 4: [2, 1, 1], 2: [1, 1], 1: [1]}
    assert [name for name, _ in summary.layer_groups(12)] == ["initial", "middle", "final"]
    assert [list(layers) for _, layers in summary.layer_groups(12)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_held_fractions_count_heads():
    rng = np.random.default_rng(0)
    layers, heads = np.meshgrid(np.arange(6), np.arange(3), indexing="ij")
    frames = []
    for step in (1, 10):
        for role in ("local", "cls"):
            frames.append(pd.DataFrame({"step": step, "task": "mrpc", "layer": layers.ravel(), "head": heads.ravel(),
                                        "role": role, "assigned": rng.random(18) < 0.5}))  # fmt: skip
    table = pd.concat(frames, ignore_index=True)
    fractions = tracking_figures.held_fractions(table, "mrpc")
    for step in (1, 10):
        for role in ("local", "cls"):
            rows = table[(table.step == step) & (table.role == role)]
            assert fractions.loc[(step, "all"), role] == rows.assigned.sum() / 18
            for name, group in zip(("initial", "middle", "final"), ([0, 1], [2, 3], [4, 5]), strict=True):
                assert fractions.loc[(step, name), role] == rows[rows.layer.isin(group)].assigned.sum() / 6


def test_emergence_shows_untested_heads_dark_grey(monkeypatch, tmp_path):
    """A NaN p-value (n < 2, zero variance) is untested: dark grey, not the light grey of "not
    held"."""
    table = pd.DataFrame({"step": [1, 1, 10, 10], "task": "sst2", "layer": 0, "head": [0, 1, 0, 1], "role": "local",
                          "p_value": [0.5, np.nan, 0.01, 0.5], "assigned": [False, False, True, False]})  # fmt: skip
    figures = []
    monkeypatch.setattr(tracking_figures, "save_figure", lambda fig, out_dir, stem: figures.append(fig) or [])
    tracking_figures.plot_emergence(table, "sst2", tmp_path, "emergence")
    (mesh,) = figures[0].axes[0].collections
    colours = mesh.to_rgba(mesh.get_array()).reshape(2, 2, 4)  # heads × steps
    held = heads_figures.role_colours(["local"])["local"]
    expected = [[heads_figures.NOT_HELD, held], [heads_figures.NO_DATA, heads_figures.NOT_HELD]]
    np.testing.assert_allclose(colours, [[to_rgba(c) for c in steps] for steps in expected])


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no_checkpoints", "no bertjax checkpoints found"),
        ("missing_step", "has no checkpoint for step 7; available: [1, 3, 10, 31, 96]"),
        ("bad_steps", "--steps must be comma-separated integers"),
        ("empty_steps", "error: --steps names no step"),
        ("comma_steps", "error: --steps names no step"),
        ("no_role_defined", "error: --roles block: no requested role is defined for sst2 (block needs sentence pairs)"),
        ("cache_is_a_file", "exists and is not a directory"),
        ("cache_inside_out", "which each run replaces; put the cache elsewhere"),
    ],
)
def test_bad_input_gives_one_line(case, expected, run_dir, shared_data, tmp_path, cli_error):
    argv = [
        "--run",
        str(run_dir),
        "--task",
        "mrpc",
        "--glue-dir",
        str(shared_data / "glue"),
        "--out",
        str(tmp_path / "out"),
    ]
    if case == "no_checkpoints":
        (tmp_path / "empty").mkdir()
        argv[1] = str(tmp_path / "empty")
    elif case == "missing_step":
        argv += ["--steps", "3,7"]
    elif case == "bad_steps":
        argv += ["--steps", "3,x"]
    elif case in ("empty_steps", "comma_steps"):
        argv += ["--steps", "" if case == "empty_steps" else ","]
    elif case == "no_role_defined":
        argv[3] = "sst2"
        argv += ["--roles", "block", "--n", "4"]
    elif case == "cache_is_a_file":
        (tmp_path / "a_file").touch()
        argv += ["--scores-cache", str(tmp_path / "a_file")]
    elif case == "cache_inside_out":
        argv += ["--scores-cache", str(tmp_path / "out" / "cache")]
    message = cli_error(track.main, argv)
    assert message.startswith("error: ") and expected in message
    assert not (tmp_path / "out").exists()


def test_checkpoints_with_different_tokenizers_are_refused(tmp_path, cli_error):
    for step, tokenizer in ((1, "tokenizer"), (2, "other_tokenizer")):
        write_checkpoint(tmp_path / "run", step, seed=0, tokenizer=tokenizer)
    message = cli_error(track.main, ["--run", str(tmp_path / "run"), "--task", "mrpc", "--out", str(tmp_path / "out")])
    assert "the checkpoints use different tokenizers (step 1: tokenizer, step 2: other_tokenizer)" in message


def test_max_length_is_cut_to_the_checkpoints_positions(shared_data, parse_cache, tmp_path):
    """Sequences are encoded before any model loads; --max-length 32 on a 16-position run must be
    cut to 16 (and recorded), not fail on the first batch."""
    workdir = tmp_path / "short"
    BertTokenizerFast(
        vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True
    ).save_pretrained(workdir / "tokenizer")
    write_checkpoint(workdir, 5, seed=0, positions=16)
    out = tmp_path / "track"
    track.main(["--run", str(workdir), "--out", str(out), "--no-figures", *_flags(shared_data, parse_cache)])
    assert json.loads((out / "run.json").read_text())["config"]["roles"]["max_length"] == 16
    assert set(pd.read_csv(out / tracking.TRACK_CSV)["step"]) == {5}


@pytest.mark.parametrize("verbose", [False, True])
def test_a_run_prints_no_library_info_lines_unless_verbose(verbose, run_dir, shared_data, parse_cache, tmp_path):
    command = [sys.executable, "-m", "analysis.track", "--run", str(run_dir), "--out", str(tmp_path / "out"),
               "--steps", "1,3", "--no-figures", *_flags(shared_data, parse_cache), *(["-v"] if verbose else [])]  # fmt: skip
    # Bytes: text mode would turn the progress bars' carriage returns into newlines.
    result = subprocess.run(command, check=True, cwd=ROOT, timeout=300, capture_output=True)
    log = result.stderr.decode()
    shown = [line for line in log.split("\n") if re.search(r" INFO (absl|jax\.)", line)]
    if verbose:
        assert shown, log  # orbax reads two checkpoints, jax starts its backend
    else:
        assert not shown, log
        assert result.stdout.decode().startswith("track: 2 checkpoints, 0 from the cache")
        # The bars of 2 checkpoints x 2 tasks (stdout holds the summary tables), at most 3 lines
        # each: orbax alone wrote ~100 INFO lines per checkpoint read.
        assert len(log.rstrip("\n").split("\n")) <= 2 * 2 * 3, log


def test_the_hub_switched_off_fails_at_once_and_leaves_no_cache_folder(run_dir, tmp_path, monkeypatch, cli_error):
    """The default `--task all` from a hub switched off (HF_*_OFFLINE) with no cached copy: one line
    before any data is read or `<out>.cache/` is made (the datasets client retried for ~29 s)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    out = tmp_path / "t"
    error = cli_error(track.main, ["--run", str(run_dir), "--out", str(out)])
    assert error.startswith("error: nyu-mll/glue qnli: the hub is off (HF_DATASETS_OFFLINE=1) and no local copy")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
