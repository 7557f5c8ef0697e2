"""GLUE fine-tuning: the metrics against hand counts, the data iterator, best/last checkpoints,
eval.json, seeds, a bertjax pre-training checkpoint end to end, and the one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from transformers import BertTokenizerFast

import bertjax
from bertjax import glue
from bertjax.errors import UserError
from bertjax.glue import Example, encode, load_glue
from train import finetune
from train.checkpoints import CheckpointConfig, Checkpointer, setting_changes
from train.glue_data import ClassificationData, eval_batches

ROOT = Path(__file__).resolve().parents[1]
# A few dozen examples and short sequences keep a run to seconds; dev is evaluated in full.
QUICK = ["data.max_train_examples=48", "data.max_seq_length=64", "train.global_batch_size=8", "train.epochs=2",
         "train.log_every=2"]  # fmt: skip


def _tokenizer(shared_data: Path) -> BertTokenizerFast:
    # transformers 5 takes the vocabulary file as `vocab`; `vocab_file=` is ignored (5 tokens).
    return BertTokenizerFast(vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True)


def _hf_checkpoint(directory: Path, shared_data: Path, **config) -> Path:
    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128, **config), seed=1)
    bertjax.save_pretrained(model, directory)
    _tokenizer(shared_data).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, shared_data) -> Path:
    """A random 2-layer BERT, HF format, with bert-base-uncased's tokenizer."""
    return _hf_checkpoint(tmp_path_factory.mktemp("tiny_hf"), shared_data)


def _argv(task: str, init: Path, workdir: Path, glue_dir: Path, *extra: str) -> list[str]:
    return ["--task", task, "--ckpt", str(init), "--workdir", str(workdir), "--glue-dir", str(glue_dir), *QUICK, *extra]


@pytest.fixture(scope="module")
def mrpc_run(tiny_ckpt, shared_data, tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("mrpc")
    finetune.main(_argv("mrpc", tiny_ckpt, workdir, shared_data / "glue"))
    return workdir


# -- metrics -----------------------------------------------------------------------------------


def test_f1_and_accuracy_match_a_hand_count():
    labels = np.array([1, 1, 1, 0, 0, 1, 0, 1])
    predictions = np.array([1, 0, 1, 1, 0, 1, 0, 0])
    # TP = 3 (rows 0, 2, 5), FP = 1 (row 3), FN = 2 (rows 1, 7): precision 3/4, recall 3/5.
    precision, recall = 3 / 4, 3 / 5
    assert glue.f1(predictions, labels) == pytest.approx(2 * precision * recall / (precision + recall))
    assert glue.accuracy(predictions, labels) == 5 / 8
    assert glue.f1(np.zeros(4, int), np.array([1, 0, 1, 0])) == 0.0  # no positive predicted
    assert glue.f1(np.ones(3, int), np.ones(3, int)) == 1.0


def test_classification_metrics_use_argmax_and_mean_cross_entropy():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [0.5, 0.2]], np.float32)
    labels = np.array([0, 0, 0])
    scores = glue.classification_metrics(logits, labels, ("accuracy", "f1"))
    expected_loss = np.mean([-np.log(np.exp(r[0]) / np.exp(r).sum()) for r in logits.astype(np.float64)])
    assert scores["accuracy"] == 2 / 3 and scores["f1"] == 0.0
    assert scores["loss"] == pytest.approx(expected_loss, rel=1e-6)
    assert set(glue.classification_metrics(logits, labels, ("accuracy",))) == {"accuracy", "loss"}


# -- data --------------------------------------------------------------------------------------


def test_encode_truncates_pairs_longest_first(shared_data):
    tokenizer = _tokenizer(shared_data)
    examples = [Example(0, "a " * 20, "b c", 1), Example(1, "short one", "two words", 0)]
    arrays = encode(examples, tokenizer, 12, "test")
    assert arrays["input_ids"].shape == (2, 12) and arrays["input_ids"].dtype == np.int32
    a, b = tokenizer.convert_tokens_to_ids(["a", "b"])
    # Longest-first trims only the long segment A: [CLS] a×7 [SEP] b c [SEP].
    assert list(arrays["input_ids"][0]) == [101] + [a] * 7 + [102, b, tokenizer.convert_tokens_to_ids("c"), 102]
    assert list(arrays["token_type_ids"][0]) == [0] * 9 + [1] * 3
    assert arrays["attention_mask"][1].sum() == 7 and list(arrays["labels"]) == [1, 0]
    with pytest.raises(bertjax.UserError, match="has no label"):
        encode([Example(0, "x", None, None)], tokenizer, 8, "test split")


