"""`heldout.data_dir`: runs of other recipes (MLM only, MLM + NSP) scored on one prepared held-out
set, checked for the run's vocabulary and length (issue 48)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_pretrain_checks import _refused, write_micro

from bertjax import checkpoint as ckpt
from train import prepare, pretrain
from train.heldout import SEQUENCES_DIR

MLM_ONLY_NOTE = "only the held-out MLM loss and accuracy are evaluated on it"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """An MLM-only run's shards and held-out folder, prepared once (`--prepare-only`) for every
    run here, as benchmarks/emergence_seeds.sh prepares them for its recipes."""
    root = tmp_path_factory.mktemp("shared_heldout")
    config = write_micro(root)
    held = f"[{{name: held, source: local, path: {root / 'text' / 'heldout.txt'}, kind: plain}}]"
    pretrain.main(["--config", str(config), "--workdir", str(root / "prep"), "--prepare-only",
                   "data.pair_task=none", f"heldout.corpora={held}", "heldout.sequences=16", "heldout.batch_size=8"])  # fmt: skip
    return root


def _run(prepared: Path, name: str, *overrides: str) -> Path:
    workdir = prepared / name
    # A learning rate of 0 keeps the initial weights (the same for both: same seed, same
    # vocabulary size), so the two runs' held-out terms at their one step can be compared exactly.
    pretrain.main(["--config", str(prepared / "micro.yaml"), "--workdir", str(workdir), "train.steps=1",
                   "optimizer.learning_rate=0.0", "heldout.sequences=16", "heldout.batch_size=8",
                   f"heldout.data_dir={prepared / 'prep' / 'heldout-T32'}", *overrides])  # fmt: skip
    return workdir


def _heldout_row(workdir: Path) -> dict:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    (row,) = [row for row in rows if "heldout_mlm_loss" in row]
    return row


@pytest.mark.slow  # two micro pre-trainings and a preparation: ~30 s of CPU
def test_an_nsp_run_and_an_mlm_run_score_the_same_heldout_sequences_alike(prepared, caplog):
    caplog.set_level(logging.INFO, logger="train.heldout")
    data = prepared / "prep" / "data-T32"
    mlm = _run(prepared, "mlm", "data.pair_task=none", f"data_dir={data}")
    assert MLM_ONLY_NOTE not in caplog.text
    nsp = _run(prepared, "nsp", "data.pair_task=nsp", "data.train_vocab=false", f"data.vocab_file={data / 'vocab.txt'}")
    assert caplog.text.count(MLM_ONLY_NOTE) == 1
    assert (nsp / "data-T32").is_dir() and not (nsp / "heldout-T32").exists() and not (mlm / "heldout-T32").exists()

    rows = {run.name: _heldout_row(run) for run in (mlm, nsp)}
    assert rows["mlm"]["step"] == rows["nsp"]["step"] == 1
    assert rows["mlm"]["heldout_sequences"] == rows["nsp"]["heldout_sequences"] == 16
    # The NSP run is not scored on the MLM-only set's pair labels: they are no NSP task.
    assert not any(key.startswith("heldout_nsp") for key in rows["nsp"])
    assert rows["mlm"]["heldout_mlm_loss"] == rows["nsp"]["heldout_mlm_loss"]
    assert rows["mlm"]["heldout_mlm_accuracy"] == rows["nsp"]["heldout_mlm_accuracy"]
    sums = {}
    for run in (mlm, nsp):
        with np.load(run / SEQUENCES_DIR / "step-000000001.npz") as stored:
            sums[run.name] = dict(stored)
    assert sorted(sums["nsp"]) == sorted(sums["mlm"]) == ["masked", "mlm_hits", "mlm_loss"]
    for key in ("masked", "mlm_hits", "mlm_loss"):
        np.testing.assert_array_equal(sums["nsp"][key], sums["mlm"][key], err_msg=key)
    assert sums["mlm"]["masked"].shape == (16,) and sums["mlm"]["masked"].min() > 0

    # Recorded as the resolved config is, and in the checkpoint a resume is checked against.
    folder = str(prepared / "prep" / "heldout-T32")
    assert json.loads((nsp / "run.json").read_text())["config"]["heldout"]["data_dir"] == folder
    assert f"data_dir: {folder}" in (nsp / "config.yaml").read_text()
    assert ckpt.read_meta(nsp / ckpt.CHECKPOINTS, 1)["run_config"]["heldout"]["data_dir"] == folder


def test_a_heldout_folder_of_another_length_or_vocabulary_is_refused(prepared, tmp_path, cli_error):
    folder, data = prepared / "prep" / "heldout-T32", prepared / "prep" / "data-T32"
    shorter = tmp_path / "heldout-T24"
    held = f"[{{name: held, source: local, path: {prepared / 'text' / 'heldout.txt'}, kind: plain}}]"
    prepare.main(["--out", str(shorter), f"corpora={held}", f"vocab_file={data / 'vocab.txt'}", "max_seq_length=24",
                  "max_predictions_per_seq=4", "pair_task=none", "segmenter=sentencizer", "short_seq_prob=0.0"])  # fmt: skip
    message = _refused(cli_error, prepared / "micro.yaml", tmp_path / "w1", f"data_dir={data}",
                       "data.pair_task=none", f"heldout.data_dir={shorter}")  # fmt: skip
    assert message == (
        f"error: heldout.data_dir: {shorter} was prepared at max_seq_length 24, the run trains at 32; "
        "give it a held-out folder prepared at 32"
    )

    other = tmp_path / "other-vocab"
    shutil.copytree(folder, other)
    with open(other / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("zzzz\n")
    message = _refused(cli_error, prepared / "micro.yaml", tmp_path / "w2", f"data_dir={data}",
                       "data.pair_task=none", f"heldout.data_dir={other}")  # fmt: skip
    assert message == (
        f"error: heldout.data_dir: {other} was prepared with another vocabulary than the run's "
        f"{data / 'vocab.txt'}; prepare it with vocab_file={data / 'vocab.txt'}"
    )


def test_a_heldout_folder_and_heldout_corpora_together_are_refused(prepared, tmp_path, cli_error):
    held = f"[{{name: held, source: local, path: {prepared / 'text' / 'heldout.txt'}, kind: plain}}]"
    message = _refused(cli_error, prepared / "micro.yaml", tmp_path / "w",
                       f"heldout.data_dir={prepared / 'prep' / 'heldout-T32'}", f"heldout.corpora={held}")  # fmt: skip
    assert message == (
        "error: heldout.data_dir and heldout.corpora: set one, not both (a prepared folder, or corpora to "
        "prepare; heldout.corpora=[] clears a config's corpora)"
    )


def test_a_heldout_folder_of_text_the_run_trains_on_is_refused(prepared, tmp_path, cli_error):
    """The training text copied elsewhere (another path, the same content) and prepared as a
    held-out folder: found by its digest, which a check of paths would miss."""
    data = prepared / "prep" / "data-T32"
    copy = tmp_path / "elsewhere" / "copy.txt"
    copy.parent.mkdir()
    shutil.copyfile(prepared / "text" / "train.txt", copy)
    folder = tmp_path / "heldout-T32"
    held = f"[{{name: held, source: local, path: {copy}, kind: plain}}]"
    prepare.main(["--out", str(folder), f"corpora={held}", f"vocab_file={data / 'vocab.txt'}", "max_seq_length=32",
                  "max_predictions_per_seq=5", "pair_task=none", "segmenter=sentencizer", "short_seq_prob=0.0"])  # fmt: skip
    message = _refused(cli_error, prepared / "micro.yaml", tmp_path / "w", f"data_dir={data}",
                       "data.pair_task=none", f"heldout.data_dir={folder}")  # fmt: skip
    assert message == (
        f"error: heldout.data_dir: {folder} holds text the run trains on: {copy} has the content of the "
        f"training file {prepared / 'text' / 'train.txt'}"
    )


def test_shared_sources_finds_files_by_content_and_hub_corpora_by_id():
    from train.heldout import shared_sources

    def local(*files):
        return {"source": "local", "hub_id": None, "hub_config": None, "split": "train",
                "files": [{"path": p, "sha256": d} for p, d in files]}  # fmt: skip

    hub = {"source": "hub", "hub_id": "wikimedia/wikipedia", "hub_config": "20231101.en", "split": "train"}
    trained = {"corpora": [local(("/a/train.txt", "d1"), ("/a/more.txt", "d2")), hub]}
    assert shared_sources({"corpora": [local(("/b/held.txt", "d3"))]}, trained) == []
    assert shared_sources({"corpora": [local(("/b/x.txt", "d3"), ("/b/y.txt", "d2"))]}, trained) == [
        "/b/y.txt has the content of the training file /a/more.txt"
    ]
    assert shared_sources({"corpora": [hub]}, trained) == ["wikimedia/wikipedia train is also a training corpus"]
    # Another split of the same hub dataset is not the training text.
    assert shared_sources({"corpora": [hub | {"split": "validation"}]}, trained) == []
