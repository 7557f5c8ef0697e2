"""The examples every analysis reads and how they become model inputs: tasks → GLUE or CoNLL-U
examples → parses (cached on disk) → encoded sequences.

Any analysis that scores sequences (roles, track, finetune_effect, report; Clark's and
Kovaleva's analyses use parts) goes through here, so "which examples, parsed how, truncated where"
has one answer. The functions take any settings object with the fields of `ExampleSettings`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import jax

from bertjax import cli, distributed, glue, runinfo
from bertjax.errors import UserError
from bertjax.progress import tqdm
from sieves.align import MIN_LENGTH, EncodedSequence, backend_encode, encode_batch
from sieves.builders import get_role, present_roles
from sieves.parse import TEXT_PREFIX, SpacyParser, parse_examples, read_conllu, read_text_examples

log = logging.getLogger(__name__)

CONLLU_TASK = "ud"
# `--task text:FILE`: any text, one example per line (a tab splits a pair), so a model with its own
# vocabulary (a synthetic language, another domain) is analysed on its own kind of text. Outputs
# name the task `text-<file stem>`.
TEXT_LABEL = "text-"
# Below this many examples a task's t-tests have little power and its shares of heads move in
# large steps (QQP's staged sample has 9): the run warns and prints N.
SMALL_N = 30
# Above this share of [UNK] among a task's text pieces the model reads mostly unknown text (a model
# with a 160-piece vocabulary on English): its roles say little about the text, and the run warns.
UNKNOWN_SHARE = 0.05
# Above this many text pieces per whitespace-separated word the model's vocabulary spells the text
# out in fragments instead of mapping it to [UNK] (a 160-piece vocabulary trained on English gives
# 3.3-3.8 on GLUE and EWT text, 0% [UNK]), and roles such as `local` describe attention inside
# words: the run warns. Real vocabularies give 1.2-1.5 on the same text, 500- to 4,000-piece ones
# trained on MRPC 1.6-2.8; docs/pieces_per_word.py measures them (docs/roles.md).
PIECES_PER_WORD = 3.0
# Examples whose text pieces per word are counted (`pieces_per_word`): enough for a stable mean.
PIECES_SAMPLE = 1000


class ExampleSettings(Protocol):
    """The settings that choose and prepare the examples (a `heads.config.RolesConfig` has them).
    Read-only: the configs are frozen."""

    @property
    def n(self) -> int: ...
    @property
    def glue_dir(self) -> str | None: ...
    @property
    def split(self) -> str: ...
    @property
    def conllu(self) -> str | None: ...
    @property
    def max_length(self) -> int: ...
    @property
    def roles(self) -> tuple[str, ...]: ...
    @property
    def parser(self) -> str: ...
    @property
    def spacy_model(self) -> str | None: ...
    @property
    def cache_dir(self) -> str: ...


def resolve_tasks(spec: Sequence[str]) -> list[str]:
    """The tasks `--task` names (a list, as the settings hold it: `all`, tasks, `text:FILE`), in
    the order given."""
    text_task_files(spec)  # checks the files and their names before any work
    tasks = [
        t for part in spec for t in ([text_label(part)] if part.startswith(TEXT_PREFIX) else glue.resolve_tasks(part))
    ]
    return list(dict.fromkeys(tasks))


def text_label(part: str) -> str:
    stem = Path(part[len(TEXT_PREFIX) :]).stem
    return TEXT_LABEL + ("".join(c if c.isalnum() or c in "-_" else "_" for c in stem) or "file")


def text_task_files(spec: Sequence[str]) -> dict[str, Path]:
    """The `text:FILE` parts of a --task list, by the task name they get; two files with one name
    (a/x.txt, b/x.txt) would write into each other's outputs, so they are refused."""
    if isinstance(spec, str):  # its letters would be read as tasks
        raise TypeError(f"--task is a list of names as the settings hold it, not the text {spec!r}")
    files: dict[str, Path] = {}
    for part in spec:
        if not part.startswith(TEXT_PREFIX):
            continue
        path = Path(part[len(TEXT_PREFIX) :])
        if not path.is_file():
            raise UserError(f"--task {part}: {path} is not a file")
        label = text_label(part)
        if label in files and files[label] != path:
            raise UserError(f"--task: {files[label]} and {path} would both be named {label!r}; rename one")
        files[label] = path
    return files