def _arrays(n: int) -> dict[str, np.ndarray]:
    ids = np.arange(n, dtype=np.int32)[:, None].repeat(4, axis=1)
    return {"input_ids": ids, "token_type_ids": ids * 0, "attention_mask": ids * 0 + 1, "labels": ids[:, 0] % 2}


def test_training_batches_are_epoch_permutations_and_resume_exactly():
    data = ClassificationData(_arrays(10), 4, seed=3)
    assert data.batches_per_epoch == 2  # the last 2 examples of each epoch are dropped
    epochs = [[next(data)["input_ids"][:, 0] for _ in range(2)] for _ in range(2)]
    for batches in epochs:
        seen = np.concatenate(batches)
        assert len(set(seen)) == 8 and set(seen) <= set(range(10))
    assert not np.array_equal(np.concatenate(epochs[0]), np.concatenate(epochs[1]))
    resumed = ClassificationData(_arrays(10), 4, seed=3, position={"epoch": 1, "index": 1})
    np.testing.assert_array_equal(next(resumed)["input_ids"][:, 0], epochs[1][1])
    assert resumed.position == {"epoch": 1, "index": 2}
    other_seed = ClassificationData(_arrays(10), 4, seed=4)
    assert not np.array_equal(next(other_seed)["input_ids"], epochs[0][0][:, None].repeat(4, 1))
    with pytest.raises(bertjax.UserError, match="exceeds the 10 training examples"):
        ClassificationData(_arrays(10), 16)


def _ragged_arrays(n: int, max_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    lengths = np.random.default_rng(seed).integers(3, max_len + 1, n)
    mask = (np.arange(max_len)[None, :] < lengths[:, None]).astype(np.int32)
    ids = (np.arange(n, dtype=np.int32)[:, None] + 1) * mask  # row i holds i + 1 on its real tokens
    labels = np.arange(n, dtype=np.int32) % 2
    return {"input_ids": ids, "token_type_ids": ids * 0, "attention_mask": mask, "labels": labels}


def test_length_grouped_batches_are_short_complete_and_resume_exactly():
    arrays = _ragged_arrays(500, 64)
    data = ClassificationData(arrays, 8, seed=1, group_by_length=True, pad_multiple=16)
    epoch = [next(data) for _ in range(data.batches_per_epoch)]
    rows = np.concatenate([b["input_ids"][:, 0] - 1 for b in epoch])
    assert len(set(rows)) == len(rows) == 496  # a permutation of all but the 4 that fill no batch
    for batch in epoch:
        real = batch["attention_mask"].sum(axis=1)
        length = batch["input_ids"].shape[1]
        assert length % 16 == 0 and real.max() <= length < real.max() + 16  # no real token is cut
        source_rows = batch["input_ids"][:, 0] - 1
        np.testing.assert_array_equal(batch["attention_mask"], arrays["attention_mask"][source_rows, :length])
    # Sorted groups make most batches much shorter than the fixed 64 positions.
    assert np.mean([b["input_ids"].shape[1] for b in epoch]) < 50
    resumed = ClassificationData(arrays, 8, seed=1, group_by_length=True, position={"epoch": 0, "index": 7})
    np.testing.assert_array_equal(next(resumed)["input_ids"], epoch[7]["input_ids"])
    # Two processes pad their halves of a global batch to the same length.
    halves = [ClassificationData(arrays, 8, seed=1, group_by_length=True, process_index=p, process_count=2)
              for p in (0, 1)]  # fmt: skip
    first = [next(h) for h in halves]
    assert first[0]["input_ids"].shape == first[1]["input_ids"].shape == (4, epoch[0]["input_ids"].shape[1])
    np.testing.assert_array_equal(np.concatenate([f["input_ids"] for f in first]), epoch[0]["input_ids"])


def test_eval_batches_cover_every_example_once_in_order():
    batches = list(eval_batches(_arrays(10), 4))
    assert len(batches) == 3 and all(b["input_ids"].shape == (4, 4) for b in batches)
    rows = np.concatenate([b["input_ids"][:, 0] for b in batches])
    assert list(rows[:10]) == list(range(10)) and list(rows[10:]) == [0, 0]
    halves = [list(eval_batches(_arrays(10), 4, process_index=p, process_count=2)) for p in (0, 1)]
    assert list(halves[1][0]["input_ids"][:, 0]) == [2, 3]


# -- checkpoints and outputs -------------------------------------------------------------------


def test_checkpointer_keeps_the_best_and_the_last(tmp_path):
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(every=1, keep=1, best_metric="eval_f1"), total_steps=4)
    params, meta = {"w": jnp.zeros(3)}, {"model_config": {}}
    for step, f1 in enumerate((0.5, 0.9, 0.7, 0.6), start=1):
        checkpointer.save(step, params, {"m": jnp.ones(2)}, {"step": step}, meta, {"eval_f1": f1})
    assert checkpointer.steps() == [2, 4]
    checkpointer.close()


