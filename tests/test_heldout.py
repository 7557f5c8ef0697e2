"""Held-out MLM/NSP metrics at every checkpoint of a pre-training run, the per-sequence sums
behind them, and resized presets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import bertjax
from analysis.common.heldout import read_heldout_sequences, resampled_curves
from bertjax.errors import UserError
from train import pretrain
from train.corpora import CorpusConfig
from train.data import PretrainingData
from train.heldout import SEQUENCES_DIR, check_disjoint
from train.instances import MaskingSpec, mask_batch
from train.losses import batch_sums, pretraining_loss, pretraining_terms, sequence_sums

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
        # Fast enough that the model predicts some held-out masked tokens by step 3 (in 3 runs of
        # 3; the trained vocabulary varies from run to run), so the recorded hits are not all 0.
        "optimizer.learning_rate": "0.1",
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


U = 2.0**-24  # float32's unit roundoff


def test_the_sequence_sums_are_each_sequences_own_and_add_up_to_the_batch_sums():
    """`sequence_sums` against a float64 loop over each sequence's masked slots, on a random model,
    with a correct prediction planted in every sequence (a fresh model predicts none)."""
    vocab, length, predictions, (pad, cls, sep, mask) = 101, 16, 4, (0, 2, 3, 4)
    model = bertjax.init_model(bertjax.preset("tiny", vocab_size=vocab, hidden_size=32, num_attention_heads=2,
                                              intermediate_size=64, max_position_embeddings=length),
                               bertjax.BertForPreTraining, seed=0)  # fmt: skip
    model.eval()
    rng = np.random.default_rng(0)
    lengths = np.array([16, 12, 9, 7])
    input_ids = np.where(np.arange(length) < lengths[:, None], rng.integers(5, vocab, (4, length)), pad)
    input_ids[:, 0], input_ids[np.arange(4), lengths - 1] = cls, sep
    spec = MaskingSpec(vocab, mask, (cls, sep, pad), masked_lm_prob=0.3, max_predictions=predictions)
    batch = mask_batch(input_ids.astype(np.int32), lengths, spec, rng)
    batch |= {"attention_mask": (np.arange(length) < lengths[:, None]).astype(np.int32),
              "token_type_ids": np.zeros((4, length), np.int32), "nsp_labels": np.array([0, 1, 1, 0], np.int32)}  # fmt: skip
    weights = batch["masked_weights"]
    assert weights.min() == 0 and weights.sum(axis=1).min() >= 1, "padding predictions and real ones"
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                masked_positions=batch["masked_positions"])  # fmt: skip
    logits = np.asarray(out.prediction_logits, np.float64)
    batch["masked_ids"][:, 0] = logits[:, 0].argmax(-1)  # slot 0 is a real prediction in every row

    per = jax.tree.map(np.asarray, sequence_sums(pretraining_terms(model, batch)))
    lse = np.log(np.exp(logits).sum(-1))
    pair = np.asarray(out.seq_relationship_logits, np.float64)
    for row in range(4):
        slots = [p for p in range(predictions) if weights[row, p]]
        labels = batch["masked_ids"][row]
        assert per["masked"][row] == len(slots)
        assert per["mlm_hits"][row] == sum(logits[row, p].argmax() == labels[p] for p in slots) >= 1
        # Each float32 cross-entropy: a log-sum-exp of V exponentials (≤ (V + 4) u of 1 + |lse|),
        # then P of them summed. Leaving out one slot moves the sum by its ~4.6.
        atol = predictions * (vocab + 4 + predictions) * U * (1 + np.abs(lse[row]).max())
        expected = sum(lse[row, p] - logits[row, p, labels[p]] for p in slots)
        np.testing.assert_allclose(per["mlm_loss"][row], expected, rtol=0, atol=atol)
        label = batch["nsp_labels"][row]
        np.testing.assert_allclose(per["pair_loss"][row], np.log(np.exp(pair[row]).sum()) - pair[row, label],
                                   rtol=0, atol=6 * U * (1 + np.abs(pair[row]).max()))  # fmt: skip
        assert per["pair_hits"][row] == (pair[row].argmax() == label)
    totals = jax.tree.map(np.asarray, batch_sums(pretraining_terms(model, batch)))
    assert totals["sequences"] == 4
    for name in ("masked", "mlm_hits", "pair_hits"):
        assert totals[name] == per[name].sum(), name
    # Both float32 sums of the same 16 non-negative terms, in two orders.
    np.testing.assert_allclose(totals["mlm_loss"], per["mlm_loss"].sum(), rtol=2 * 16 * U)


@pytest.mark.slow  # the `heldout_run` fixture, when run alone
def test_each_evaluation_records_its_sequences_sums_which_add_up_to_its_metrics(heldout_run):
    seqs = read_heldout_sequences(heldout_run)
    rows = _heldout_rows(heldout_run)
    assert seqs.steps.tolist() == sorted(rows) == [1, 3, 6]
    assert seqs.loss.shape == seqs.hits.shape == seqs.pair_loss.shape == (3, 16) and seqs.masked.shape == (16,)
    with np.load(heldout_run / SEQUENCES_DIR / "step-000000006.npz") as stored:
        assert {name: str(stored[name].dtype) for name in stored.files} == {
            "mlm_loss": "float32", "mlm_hits": "int32", "masked": "int32", "pair_loss": "float32", "pair_hits": "int32",
        }  # fmt: skip
    loss, accuracy = resampled_curves(seqs, np.ones((1, 16)))
    metric = np.array([rows[step]["heldout_mlm_loss"] for step in seqs.steps])
    # The same 16 × 10 masked cross-entropies (≥ 0), summed in float32 per batch of B·P = 80 for the
    # metrics and per sequence of P = 10 for the files: relative errors ≤ 79 u and 9 u; the terms
    # themselves, evaluated in two fusions of one program, may differ by a few u (measured: ≤ 3.5 u
    # of the total). A dropped sequence moves the mean by 1/15 of its distance from it: at every
    # evaluation the bound sees the drop of the sequence farthest from the mean (a given one may sit
    # near it at some step: the first sequence, at step 3, moved it by 5e-5 in a CI run).
    rtol = (80 + 10 + 8) * U
    np.testing.assert_allclose(loss[0], metric, rtol=rtol)
    dropped, _ = resampled_curves(seqs, 1.0 - np.eye(16))
    assert (np.abs(dropped / metric - 1).max(axis=0) > 10 * rtol).all()
    # Counts: exact integers in float32, so the ratios are the metrics' own.
    assert accuracy[0].tolist() == [rows[step]["heldout_mlm_accuracy"] for step in seqs.steps]
    assert (seqs.pair_hits.mean(axis=1)).tolist() == [rows[step]["heldout_nsp_accuracy"] for step in seqs.steps]
    # 8 pair losses per batch sum: ≤ 7 u, and the terms' own few u.
    np.testing.assert_allclose(seqs.pair_loss.mean(axis=1), [rows[s]["heldout_nsp_loss"] for s in seqs.steps],
                               rtol=(8 + 8) * U)  # fmt: skip


@pytest.mark.slow  # the `heldout_run` fixture, when run alone
def test_the_recorded_sums_are_each_fixed_heldout_sequences_own_in_order(heldout_run):
    """Recomputed per sequence from each checkpoint on the held-out batches, in their order: the
    files hold the same sequences at every evaluation, so that resampling them pairs across steps."""
    data = PretrainingData(heldout_run / "heldout-T64", 8, seed=0, process_index=0, process_count=1, epochs=1)
    batches = [jax.tree.map(np.asarray, next(data)) for _ in range(2)]
    seqs = read_heldout_sequences(heldout_run)
    for row, step in enumerate(seqs.steps):
        model = bertjax.from_pretrained(heldout_run, bertjax.BertForPreTraining, step=int(step))
        model.eval()
        sums = [sequence_sums(pretraining_terms(model, batch)) for batch in batches]
        recomputed = {name: np.concatenate([np.asarray(s[name]) for s in sums]) for name in sums[0]}
        np.testing.assert_array_equal(seqs.masked, recomputed["masked"])
        np.testing.assert_array_equal(seqs.hits[row], recomputed["mlm_hits"])
        np.testing.assert_array_equal(seqs.pair_hits[row], recomputed["pair_hits"])
        # Another XLA program's float32 forward pass: as the batch means above, 1e-5 relative.
        np.testing.assert_allclose(seqs.loss[row], recomputed["mlm_loss"], rtol=1e-5)
        np.testing.assert_allclose(seqs.pair_loss[row], recomputed["pair_loss"], rtol=1e-5)


@pytest.mark.slow  # re-trains steps 4 to 6 in a subprocess
def test_a_resumed_run_replaces_the_files_of_the_steps_it_evaluates_again(heldout_run, tmp_path):
    """Killed after evaluating step 6 but before its checkpoint: the resume from step 3 evaluates
    step 6 again, and its file is the new evaluation's, written whole."""
    workdir = tmp_path / "run"
    # The training shards by link: the held-out shards' settings name their vocabulary's real path.
    shutil.copytree(heldout_run, workdir, symlinks=True, ignore=shutil.ignore_patterns("data-T64"))
    (workdir / "data-T64").symlink_to(heldout_run / "data-T64")
    shutil.rmtree(workdir / "checkpoints" / "6")
    recorded = workdir / SEQUENCES_DIR / "step-000000006.npz"
    shutil.copyfile(workdir / SEQUENCES_DIR / "step-000000001.npz", recorded)  # what step 6 is not
    command = [sys.executable, "-m", "train.pretrain", "--config", str(workdir / "config.yaml"),
               "--workdir", str(workdir)]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT, timeout=600, capture_output=True)
    resumed, original = read_heldout_sequences(workdir), read_heldout_sequences(heldout_run)
    assert resumed.steps.tolist() == [1, 3, 6]
    for name in ("loss", "hits", "masked", "pair_loss", "pair_hits"):
        np.testing.assert_array_equal(getattr(resumed, name), getattr(original, name), err_msg=name)
    assert not np.array_equal(resumed.loss[2], resumed.loss[0])
    assert sorted(p.name for p in (workdir / SEQUENCES_DIR).iterdir()) == [
        "step-000000001.npz", "step-000000003.npz", "step-000000006.npz",
    ]  # fmt: skip