def conllu_file(config: ExampleSettings) -> Path:
    """The gold trees' file of the `ud` task, which a config with `--parser conllu` must name."""
    if config.conllu is None:
        raise UserError("--parser conllu needs --conllu FILE (a CoNLL-U file of gold trees)")
    return Path(config.conllu)


def examples_for(config: ExampleSettings, task: str) -> tuple[list[tuple[str, ...]], list[int], dict[Path, str]]:
    """(segments per example, example indices, files read) in file order; each file with the
    sha256 of the bytes parsed (a task from the hub's copy has no file)."""
    if task == CONLLU_TASK:
        sentences = read_conllu(conllu_file(config), limit=config.n)
        digest = runinfo.input_sha256(conllu_file(config))
        return [(text,) for text, _ in sentences], list(range(len(sentences))), {conllu_file(config): digest}
    if task.startswith(TEXT_LABEL):
        text_files = text_task_files(getattr(config, "task", ()))
        if task not in text_files:
            raise UserError(f"--task: {task!r} names no text:FILE of this run")
        segments, digest = read_text_examples(text_files[task], config.n)
        return segments, list(range(len(segments))), {text_files[task]: digest}
    glue_dir = None if config.glue_dir is None else Path(config.glue_dir)
    examples = glue.load_glue(task, config.split, glue_dir, config.n)
    files = glue.glue_files(task, config.split, glue_dir) if glue_dir else []
    segments = [e.segments for e in examples]
    return segments, [e.index for e in examples], {f: runinfo.input_sha256(f) for f in files}


def parse_segments(config: ExampleSettings, task: str, segments: Sequence[tuple[str, ...]], parser):
    if task == CONLLU_TASK:
        return [(words,) for _, words in read_conllu(conllu_file(config), limit=config.n)]
    return parse_examples(parser, segments)


@dataclasses.dataclass
class TaskData:
    """One task's examples as read: segments per example, example indices, files read (each with
    the sha256 of the bytes parsed: `examples_for`)."""

    segments: list[tuple[str, ...]]
    indices: list[int]
    files: dict[Path, str]


def check_sources(config: ExampleSettings, tasks: Sequence[str]) -> None:
    """Before any data is read or any folder made: a GLUE task that must come from a hub switched
    off, with no cached copy, is one line (`glue.check_hub_copy`)."""
    if config.glue_dir is None:
        for task in tasks:
            if task != CONLLU_TASK and not task.startswith(TEXT_LABEL):
                glue.check_hub_copy(task)


def load_tasks(config: ExampleSettings, tasks: Sequence[str]) -> dict[str, TaskData]:
    """Every task's examples, or a UserError when a task defines none of `config.roles` (checked
    here, before any parse or forward pass: such a task would leave nothing to test)."""
    check_sources(config, tasks)
    data = {task: TaskData(*examples_for(config, task)) for task in tasks}
    for task, d in data.items():
        present, absent = present_roles((len(segments) for segments in d.segments), config.roles)
        if not present:
            verb = "needs" if len(absent) == 1 else "need"
            raise UserError(
                f"--roles {','.join(config.roles)}: no requested role is defined for {task} ({', '.join(absent)} {verb} sentence pairs)"
            )
        pairs = sum(len(segments) == 2 for segments in d.segments)
        if absent and pairs:
            # "absent" alone reads as a bug when the file does hold pairs.
            log.warning(
                "%s: %s not scored: its examples mix %d sentence pairs and %d single sentences, and a pair role "
                "needs every example to be a pair (put the pairs in a text: file of their own)",
                task, ", ".join(absent), pairs, len(d.segments) - pairs,
            )  # fmt: skip
        if len(d.indices) < SMALL_N:
            log.warning(
                "%s: N = %d examples, fewer than %d: its tests have little power and its shares of heads move in large steps",
                task, len(d.indices), SMALL_N,
            )  # fmt: skip
    return data


