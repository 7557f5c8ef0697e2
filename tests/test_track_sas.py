"""`analysis.track --sas`: per-step SAS equal to scoring the step's checkpoint directly, cached like
the scores, and the curve onsets read from the held-out loss, the SAS and the role counts."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_track import write_run

from analysis import track
from analysis.attention import sas
from analysis.heads import onset, tracking
from bertjax.pretrained import from_pretrained, load_tokenizer
from sieves import depattn
from sieves.align import encode_batch
from sieves.parse import read_conllu

STEPS = (2, 5, 40)
SAS_N = 6


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, shared_data) -> Path:
    workdir = write_run(tmp_path_factory.mktemp("run"), shared_data, STEPS)
    # Evaluations between the checkpoints too (heldout.every): flat in log step to 8, a steep drop
    # to 20, slow after; the curve is read at all of them.
    evaluations = np.array([1, 2, 3, 4, 5, 6, 8, 10, 13, 16, 20, 25, 32, 40])
    x = np.log1p(evaluations)
    losses = 9.0 - 0.02 * x - 3.0 * np.clip(x - np.log(9), 0, np.log(21 / 9)) - 0.1 * np.clip(x - np.log(21), 0, None)
    rows = [
        {"step": int(s), "heldout_mlm_accuracy": 0.1, "heldout_mlm_loss": float(v)}
        for s, v in zip(evaluations, losses, strict=True)
    ]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir


@pytest.fixture(scope="module")
def tracked(run_dir, shared_data, ud_english_ewt, tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs") / "track"
    conllu = ud_english_ewt / "en_ewt-ud-dev.conllu"
    argv = ["--run", str(run_dir), "--out", str(out), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"),
            "--n", "8", "--batch-size", "8", "--max-length", "32", "--roles", "prev,next,cls",
            "--sas", str(conllu), "--sas-n", str(SAS_N)]  # fmt: skip
    track.main([*argv, "--figures", "onset"])
    return out, argv, conllu


def test_sas_csv_equals_scoring_each_checkpoint_directly(tracked, run_dir):
    out, _, conllu = tracked
    table = pd.read_csv(out / tracking.SAS_CSV)
    assert list(table.columns) == ["step", *depattn.SAS_COLUMNS] and sorted(pd.unique(table["step"])) == list(STEPS)
    sentences = read_conllu(conllu, limit=SAS_N)
    seqs = encode_batch(load_tokenizer(run_dir), [(t,) for t, _ in sentences], [(w,) for _, w in sentences], 32)
    for step in STEPS:
        expected = depattn.sas_table(sas.score_sas(from_pretrained(run_dir, step=step), seqs, 8, 32))
        rows = table[table["step"] == step].drop(columns="step").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, expected, check_exact=True)
        # "all" scores each word once whose piece (and whose head's piece) survived the cut at 32
        kept = 0
        for seq in seqs:
            present = set(seq.word_ids[seq.word_ids >= 0].tolist())
            kept += sum(w in present and int(h) in present for w, h in enumerate(seq.word_head))
        assert expected["count"].iloc[0] == kept < sum(len(words) for _, words in sentences)


def test_sas_margin_csv_equals_the_margins_of_each_checkpoint_scored_directly(tracked, run_dir, tmp_path):
    out, _, conllu = tracked
    table = pd.read_csv(out / tracking.SAS_MARGIN_CSV)
    assert list(table.columns) == ["step", *depattn.MARGIN_COLUMNS] and sorted(pd.unique(table["step"])) == list(STEPS)
    sentences = read_conllu(conllu, limit=SAS_N)
    seqs = encode_batch(load_tokenizer(run_dir), [(t,) for t, _ in sentences], [(w,) for _, w in sentences], 32)
    for step in STEPS:
        counts = sas.score_sas(from_pretrained(run_dir, step=step), seqs, 8, 32)
        assert counts.sentences == SAS_N
        # The run's --bootstrap and --bootstrap-seed (their defaults), through the same CSV writer.
        depattn.sas_against_offsets(counts, 0, 1000).to_csv(tmp_path / "expected.csv", index=False)
        rows = table[table["step"] == step].drop(columns="step").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, pd.read_csv(tmp_path / "expected.csv"), check_exact=True)
    line = tracking.margin_line(table)
    for row in table[table["relation"] == "all"].itertuples():
        verdict = "beats" if row.beats_offsets else "does not beat"
        assert f"{row.step}: {row.margin:+.3f} [{row.low:+.3f}, {row.high:+.3f}] {verdict}" in line


def test_a_sas_entry_without_per_sentence_counts_is_computed_again(tracked, tmp_path):
    # An entry of the format before per-sentence counts, found under a current name: read_cached
    # reports it and the step is computed again, as for any entry it cannot read whole.
    out, _, _ = tracked
    (entry, *_) = (out.parent / f"{out.name}.cache").glob("sas-*.npz")
    assert tracking.read_cached(entry, tracking.load_sas) is not None
    with np.load(entry) as stored:
        old = {k: stored[k] for k in stored.files if "sentence" not in k}
    np.savez(tmp_path / entry.name, **old)
    assert tracking.read_cached(tmp_path / entry.name, tracking.load_sas) is None


def test_curve_onsets_and_the_onset_figure(tracked):
    out, _, _ = tracked
    curves = pd.read_csv(out / onset.CURVE_ONSETS_CSV)
    assert list(curves.columns) == onset.CURVE_COLUMNS
    assert curves["curve"].tolist() == [
        "heldout_mlm_loss",
        "heldout_mlm_accuracy",
        "sas",
        "heads:prev",
        "heads:next",
        "heads:cls",
    ]
    loss = curves.set_index("curve").loc["heldout_mlm_loss"]
    # Read at its 14 evaluations, not the 3 checkpoints: the drop begins at the kink, step 8, which
    # the last flat or the first steep segment may hold; its interval holds the kink.
    assert loss["points"] == 14 and loss["reference"]
    assert loss["changepoint_step"] in (8, 10) and loss["changepoint_low"] <= 8 <= loss["changepoint_high"]
    assert loss["slope_per_efold"] == pytest.approx(-3.0, rel=0.05)
    assert (out / "mrpc_onset.png").is_file()
    run = json.loads((out / "run.json").read_text())
    assert run["sas"]["sentences"] == SAS_N and run["sas"]["computed_steps"] == list(STEPS)


def test_a_rerun_takes_the_sas_from_the_cache(tracked, monkeypatch, tmp_path):
    out, argv, _ = tracked
    monkeypatch.setattr(tracking.sas_lib, "score_sas", lambda *a: pytest.fail("SAS computed again"))
    monkeypatch.setattr(tracking, "from_pretrained", lambda *a, **k: pytest.fail("a checkpoint loaded again"))
    cache = out.parent / f"{out.name}.cache"
    track.main([*argv, "--out", str(tmp_path / "again"), "--scores-cache", str(cache), "--no-figures"])
    for name in (tracking.SAS_CSV, tracking.SAS_MARGIN_CSV):  # the per-sentence counts come back too
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "again" / name), pd.read_csv(out / name), check_exact=True)


def test_a_missing_conllu_is_one_line(run_dir, tmp_path, cli_error):
    message = cli_error(
        track.main, ["--run", str(run_dir), "--out", str(tmp_path / "o"), "--sas", str(tmp_path / "x.conllu")]
    )
    assert "x.conllu" in message and not (tmp_path / "o").exists()


class _Loading(Exception):
    pass


def test_the_documented_chen_command_runs_up_to_loading(shared_data, tmp_path, monkeypatch):
    """docs/tracking.md's command over Chen et al.'s hub checkpoints, run as written from a folder
    that holds tiny stand-ins at those hub ids' paths (a local path wins over the hub) and sees the
    shared data at ../shared/data; it stops when the first checkpoint is loaded for scoring."""
    from test_track_series import write_hf

    page = (Path(__file__).parents[1] / "docs" / "tracking.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(python -m analysis\.track --ckpt \"angie-chen55/.*?)```", page, re.DOTALL).group(1)
    argv = shlex.split(block.replace("\\\n", " "))[3:]
    pattern = argv[argv.index("--ckpt") + 1]
    steps = argv[argv.index("--steps") + 1].split(",")
    work = tmp_path / "work"
    for seed, step in enumerate(steps):
        write_hf(work / pattern.format(step=step), shared_data, seed=seed)
    (tmp_path / "shared").symlink_to(shared_data.parent)
    monkeypatch.chdir(work)
    loaded = []

    def loading(source, **options):
        loaded.append(source.path)
        raise _Loading

    monkeypatch.setattr(tracking, "from_pretrained", loading)
    with pytest.raises(_Loading):
        track.main(argv)
    assert [p.resolve() for p in loaded] == [work / pattern.format(step=steps[0])]


def test_a_sas_entry_copied_to_another_steps_name_is_computed_again(tracked, tmp_path, caplog):
    # Issue 42, 5.1: the SAS cache gets the scores cache's identity check (what the entry stored
    # against the step, checkpoint files and settings its name stands for).
    out, argv, _ = tracked
    cache = tmp_path / "cache"
    shutil.copytree(out.parent / f"{out.name}.cache", cache)
    (first,) = cache.glob(f"sas-{STEPS[0]:09d}-*.npz")
    (last,) = cache.glob(f"sas-{STEPS[-1]:09d}-*.npz")
    shutil.copyfile(first, last)
    track.main([*argv, "--out", str(tmp_path / "again"), "--scores-cache", str(cache), "--no-figures"])
    assert f"{last} holds scores of other checkpoint" in caplog.text
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "again" / tracking.SAS_CSV), pd.read_csv(out / tracking.SAS_CSV), check_exact=True
    )