SHARDED_EVALUATION = r"""
import sys, jax, numpy as np
from pathlib import Path
from bertjax import sharding
from bertjax.model import BertForPreTraining
from train.checkpoints import CheckpointConfig
from train.config import HeldOutConfig
from train.heldout import HeldOutEvaluator
from train.losses import pretraining_loss
from train.optim import OptimizerConfig
from train.pretrain import ModelSettings, model_config
from train.trainer import LoopConfig, Trainer

assert jax.device_count() == 8
heldout_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
config = model_config(ModelSettings(max_position_embeddings=64, hidden_size=64), 1000)
for name, devices, data, fsdp in (("single", jax.devices()[:1], 1, 1), ("sharded", jax.devices(), 2, 4)):
    trainer = Trainer(workdir=work / name, model_config=config, model_cls=BertForPreTraining, loss_fn=pretraining_loss,
                      optimizer=OptimizerConfig(), loop=LoopConfig(steps=1, global_batch_size=8),
                      checkpoint=CheckpointConfig(every=0),
                      mesh=sharding.make_mesh(sharding.MeshConfig(data, fsdp), devices), run_config={}, tokenizer="tokenizer")
    state, _ = trainer.restore_or_init()
    HeldOutEvaluator(HeldOutConfig(sequences=16, batch_size=8), heldout_dir, trainer)(7, state["params"])
"""