def unknown_share(tokenizer, sequences: Sequence[EncodedSequence]) -> float:
    """The share of [UNK] among the sequences' text pieces (special tokens not counted)."""
    unknown = total = 0
    for seq in sequences:
        text = seq.input_ids[~seq.special]
        unknown += int((text == tokenizer.unk_token_id).sum())
        total += text.size
    return unknown / total if total else 0.0


def pieces_per_word(tokenizer, segments: Sequence[tuple[str, ...]]) -> float:
    """The mean number of text pieces per whitespace-separated word over the first
    `PIECES_SAMPLE` examples' segments, untruncated (special tokens not counted)."""
    texts = [text for example in segments[:PIECES_SAMPLE] for text in example]
    words = sum(len(text.split()) for text in texts)
    if not words:
        return 0.0
    return sum(len(e.ids) for e in backend_encode(tokenizer, [texts], None, special=False)) / words


def process_shares(data: dict[str, TaskData]) -> dict[str, TaskData]:
    """Each task's examples that this process encodes and scores: a contiguous share
    (`bertjax.distributed.process_share`), so the gathered scores come back in file order. With one
    process, all of them."""
    count = jax.process_count()
    if count == 1:
        return data
    shares = {}
    for task, d in data.items():
        if len(d.indices) < count:
            raise UserError(f"--n: {task} has {len(d.indices)} example(s), fewer than the {count} processes of the job")
        share = distributed.process_share(len(d.indices))
        shares[task] = TaskData(d.segments[share], d.indices[share], d.files)
    return shares


def data_file_hashes(data: dict[str, TaskData]) -> dict[str, list[dict[str, str]]]:
    return {t: [{"path": str(f), "sha256": digest} for f, digest in d.files.items()] for t, d in data.items()}


def make_parser(config: ExampleSettings) -> SpacyParser | None:
    """The spaCy parser when a role needs parses (CoNLL-U trees come with the data)."""
    if config.parser == "spacy" and any(get_role(r).needs_parse for r in config.roles):
        return SpacyParser(config.spacy_model, cache_dir=Path(config.cache_dir).expanduser())
    return None


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The tasks' examples as read (`data`), their files' hashes and the parser: the preparation the
    heads analyses share, made once and encoded with the tokenizer of whichever model scores them."""

    config: ExampleSettings
    data: dict[str, TaskData]
    data_files: dict[str, list[dict[str, str]]]
    parser: SpacyParser | None

    @property
    def n_sequences(self) -> dict[str, int]:
        """Each task's number of examples (every process's share together)."""
        return {task: len(d.indices) for task, d in self.data.items()}

    def encode(self, tokenizer, timings: dict[str, float]) -> dict[str, list[EncodedSequence]]:
        """This process's share of every task, parsed and encoded (`encode_tasks`)."""
        return encode_tasks(self.config, process_shares(self.data), tokenizer, self.parser, timings)


def prepare_inputs(config: ExampleSettings, tasks: Sequence[str], parser=None) -> Inputs:
    """Reads the tasks' examples (`load_tasks`) and hashes their files. `parser`: one made elsewhere
    (anything with `parse`, `name` and `version`), used when `config` asks for spaCy's parses;
    otherwise the one `config` names (`make_parser`)."""
    data = load_tasks(config, tasks)
    if parser is None or config.parser != "spacy":
        parser = make_parser(config)
    return Inputs(config, data, data_file_hashes(data), parser)