def test_summary_takes_the_last_row_and_the_best_by_the_metric(tmp_path):
    rows = [{"step": 10, "f1": 0.8, "accuracy": 0.7}, {"step": 20, "f1": 0.9, "accuracy": 0.6},
            {"step": 30, "f1": 0.9, "accuracy": 0.8}, {"step": 30, "f1": 0.9, "accuracy": 0.8},
            {"step": 40, "f1": 0.85, "accuracy": 0.9}]  # fmt: skip
    (tmp_path / finetune.EVAL_ROWS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = finetune.summarise_evaluations(tmp_path, "f1")
    assert summary["step"] == 40 and summary["accuracy"] == 0.9
    assert summary["best"]["step"] == 30  # ties go to the later step, as orbax's BestN keeps
    assert finetune.summarise_evaluations(tmp_path, "accuracy")["best"]["step"] == 40
    with (tmp_path / finetune.EVAL_ROWS).open("a") as f:
        f.write('{"task": "mrpc", "split": "d')  # an append cut short
    with pytest.raises(UserError, match=r"eval\.jsonl:6: not a JSON row"):
        finetune.summarise_evaluations(tmp_path, "f1")


@pytest.mark.slow  # the `mrpc_run` fixture fine-tunes: ~37 s of CPU
def test_run_writes_eval_json_and_best_and_last_checkpoints(mrpc_run):
    summary = json.loads((mrpc_run / "eval.json").read_text())
    assert {"task", "split", "step", "epoch", "accuracy", "f1", "loss", "n_examples", "best", "best_metric"} <= set(
        summary
    )
    assert (summary["task"], summary["split"], summary["n_examples"], summary["best_metric"]) == (
        "mrpc",
        "dev",
        408,
        "f1",
    )
    assert summary["step"] == 12 and summary["epoch"] == 2  # 48 examples / 8 = 6 steps per epoch
    rows = [json.loads(line) for line in (mrpc_run / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [6, 12]
    best = max(rows, key=lambda r: (r["f1"], r["step"]))
    assert summary["best"] == best
    steps = sorted(int(p.name) for p in (mrpc_run / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == sorted({best["step"], 12})
    metrics = [json.loads(line) for line in (mrpc_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval_f1" in m] == [6, 12]
    assert any("loss" in m and "accuracy" in m for m in metrics)
    run = json.loads((mrpc_run / "run.json").read_text())
    assert run["steps"] == 12 and run["warmup_steps"] == 1 and run["eval"] == summary


@pytest.mark.slow  # the `mrpc_run` fixture, when run alone
def test_a_rerun_with_other_settings_is_refused_before_anything_is_written(
    mrpc_run, tiny_ckpt, shared_data, tmp_path, cli_error
):
    """Another seed would have gone on from the finished run's last step under a new schedule."""
    workdir = tmp_path / "copy"
    shutil.copytree(mrpc_run, workdir)
    before = (workdir / "config.yaml").read_bytes()
    message = cli_error(finetune.main, _argv("mrpc", tiny_ckpt, workdir, shared_data / "glue", "train.seed=7"))
    assert "was trained with other settings (train.seed: 0 vs 7)" in message and "use a new --workdir" in message
    assert (workdir / "config.yaml").read_bytes() == before
    # How a run logs or spreads over devices may change on a resume.
    assert setting_changes({"train": {"seed": 0, "log_every": 5}, "mesh": {"data": 1}},
                           {"train": {"seed": 0, "log_every": 50}, "mesh": {"data": 8}}) == []  # fmt: skip
    assert setting_changes({"corpora": [{"weight": 1}]}, {"corpora": [{"weight": 2}]}) == [
        "corpora: [{'weight': 1}] vs [{'weight': 2}]"
    ]


@pytest.mark.slow  # the `mrpc_run` fixture, when run alone
def test_checkpoints_load_for_analysis(mrpc_run, tiny_ckpt, shared_data):
    summary = json.loads((mrpc_run / "eval.json").read_text())
    last = bertjax.from_pretrained(mrpc_run, "BertForSequenceClassification")
    best = bertjax.from_pretrained(mrpc_run, "BertForSequenceClassification", step=summary["best"]["step"])
    assert last.config.num_labels == 2 and best.classifier.kernel.shape == (128, 2)
    start = bertjax.from_pretrained(tiny_ckpt)
    assert not np.allclose(last.bert.pooler.dense.kernel[...], start.pooler.dense.kernel[...])  # it trained
    assert bertjax.from_pretrained(mrpc_run) is not None  # the bare encoder, as analysis.roles loads it
    assert len(bertjax.load_tokenizer(mrpc_run)) == 30522
    # The saved model reproduces the last evaluation.
    examples = load_glue("mrpc", "dev", shared_data / "glue")
    arrays = encode(examples, bertjax.load_tokenizer(mrpc_run), 64, "dev")
    logits = last(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"]).logits
    scores = glue.classification_metrics(np.asarray(logits), arrays["labels"], ("accuracy", "f1"))
    assert scores["accuracy"] == pytest.approx(summary["accuracy"]) and scores["f1"] == pytest.approx(summary["f1"])


@pytest.mark.slow  # the `mrpc_run` fixture, when run alone
def test_rerunning_a_finished_run_changes_nothing(mrpc_run, tiny_ckpt, shared_data):
    before = (mrpc_run / "eval.json").read_text()
    finetune.main(_argv("mrpc", tiny_ckpt, mrpc_run, shared_data / "glue"))
    assert (mrpc_run / "eval.json").read_text() == before
    assert len((mrpc_run / "eval.jsonl").read_text().splitlines()) == 2


def test_seed_summary_is_mean_and_sample_std():
    runs = [{"task": "mrpc", "split": "dev", "n_examples": 408, "best_metric": "f1", "step": 30, "accuracy": a,
             "f1": f, "loss": 0.5, "best": {"step": 20, "accuracy": a - 0.1, "f1": f + 0.1, "loss": 0.4}}
            for a, f in ((0.8, 0.85), (0.7, 0.80), (0.9, 0.90))]  # fmt: skip
    summary = finetune.summarise_seeds("mrpc", [0, 1, 2], runs)
    assert summary["last"]["f1"]["mean"] == pytest.approx(0.85)
    assert summary["last"]["accuracy"]["std"] == pytest.approx(0.1)  # sample SD (ddof 1) of .8, .7, .9
    assert summary["best"]["f1"]["values"] == pytest.approx([0.95, 0.9, 1.0])
    line = finetune.describe(summary)
    assert line.startswith(
        "mrpc dev (408 examples) over seeds [0, 1, 2]: last accuracy 0.8000 ± 0.1000, last f1 0.8500"
    )


@pytest.mark.slow
def test_seeds_run_one_workdir_each(tiny_ckpt, shared_data, tmp_path, capsys):
    finetune.main(
        _argv("sst2", tiny_ckpt, tmp_path, shared_data / "glue", "--seeds", "2", "train.epochs=1", "train.seed=5")
    )
    summary = json.loads((tmp_path / "seeds.json").read_text())
    assert summary["seeds"] == [5, 6] and summary["task"] == "sst2" and summary["n_examples"] == 872
    runs = [json.loads((tmp_path / f"seed-{s}" / "eval.json").read_text()) for s in (5, 6)]
    values = [r["accuracy"] for r in runs]
    assert summary["last"]["accuracy"] == {"mean": pytest.approx(np.mean(values)),
                                           "std": pytest.approx(np.std(values, ddof=1)), "values": values}  # fmt: skip
    assert "f1" not in summary["last"] and summary["best_metric"] == "accuracy"
    assert (tmp_path / "seed-6" / "config.yaml").read_text().count("seed: 6") == 1
    assert "over seeds [5, 6]" in capsys.readouterr().out


@pytest.mark.slow
def test_a_bertjax_pretraining_checkpoint_finetunes_on_sst2(shared_data, tmp_path):
    from bertjax.settings import load_config
    from train import pretrain

    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "alice.txt").symlink_to(shared_data / "gutenberg" / "carroll-alice.txt")
    overrides = {
        "data.corpora": f"[{{name: books, source: local, path: {tmp_path / 'books'}, kind: gutenberg}}]",
        "data.vocab_file": str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"),
        "data.max_seq_length": "64", "data.max_predictions_per_seq": "10", "data.segmenter": "sentencizer",
        "model.max_position_embeddings": "64", "train.steps": "2", "train.global_batch_size": "8",
        "checkpoint.every": "0", "checkpoint.log_spaced": "0",
    }  # fmt: skip
    config = load_config(
        pretrain.PretrainConfig, ROOT / "configs/pretrain/tiny.yaml", [f"{k}={v}" for k, v in overrides.items()]
    )
    pretrain.run(config, tmp_path / "pretrain")
    workdir = tmp_path / "sst2"
    finetune.main(_argv("sst2", tmp_path / "pretrain", workdir, shared_data / "glue", "train.epochs=1"))
    summary = json.loads((workdir / "eval.json").read_text())
    assert summary["task"] == "sst2" and summary["n_examples"] == 872 and summary["step"] == 6
    assert bertjax.from_pretrained(workdir, "BertForSequenceClassification").config.vocab_size == 30522


# -- one-line errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown_task", "error: unknown task 'cola' (--task): choose one of qnli, qqp, mrpc, sst2"),
        ("bad_label", "MRPC/train.tsv:3: label '2' is not one of 0, 1"),
        ("vocab_size", "the tokenizer has 30522 tokens but the model's vocab_size is 1000"),
        ("bad_metric", "best_metric: 'f1' is not a metric of sst2 (accuracy)"),
        ("too_long", "data.max_seq_length 256 is not in [3, 128]"),
        ("eval_batch", "data.eval_batch_size must be at least 1, got 0"),
        ("optimizer", "optimizer.name: 'sgd' is not lamb or adamw"),
        ("warmup_ratio", "train.warmup_ratio must be in [0, 1], got -0.5"),
    ],
)
def test_bad_input_gives_one_line(case, expected, tiny_ckpt, shared_data, tmp_path, cli_error):
    task, init, glue_dir, extra = "mrpc", tiny_ckpt, shared_data / "glue", []
    if case == "unknown_task":
        task = "cola"
    elif case == "bad_label":
        glue_dir = tmp_path / "glue"
        (glue_dir / "MRPC").mkdir(parents=True)
        header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        (glue_dir / "MRPC" / "train.tsv").write_text(header + "1\t1\t2\tA b.\tC d.\n2\t3\t4\tE f.\tG h.\n")
        (glue_dir / "MRPC" / "dev.tsv").write_text(header + "1\t1\t2\tA b.\tC d.\n")
    elif case == "vocab_size":
        init = _hf_checkpoint(tmp_path / "small_vocab", shared_data, vocab_size=1000)
    elif case == "bad_metric":
        task, extra = "sst2", ["best_metric=f1"]
    elif case == "too_long":
        extra = ["data.max_seq_length=256"]
    elif case == "eval_batch":
        extra = ["data.eval_batch_size=0"]
    elif case == "optimizer":
        extra = ["optimizer.name=sgd"]
    elif case == "warmup_ratio":
        extra = ["train.warmup_ratio=-0.5"]
    message = cli_error(finetune.main, _argv(task, init, tmp_path / "work", glue_dir, *extra))
    assert message.startswith("error: ") and expected in message, message
    assert not (tmp_path / "work").exists()  # nothing half-made
