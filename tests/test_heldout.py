"""Held-out MLM/NSP metrics at every checkpoint of a pre-training run, and resized presets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import bertjax
from bertjax.errors import UserError
from train import pretrain
from train.corpora import CorpusConfig
from train.data import PretrainingData
from train.heldout import check_disjoint
from train.losses import pretraining_loss

ROOT = Path(__file__).resolve().parents[1]
TRAIN_BOOKS = ("carroll-alice.txt", "shakespeare-caesar.txt")
HELDOUT_BOOK = "blake-poems.txt"


@pytest.fixture(scope="module")
def heldout_run(shared_data, tmp_path_factory) -> Path:
    """Two books trained on, a third held out; checkpoints at steps 1, 3 and 6."""
    train_dir = tmp_path_factory.mktemp("train_books")
    for name in TRAIN_BOOKS:
        (train_dir / name).symlink_to(shared_data / "gutenberg" / name)
    heldout_dir = tmp_path_factory.mktemp("heldout_books")
    (heldout_dir / HELDOUT_BOOK).symlink_to(shared_data / "gutenberg" / HELDOUT_BOOK)
    workdir = tmp_path_factory.mktemp("heldout_run") / "run"
    settings = {
        "data.corpora": f"[{{name: books, source: local, path: {train_dir}, kind: gutenberg}}]",
        "heldout.corpora": f"[{{name: poems, source: local, path: {heldout_dir}, kind: gutenberg}}]",
        "heldout.sequences": "16",
        "heldout.batch_size": "8",
        "data.train_vocab": "true",
        "data.vocab_size": "1000",
        "data.max_seq_length": "64",
        "data.max_predictions_per_seq": "10",
        "model.max_position_embeddings": "64",
        "model.hidden_size": "64",
        "train.steps": "6",
        "train.global_batch_size": "8",
        "train.log_every": "2",
        "optimizer.warmup_steps": "2",
        "checkpoint.every": "0",
        "checkpoint.keep": "null",
        "checkpoint.log_spaced": "0",
        "checkpoint.steps": "[1,3]",
    }
    command = [sys.executable, "-m", "train.pretrain", "--config", str(ROOT / "configs/pretrain/tiny.yaml"),
               "--workdir", str(workdir), *(f"{k}={v}" for k, v in settings.items())]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT, timeout=600, capture_output=True)
    return workdir


def _heldout_rows(workdir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows if "heldout_mlm_loss" in row}


@pytest.mark.slow  # the `heldout_run` fixture pre-trains in a subprocess: ~33 s of CPU
def test_heldout_metrics_are_written_at_every_checkpoint(heldout_run):
    saved = sorted(int(p.name) for p in (heldout_run / "checkpoints").iterdir() if p.name.isdigit())
    rows = _heldout_rows(heldout_run)
    assert saved == [1, 3, 6] and sorted(rows) == saved
    for row in rows.values():
        assert row["heldout_sequences"] == 16
        assert 0 <= row["heldout_mlm_accuracy"] <= 1 and 0 <= row["heldout_nsp_accuracy"] <= 1
        assert np.isfinite(row["heldout_mlm_loss"]) and np.isfinite(row["heldout_nsp_loss"])
    run = json.loads((heldout_run / "run.json").read_text())
    assert run["timings_s"]["heldout_eval_s"] > 0


@pytest.mark.slow  # the `heldout_run` fixture, when run alone
def test_heldout_metrics_are_the_losses_of_the_fixed_heldout_batches(heldout_run):
    """Recomputed with the training loss on the same two batches of the held-out shards: the
    evaluator's sums over masked tokens divided by their count are the training loss's means
    weighted by each batch's masked count."""
    data = PretrainingData(heldout_run / "heldout-T64", 8, seed=0, process_index=0, process_count=1, epochs=1)
    batches = [next(data) for _ in range(2)]
    for step, row in _heldout_rows(heldout_run).items():
        model = bertjax.from_pretrained(heldout_run, bertjax.BertForPreTraining, step=step)
        model.eval()
        mlm, masked, nsp = 0.0, 0.0, 0.0
        for batch in batches:
            _, metrics = pretraining_loss(model, jax.tree.map(np.asarray, batch), None)
            weight = float(np.sum(batch["masked_weights"]))
            mlm += float(metrics["mlm_loss"]) * weight
            masked += weight
            nsp += float(metrics["nsp_loss"]) * 8
        # float32 sums of ≤ 160 masked cross-entropies each, evaluated by two XLA programs: 1e-5
        # relative is ~170 u, above their rounding.
        np.testing.assert_allclose(row["heldout_mlm_loss"], mlm / masked, rtol=1e-5)
        np.testing.assert_allclose(row["heldout_nsp_loss"], nsp / 16, rtol=1e-5)
        # Both batches were scored: their count, not their means (two batches' mean losses can agree
        # to 3e-6, as they once did in CI, so a dropped batch need not move the mean).
        assert row["heldout_sequences"] == 16


def test_heldout_text_is_not_trained_on(tmp_path):
    book = tmp_path / "books" / "a.txt"
    book.parent.mkdir()
    book.write_text("text")
    training = [CorpusConfig(name="books", source="local", path=str(book.parent))]
    for path in (book.parent, book, tmp_path):
        with pytest.raises(UserError, match="overlaps the training corpus"):
            check_disjoint([CorpusConfig(name="h", source="local", path=str(path))], training)
    other = tmp_path / "other"
    other.mkdir()
    check_disjoint([CorpusConfig(name="h", source="local", path=str(other))], training)
    hub = CorpusConfig(name="w", source="hub", hub_id="wikitext", hub_config="wikitext-2-raw-v1", split="test")
    with pytest.raises(UserError, match="is also a training corpus"):
        check_disjoint([hub], [hub])
    check_disjoint([CorpusConfig(**{**hub.__dict__, "split": "validation"})], [hub])


def test_a_preset_is_resized_by_the_model_settings():
    config = pretrain.model_config(pretrain.ModelSettings(preset="mini", hidden_size=128), vocab_size=1000)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (4, 128, 4)
    assert config.intermediate_size == 512
    with pytest.raises(UserError, match="hidden_size 130 is not divisible by num_attention_heads 4"):
        pretrain.model_config(pretrain.ModelSettings(preset="mini", hidden_size=130), vocab_size=1000)
    with pytest.raises(UserError, match=r"model\.num_hidden_layers: must be at least 1"):
        pretrain.model_config(pretrain.ModelSettings(preset="mini", num_hidden_layers=0), vocab_size=1000)
