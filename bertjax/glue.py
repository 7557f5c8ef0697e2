"""GLUE tasks (QNLI, QQP, MRPC, SST-2) as lists of examples, from a local GLUE directory or the hub;
their encoding as model inputs, and their metrics.

Local files are read the way the GLUE TSVs were written: tab-separated with quoting off (sentences
hold unbalanced quotes) and `utf-8-sig` (MRPC starts with a BOM).
"""

from __future__ import annotations

import io
import itertools
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertjax import runinfo
from bertjax.errors import UserError

log = logging.getLogger(__name__)

HUB_DATASET = "nyu-mll/glue"
FEATURES = ("input_ids", "token_type_ids", "attention_mask")


@dataclass(frozen=True)
class TaskSpec:
    """Where one task's text and labels live, locally and on the hub."""

    name: str
    dir_name: str
    text_a: str
    text_b: str | None
    label_column: str
    # Label strings in the files, in the order of the hub's integer labels.
    labels: tuple[str, ...]
    hub_config: str
    hub_text_a: str
    hub_text_b: str | None
    metrics: tuple[str, ...]

    @property
    def num_labels(self) -> int:
        return len(self.labels)


# The help of every command's --glue-dir (the analyses' and train.finetune's): one text, one layout.
GLUE_DIR_HELP = "local GLUE directory holding <TASK>/<split>.tsv (MRPC/dev.tsv, ...); default: the hub"

TASKS: dict[str, TaskSpec] = {
    "qnli": TaskSpec(
        name="qnli",
        dir_name="QNLI",
        text_a="question",
        text_b="sentence",
        label_column="label",
        labels=("entailment", "not_entailment"),
        hub_config="qnli",
        hub_text_a="question",
        hub_text_b="sentence",
        metrics=("accuracy",),
    ),
    "qqp": TaskSpec(
        name="qqp",
        dir_name="QQP",
        text_a="question1",
        text_b="question2",
        label_column="is_duplicate",
        labels=("0", "1"),
        hub_config="qqp",
        hub_text_a="question1",
        hub_text_b="question2",
        metrics=("accuracy", "f1"),
    ),
    "mrpc": TaskSpec(
        name="mrpc",
        dir_name="MRPC",
        text_a="#1 String",
        text_b="#2 String",
        label_column="Quality",
        labels=("0", "1"),
        hub_config="mrpc",
        hub_text_a="sentence1",
        hub_text_b="sentence2",
        metrics=("accuracy", "f1"),
    ),
    "sst2": TaskSpec(
        name="sst2",
        dir_name="SST-2",
        text_a="sentence",
        text_b=None,
        label_column="label",
        labels=("0", "1"),
        hub_config="sst2",
        hub_text_a="sentence",
        hub_text_b=None,
        metrics=("accuracy",),
    ),
}

# Local file stem and hub split name for each accepted --split value.
_SPLITS: dict[str, tuple[str, str]] = {
    "train": ("train", "train"),
    "dev": ("dev", "validation"),
    "validation": ("dev", "validation"),
    "test": ("test", "test"),
}


@dataclass(frozen=True)
class Example:
    """One GLUE example; `index` is its 0-based row in file (or hub) order."""

    index: int
    text_a: str
    text_b: str | None
    label: int | None

    @property
    def segments(self) -> tuple[str, ...]:
        """The texts the model reads: one, or a pair."""
        return (self.text_a,) if self.text_b is None else (self.text_a, self.text_b)


def task_spec(task: str) -> TaskSpec:
    """The spec of `task`, or a UserError listing the valid tasks."""
    if task not in TASKS:
        raise UserError(f"unknown task {task!r} (--task): choose one of {', '.join(TASKS)} or all")
    return TASKS[task]


def resolve_tasks(task: str) -> list[str]:
    """Expand a --task value: `all` is every task in TASKS' order, otherwise the one task."""
    if task == "all":
        return list(TASKS)
    return [task_spec(task).name]


def _split_names(split: str) -> tuple[str, str]:
    if split not in _SPLITS:
        raise UserError(f"unknown split {split!r} (--split): choose one of {', '.join(_SPLITS)}")
    return _SPLITS[split]