# Examples parsed and encoded at a time: what a chunk needs on the way (its parses, the tokenizer's
# offsets as Python lists, ~3 kB an example) is freed before the next, so a 100,000-pair task holds
# only its encoded sequences, not the whole task's intermediates at once.
ENCODE_CHUNK = 4096


def encode_tasks(
    config: ExampleSettings, data: dict[str, TaskData], tokenizer, parser, timings: dict[str, float]
) -> dict[str, list[EncodedSequence]]:
    """Parses (cached on disk) and encodes every task once, a chunk of examples at a time with a
    progress bar; any number of models can score them. Each example is parsed and encoded on its
    own, so the chunks give the sequences one call over the whole task would."""
    sequences = {}
    for task, d in data.items():
        clock = time.perf_counter()
        trees = None
        if task == CONLLU_TASK:
            trees = parse_segments(config, task, d.segments, None)  # the file read again, for its trees
            if runinfo.input_sha256(conllu_file(config)) != d.files[conllu_file(config)]:
                raise UserError(f"{config.conllu} changed while it was read; run again once it stays put")
        encoded: list[EncodedSequence] = []
        with tqdm(total=len(d.segments), desc=f"{task} encode", unit="example",
                  disable=len(d.segments) <= ENCODE_CHUNK or jax.process_index() != 0) as progress:  # fmt: skip
            for begin in range(0, len(d.segments), ENCODE_CHUNK):
                cli.stop_if_terminated()
                part = slice(begin, begin + ENCODE_CHUNK)
                if trees is not None:
                    parses = trees[part]
                elif parser is not None:
                    parses = parse_segments(config, task, d.segments[part], parser)
                else:
                    parses = None
                encoded += encode_batch(tokenizer, d.segments[part], parses, config.max_length, d.indices[part])
                progress.update(len(d.segments[part]))
        sequences[task] = encoded
        warn_unknown_text(task, tokenizer, encoded, pieces_per_word(tokenizer, d.segments))
        timings[f"{task}/prepare"] = time.perf_counter() - clock
    return sequences


def warn_unknown_text(task: str, tokenizer, encoded: Sequence[EncodedSequence], ratio: float) -> None:
    """The warnings of a task whose text the model's vocabulary does not cover ([UNK], or words
    spelled out in fragments: `ratio` is `pieces_per_word`'s)."""
    share = unknown_share(tokenizer, encoded)
    if share > UNKNOWN_SHARE:
        log.warning(
            "%s: %.0f%% of the text's pieces are unknown to the model's vocabulary ([UNK]; warned above %.0f%%): "
            "the roles describe attention over [UNK], not over this text",
            task, 100 * share, 100 * UNKNOWN_SHARE,
        )  # fmt: skip
    if ratio > PIECES_PER_WORD:
        log.warning(
            "%s: %.1f text pieces per word (warned above %.1f; a vocabulary of the text's language gives "
            "1.2-1.5): the model's vocabulary spells this text out in fragments, and the roles describe "
            "attention inside its words",
            task, ratio, PIECES_PER_WORD,
        )  # fmt: skip


class LengthLimited(Protocol):
    """A run config `fit_max_length` can cut: a dataclass with `max_length`."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def max_length(self) -> int: ...


C = TypeVar("C", bound=LengthLimited)


def fit_max_length(config: C, positions: int) -> C:
    """A run config (any dataclass with `max_length`) with `max_length` cut to the model's
    positions; the CLIs save the config they ran with, so run.json records the cut value."""
    if config.max_length < MIN_LENGTH:
        # Below this the tokenizer stops truncating (its special tokens alone fill the budget)
        # instead of failing, and the batches then overflow.
        raise UserError(
            f"--max-length must be at least {MIN_LENGTH} ([CLS] A [SEP] B [SEP] with a wordpiece in each segment), got {config.max_length}"
        )
    if config.max_length <= positions:
        return config
    log.warning(
        "--max-length %d exceeds the model's %d positions; truncating to %d", config.max_length, positions, positions
    )
    return dataclasses.replace(config, max_length=positions)