@pytest.mark.slow  # two evaluators compiled in a subprocess with 8 fake devices
def test_a_sharded_evaluation_records_the_sequences_of_a_single_device_one(heldout_run, fake_devices, tmp_path):
    """Over a data × fsdp = 2 × 4 mesh the per-sequence sums ([batch], sharded over the devices in
    the forward pass) come back whole and in the batch's order."""
    fake_devices(SHARDED_EVALUATION, str(heldout_run / "heldout-T64"), str(tmp_path), timeout=300)
    single, sharded = (read_heldout_sequences(tmp_path / name) for name in ("single", "sharded"))
    assert single.steps.tolist() == sharded.steps.tolist() == [7] and single.loss.shape == (1, 16)
    np.testing.assert_array_equal(sharded.masked, single.masked)
    np.testing.assert_array_equal(sharded.pair_hits, single.pair_hits)
    np.testing.assert_array_equal(sharded.hits, single.hits)
    # The same float32 forward pass with its contractions split over 4 devices: 1e-5, as above.
    np.testing.assert_allclose(sharded.loss, single.loss, rtol=1e-5)
    np.testing.assert_allclose(sharded.pair_loss, single.pair_loss, rtol=1e-5)

    # A misordering fails one of the above: any two sequences differ by more than that tolerance in
    # their MLM or NSP loss, or in a count compared exactly. (The MLM loss alone does not always
    # tell two apart: the held-out sequences follow the fixture's trained vocabulary, which varies
    # from run to run, and one run had two within 9.7e-6 of each other.)
    def apart(values: np.ndarray, rtol: float = 1e-5) -> np.ndarray:
        return np.abs(values[0][:, None] / values[0][None] - 1) > rtol

    def differ(counts: np.ndarray) -> np.ndarray:
        return counts[..., :, None] != counts[..., None, :]

    told_apart = apart(single.loss) | apart(single.pair_loss) | differ(single.masked)
    told_apart |= differ(single.hits[0]) | differ(single.pair_hits[0])
    assert told_apart[~np.eye(16, dtype=bool)].all()


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