def _find_tsv(spec: TaskSpec, split: str, glue_dir: Path) -> tuple[Path, Path | None]:
    """The TSV to read, and the missing `<split>.tsv` it stands in for (None if it is that one)."""
    stem, _ = _split_names(split)
    task_dir = Path(glue_dir) / spec.dir_name
    path = task_dir / f"{stem}.tsv"
    if path.is_file():
        return path, None
    # Partial copies such as the staged QQP `dev.head9.tsv` are usable when they are unambiguous.
    candidates = sorted(task_dir.glob(f"{stem}.*.tsv"))
    if len(candidates) == 1:
        return candidates[0], path
    raise UserError(f"GLUE file not found: {path} (--glue-dir {glue_dir})")


def glue_files(task: str, split: str, glue_dir: Path) -> list[Path]:
    """The local file(s) `load_glue` reads for this task and split, so callers can hash them."""
    path, _ = _find_tsv(task_spec(task), split, glue_dir)
    return [path]


def load_glue(
    task: str, split: str = "dev", glue_dir: Path | None = None, n: int | None = None, allow_empty: bool = False
) -> list[Example]:
    """The first `n` examples (all when None) of a task's split, from `glue_dir` or else the hub.

    An empty text is an error unless `allow_empty`: the analyses parse and align every segment,
    while a classifier reads `[CLS] a [SEP] [SEP]` as HF's run_glue does (QQP's official train
    split has two empty questions)."""
    spec = task_spec(task)
    _split_names(split)
    if n is not None and n < 1:
        raise UserError(f"--n must be ≥ 1, got {n}")
    if glue_dir is None:
        return _load_hub(spec, split, n, allow_empty)
    path, missing = _find_tsv(spec, split, glue_dir)
    if missing is not None:
        log.warning("%s not found; reading %s instead", missing, path)
    # islice stops before parsing row n+1, so a bad row past the first n is never an error.
    examples = list(itertools.islice(_read_tsv(spec, path, split != "test", allow_empty), n))
    if not examples:
        raise UserError(f"{path}: no examples (a header and nothing else)")
    return examples


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) pairs, split on LF only: texts may hold other line breaks. The
    file is read whole first, so that run.json's sha256 is of the bytes parsed (`runinfo.read_input`)."""
    try:
        data = runinfo.read_input(path)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    with io.BytesIO(data) as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{lineno}: not valid UTF-8 ({e.reason})") from None
            yield lineno, text.rstrip("\r\n")


def _read_tsv(spec: TaskSpec, path: Path, labelled: bool, allow_empty: bool) -> Iterator[Example]:
    lines = _lines(path)
    header = next(lines, (1, ""))[1].split("\t")
    columns = {name: i for i, name in enumerate(header)}
    text_columns = [spec.text_a] + ([spec.text_b] if spec.text_b else [])
    # GLUE test files carry no label column; labels of train/dev are required.
    wanted = text_columns + ([spec.label_column] if labelled else [])
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise UserError(
            f"{path}:1: header lacks column(s) {', '.join(map(repr, missing))} for task {spec.name}"
            f" (header: {', '.join(map(repr, header))})"
        )
    label_ids = {label: i for i, label in enumerate(spec.labels)}
    for index, (lineno, line) in enumerate(lines):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path}:{lineno}: {len(fields)} tab-separated fields, header has {len(header)}")
        texts = []
        for column in text_columns:
            text = fields[columns[column]]
            if not text.strip() and not allow_empty:
                raise UserError(
                    f"{path}:{lineno}: empty text in column {column!r} (the analyses need text in every segment)"
                )
            texts.append(text)
        label = None
        if labelled:
            raw_label = fields[columns[spec.label_column]]
            if raw_label not in label_ids:
                raise UserError(f"{path}:{lineno}: label {raw_label!r} is not one of {', '.join(spec.labels)}")
            label = label_ids[raw_label]
        yield Example(index, texts[0], texts[1] if spec.text_b else None, label)


# The clients' own switches (huggingface_hub's and datasets' truthy values).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def check_hub_copy(task: str) -> None:
    """With the hub switched off, a task that neither of the clients' caches holds is one line at
    once: `datasets` would otherwise spend tens of seconds retrying the hub before its error."""
    offline = [v for v in OFFLINE_VARIABLES if os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")]
    if not offline:
        return
    from huggingface_hub import constants

    spec = task_spec(task)
    owner, name = HUB_DATASET.split("/")
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets").expanduser()
    copies = (
        Path(constants.HF_HUB_CACHE) / f"datasets--{owner}--{name}",
        datasets_cache / f"{owner}___{name}" / spec.hub_config,
    )
    if not any(copy.is_dir() for copy in copies):
        raise UserError(
            f"{HUB_DATASET} {spec.hub_config}: the hub is off ({offline[0]}={os.environ[offline[0]]}) and no local copy "
            "is cached; pass --glue-dir with the GLUE files"
        )


def _load_hub(spec: TaskSpec, split: str, n: int | None, allow_empty: bool) -> list[Example]:
    check_hub_copy(spec.name)
    # `datasets` is slow to import and only needed when no local GLUE directory is given.
    import datasets

    hub_split = _SPLITS[split][1] + ("" if n is None else f"[:{n}]")
    source = f"{HUB_DATASET} {spec.hub_config} {hub_split}"
    try:
        rows = datasets.load_dataset(HUB_DATASET, spec.hub_config, split=hub_split)
    except OSError as e:
        raise UserError(
            f"could not load {source} from the hub ({e}); connect to the network or pass --glue-dir"
        ) from None
    examples = []
    for index, row in enumerate(rows):
        texts = [row[spec.hub_text_a]] + ([row[spec.hub_text_b]] if spec.hub_text_b else [])
        if any(not text.strip() for text in texts) and not allow_empty:
            raise UserError(f"{source} row {index}: empty text (the analyses need text in every segment)")
        # The hub marks the unlabelled test split with -1.
        label = None if row["label"] == -1 else int(row["label"])
        if label is not None and not 0 <= label < spec.num_labels:
            raise UserError(f"{source} row {index}: label {label} outside 0..{spec.num_labels - 1}")
        examples.append(Example(index, texts[0], texts[1] if spec.hub_text_b else None, label))
    if not examples:
        raise UserError(f"{source}: no examples")
    return examples


# -- model inputs and metrics ------------------------------------------------------------------


def encode(examples: Sequence[Example], tokenizer: Any, max_seq_length: int, source: str) -> dict[str, np.ndarray]:
    """`input_ids`, `token_type_ids`, `attention_mask` [N, T] and `labels` [N], all int32; pairs
    are truncated longest-first. `source` names the data in errors."""
    if not examples:
        raise UserError(f"{source}: no examples")
    unlabelled = next((e.index for e in examples if e.label is None), None)
    if unlabelled is not None:
        raise UserError(f"{source}: example {unlabelled} has no label (the GLUE test split is unlabelled)")
    pairs = examples[0].text_b is not None
    encoded = tokenizer(
        [e.text_a for e in examples],
        [e.text_b for e in examples] if pairs else None,
        truncation="longest_first" if pairs else True,
        max_length=max_seq_length,
        padding="max_length",
        return_token_type_ids=True,
        return_attention_mask=True,
        return_tensors="np",
    )
    arrays = {k: np.asarray(encoded[k], dtype=np.int32) for k in FEATURES}
    arrays["labels"] = np.asarray([e.label for e in examples], dtype=np.int32)
    return arrays


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions == labels))


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """F1 of the positive class (label 1: paraphrase, duplicate) of a binary task: 2TP / (2TP + FP
    + FN), where FP + FN are the errors; 0 when there is no true positive."""
    tp = int(np.sum((predictions == 1) & (labels == 1)))
    errors = int(np.sum(predictions != labels))
    return 2 * tp / (2 * tp + errors) if tp else 0.0


METRICS = {"accuracy": accuracy, "f1": f1}


def classification_metrics(logits: np.ndarray, labels: np.ndarray, names: tuple[str, ...]) -> dict[str, float]:
    import optax  # here, not at the top: the CLIs' parsers read TASKS, and optax imports jax

    predictions = logits.argmax(-1)
    scores = {name: METRICS[name](predictions, labels) for name in names}
    scores["loss"] = float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean())
    return scores
