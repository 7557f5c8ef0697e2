"""Prepare pre-training data in one step: corpora → sentences → WordPiece ids → instances → shards.

`python -m train.prepare --out DIR [--config prepare.yaml] [key=value ...]`

The output directory (written to a temporary sibling and renamed, so it is never half-written):

    meta.json                 settings, vocabulary, counts, corpora with file hashes, throughput
    vocab.txt                 the vocabulary used (copied, or trained with `train_vocab=true`)
    shard-00000/              one folder per shard of memory-mappable .npy files:
        input_ids.npy         [N, T] uint16 (int32 for vocabularies over 65536), padded
        token_type_ids.npy    [N, T] int8
        lengths.npy           [N] int16, real tokens per row
        nsp_labels.npy        [N] int8, 1 = segment B is a random span
        masked_positions.npy  [N, P] int16   } only with masking=static; input_ids are then
        masked_ids.npy        [N, P]         } already masked; position 0 marks padding

NSP's random segments come from the same pool of documents (`pool_tokens` tokens at a time), as the
original drew them from the same input file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertjax import cli, runinfo
from bertjax.errors import UserError
from bertjax.settings import load_config, setting
from train.config import (
    PrepareConfig,
    command_parser,
    overrides_setting,
    parse_command,
    print_config_if_asked,
    print_config_setting,
)
from train.corpora import (
    MIX_STOPS,
    SEGMENTERS,
    Document,
    SentenceSegmenter,
    describe,
    file_sha256,
    iter_documents,
    mix,
    validate_corpus,
)
from train.instances import (
    MASKINGS,
    PAIR_TASKS,
    SHORT_SEQ_PER,
    Instances,
    MaskingSpec,
    TokenizedDocument,
    create_instances,
    mask_batch,
)

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Sentences per `encode_batch` call: large enough for the Rust tokenizer's threads to pay off.
ENCODE_BATCH_SENTENCES = 4096


def validate(config: PrepareConfig) -> None:
    """Raise UserError naming the first setting that cannot work."""
    from bertjax.pretrained import is_hub_id  # here, not at the top: it imports JAX, which --help need not wait for

    choices = {
        "masking": MASKINGS,
        "short_seq_per": SHORT_SEQ_PER,
        "mix_stop": MIX_STOPS,
        "segmenter": SEGMENTERS,
        "pair_task": PAIR_TASKS,
    }
    for key, allowed in choices.items():
        if getattr(config, key) not in allowed:
            raise UserError(f"{key}: {getattr(config, key)!r} is not one of {', '.join(allowed)}")
    if not config.corpora:
        raise UserError("corpora: at least one corpus is needed")
    for i, corpus in enumerate(config.corpora):
        validate_corpus(corpus, f"corpora.{i}")
    if not 5 <= config.max_seq_length <= 32767:
        raise UserError(f"max_seq_length: must be in [5, 32767], got {config.max_seq_length}")
    if not 1 <= config.max_predictions_per_seq <= config.max_seq_length:
        raise UserError("max_predictions_per_seq: must be in [1, max_seq_length]")
    if not 0 < config.masked_lm_prob < 1:
        raise UserError(f"masked_lm_prob: must be in (0, 1), got {config.masked_lm_prob}")
    if not 0 <= config.short_seq_prob <= 1:
        raise UserError(f"short_seq_prob: must be in [0, 1], got {config.short_seq_prob}")
    for key in ("dupe_factor", "segment_workers", "pool_tokens", "shard_size"):
        if getattr(config, key) < 1:
            raise UserError(f"{key}: must be >= 1, got {getattr(config, key)}")
    if config.seed < 0:
        raise UserError(f"seed: must be >= 0, got {config.seed}")
    if config.max_documents is not None and config.max_documents < 1:
        raise UserError(f"max_documents: must be >= 1, got {config.max_documents}")
    if config.train_vocab:
        if config.vocab_size < len(SPECIAL_TOKENS) + 1:
            raise UserError(f"vocab_size: too small, got {config.vocab_size}")
    elif not config.vocab_file:
        raise UserError("vocab_file: set a vocab.txt path or a hub model id, or train_vocab=true")
    elif not Path(config.vocab_file).expanduser().is_file() and not is_hub_id(config.vocab_file):
        raise UserError(f"{config.vocab_file}: vocab_file does not exist")
    if (
        len({c.weight for c in config.corpora}) > 1
        and config.mix_stop == "all_exhausted"
        and config.max_documents is None
    ):
        log.warning(
            "corpora weights %s: under mix_stop=all_exhausted without max_documents every document of every "
            "corpus is used once, so the weights only order the mixed stream, not its proportions",
            ", ".join(f"{c.name}={c.weight:g}" for c in config.corpora),
        )


def vocab_source_file(vocab_file: str) -> Path:
    """`vocab_file` itself, or the vocab.txt of the hub model it names (a run on a fresh TPU VM
    has no vocabulary on disk)."""
    from bertjax.pretrained import hub_file

    path = Path(vocab_file).expanduser()
    return path if path.is_file() else hub_file(vocab_file, "vocab.txt")


# --- vocabulary ---------------------------------------------------------------------------------


def read_vocab(path: Path) -> list[str]:
    vocab = path.read_text(encoding="utf-8").splitlines()
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise UserError(f"{path}: vocabulary lacks {', '.join(missing)}")
    return vocab


def _documents(config: PrepareConfig, rng: np.random.Generator, desc: str) -> Iterator[Document]:
    """The mixed documents, one at a time (memory stays bounded by a document), under a progress
    bar of documents and characters read (counting words would split every paragraph once more):
    reading and segmenting 23 M words takes minutes."""
    from bertjax.progress import tqdm

    streams = [iter_documents(c) for c in config.corpora]
    mixed = mix(streams, [c.weight for c in config.corpora], rng, config.mix_stop)
    chars = 0
    with tqdm(desc=desc, unit=" docs", total=config.max_documents, mininterval=1.0) as bar:
        for doc in itertools.islice(mixed, config.max_documents):
            cli.stop_if_terminated()
            chars += sum(map(len, doc))
            bar.update()
            bar.set_postfix_str(f"{chars / 1e6:.0f} M chars", refresh=False)
            yield doc


def train_vocab(config: PrepareConfig, out_dir: Path, rng: np.random.Generator) -> Path:
    """Train a WordPiece vocabulary on the corpora's paragraphs; writes `out_dir/vocab.txt`.

    `rng` must be seeded as the main pass's mixing generator, so both read the same documents.
    """
    from tokenizers import BertWordPieceTokenizer

    paragraphs = (p for doc in _documents(config, rng, "read for the vocabulary") for p in doc)
    trained = _train_in_a_child(paragraphs, config)
    # Its ids in an order of our own: the trainer numbers tokens in hash-map order, different in
    # every process, so the same vocabulary gave other ids, and other shards, each time.
    ordered = sorted(trained, key=_canonical_key)
    tokenizer = BertWordPieceTokenizer({token: i for i, token in enumerate(ordered)}, lowercase=config.lowercase)
    try:
        tokenizer.save_model(str(out_dir))
    except Exception as e:  # tokenizers raises a bare Exception for Rust's io errors
        # Rust's io::Error reads "File too large (os error 27)": its errno, for the full-disk line.
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(out_dir / "vocab.txt")) from None
    return out_dir / "vocab.txt"


# The trainer's process: the paragraphs on stdin, one a line; the vocabulary as JSON on stdout.
_TRAINER = """
import io, json, sys
from tokenizers import BertWordPieceTokenizer
settings = json.loads(sys.argv[1])
tokenizer = BertWordPieceTokenizer(lowercase=settings.pop("lowercase"))
lines = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8")
tokenizer.train_from_iterator((line.rstrip("\\n") for line in lines), **settings)
json.dump(tokenizer.get_vocab(), sys.stdout)
"""


def _train_in_a_child(paragraphs: Iterable[str], config: PrepareConfig) -> dict[str, int]:
    """The trained vocabulary ({token: id}), trained in a process of its own fed `paragraphs`:
    the Rust trainer's merges read no signal flag and hold the thread that called them, so SIGTERM
    waited for the vocabulary (minutes on a large corpus), and a thread left to run them aborted
    the interpreter at exit. At a signal the child is killed."""
    settings = {"lowercase": config.lowercase, "vocab_size": config.vocab_size, "min_frequency": 2,
                "special_tokens": list(SPECIAL_TOKENS), "limit_alphabet": 1000, "wordpieces_prefix": "##",
                "show_progress": False}  # fmt: skip
    # Its own session: a terminal's Ctrl-C reaches this process alone, which ends the child.
    with subprocess.Popen([sys.executable, "-c", _TRAINER, json.dumps(settings)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, start_new_session=True) as child:  # fmt: skip
        feed = child.stdin
        assert feed is not None  # stdin=PIPE
        try:
            try:
                for paragraph in paragraphs:
                    # BERT's normaliser reads a newline as a space: one paragraph a line, counted alike.
                    feed.write(paragraph.replace("\n", " ").replace("\r", " ").encode("utf-8") + b"\n")
            except BrokenPipeError:  # the child failed: its status says so below
                pass
            while True:
                try:
                    vocabulary, _ = child.communicate(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    cli.stop_if_terminated()
        finally:
            if child.poll() is None:
                child.kill()
            with contextlib.suppress(BrokenPipeError):  # closed with the paragraphs it was not fed
                feed.close()
    if child.returncode != 0:
        raise RuntimeError(f"the vocabulary trainer's process failed (exit status {child.returncode})")
    return json.loads(vocabulary)


def _canonical_key(token: str) -> tuple:
    """The special tokens in SPECIAL_TOKENS' order, then word starts before "##" continuations,
    each shortest first, then by code point."""
    if token in SPECIAL_TOKENS:
        return (0, SPECIAL_TOKENS.index(token))
    piece = token.removeprefix("##")
    return (1, token.startswith("##"), len(piece), piece)


# --- writing ------------------------------------------------------------------------------------


class ShardWriter:
    """Buffers instances and writes them as fixed-size shards of .npy files."""

    def __init__(self, out_dir: Path, shard_size: int, ids_dtype: type) -> None:
        self.out_dir = out_dir
        self.shard_size = shard_size
        self.ids_dtype = ids_dtype
        self.buffer: list[dict[str, np.ndarray]] = []
        self.buffered = 0
        self.shards: list[dict[str, Any]] = []

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        self.buffer.append(arrays)
        self.buffered += len(arrays["lengths"])
        while self.buffered >= self.shard_size:
            self._write(self.shard_size)

    def close(self) -> None:
        if self.buffered:
            self._write(self.buffered)

    def _write(self, n: int) -> None:
        merged = {k: np.concatenate([a[k] for a in self.buffer]) for k in self.buffer[0]}
        rest = {k: v[n:] for k, v in merged.items()}
        self.buffered = len(rest["lengths"])
        self.buffer = [rest] if self.buffered else []
        name = f"shard-{len(self.shards):05d}"
        shard_dir = self.out_dir / name
        shard_dir.mkdir()
        for key, value in merged.items():
            dtype = self.ids_dtype if key in ("input_ids", "masked_ids") else value.dtype
            _save_npy(shard_dir / f"{key}.npy", np.ascontiguousarray(value[:n], dtype=dtype))
        self.shards.append({"name": name, "count": n})


def _save_npy(path: Path, array: np.ndarray) -> None:
    """`np.save`, but a failed write is an OSError with its errno and `path`: numpy's own write
    to a full disk says only `7936 requested and 686 written`, which cannot be told from a bug."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    try:
        path.write_bytes(buffer.getbuffer())
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from None


def _instance_arrays(
    instances: Instances, spec: MaskingSpec, static: bool, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    arrays = {
        "input_ids": instances.input_ids,
        "token_type_ids": instances.token_type_ids,
        "lengths": instances.lengths,
        "nsp_labels": instances.nsp_labels,
    }
    if static:
        masked = mask_batch(instances.input_ids, instances.lengths, spec, rng)
        arrays["input_ids"] = masked["input_ids"]
        arrays["masked_positions"] = masked["masked_positions"].astype(np.int16)
        arrays["masked_ids"] = masked["masked_ids"]
    return arrays


# --- the pipeline -------------------------------------------------------------------------------


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, stage: str, start: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


def _tokenized(
    documents: Iterable[Document], tokenizer: Any, timer: _Timer, counts: dict[str, int]
) -> Iterator[TokenizedDocument]:
    """Encode sentences many documents at a time (one `encode_batch` call per group)."""
    group: list[Document] = []
    sentences = 0
    for doc in itertools.chain(documents, [None]):
        if doc is not None:
            group.append(doc)
            sentences += len(doc)
            if sentences < ENCODE_BATCH_SENTENCES:
                continue
        if not group:
            break
        start = time.perf_counter()
        flat = [s for d in group for s in d]
        encodings = tokenizer.encode_batch(flat, add_special_tokens=False)
        ids = iter([e.ids for e in encodings])
        tokenized = [TokenizedDocument.from_sentences([next(ids) for _ in range(len(d))]) for d in group]
        timer.add("tokenize", start)
        for t in tokenized:
            if t.num_sentences:
                counts["documents"] += 1
                counts["sentences"] += t.num_sentences
                counts["tokens"] += len(t.ids)
                yield t
        group, sentences = [], 0


def prepare(config: PrepareConfig, out_dir: Path) -> dict[str, Any]:
    """Run the whole preparation into `out_dir` (absent or empty); returns what meta.json holds."""
    validate(config)
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"{out_dir}: output directory exists and is not empty")
    with runinfo.atomic_out(out_dir, kind="prepared pre-training data") as tmp:
        meta = _prepare_into(config, tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _prepare_into(config: PrepareConfig, out: Path) -> dict[str, Any]:
    import spacy
    import tokenizers

    timer = _Timer()
    begin = time.perf_counter()
    mix_seed, instance_seed, mask_seed = np.random.SeedSequence(config.seed).spawn(3)
    vocab_path, vocab_source = _vocabulary(config, out, mix_seed, timer)
    vocab = read_vocab(vocab_path)
    vocab_source["sha256"] = file_sha256(vocab_path)
    index = {tok: i for i, tok in enumerate(vocab)}
    tokenizer = _wordpiece(vocab_path, config.lowercase)
    spec = MaskingSpec.from_vocab(vocab, config.masked_lm_prob, config.max_predictions_per_seq, config.whole_word_mask)
    ids_dtype = np.uint16 if len(vocab) <= 1 << 16 else np.int32

    segmenter = SentenceSegmenter(config.segmenter, config.spacy_model, workers=config.segment_workers)
    counts = {"documents": 0, "sentences": 0, "tokens": 0, "instances": 0, "random_next": 0}
    raw_docs = _documents(config, np.random.default_rng(mix_seed), "prepare")
    docs = _tokenized(segmenter.segment(raw_docs), tokenizer, timer, counts)
    writer = ShardWriter(out, config.shard_size, ids_dtype)
    _write_instances(_pools(docs, config.pool_tokens), config, index, spec, writer, (instance_seed, mask_seed),
                     timer, counts, begin)  # fmt: skip
    if counts["instances"] == 0:
        raise UserError(
            # validate_corpus gave each a path (local) or a hub id.
            f"corpora {', '.join(str(c.path or c.hub_id) for c in config.corpora)}: "
            "no text left after sentence splitting and tokenisation"
        )
    start = time.perf_counter()
    writer.close()
    timer.add("mask_write", start)

    throughput = _throughput(counts, timer, time.perf_counter() - begin)
    log.info(
        "done: %d instances in %d shards, %.1f s, %.0f tokens/s, %.1f documents/s",
        counts["instances"],
        len(writer.shards),
        throughput["seconds"],
        throughput["tokens_per_s"],
        throughput["documents_per_s"],
    )
    return {
        "format_version": FORMAT_VERSION,
        "max_seq_length": config.max_seq_length,
        "max_predictions_per_seq": config.max_predictions_per_seq,
        "masked_lm_prob": config.masked_lm_prob,
        "pair_task": config.pair_task,
        "whole_word_mask": config.whole_word_mask,
        "masking": config.masking,
        "seed": config.seed,
        "vocab_file": "vocab.txt",
        "vocab_size": len(vocab),
        "vocab_source": vocab_source,
        "special_ids": {t: index[t] for t in SPECIAL_TOKENS},
        "ids_dtype": np.dtype(ids_dtype).name,
        "tokenizer": {
            "name": "tokenizers.BertWordPieceTokenizer",
            "lowercase": config.lowercase,
            "encode_special_tokens": True,
            "version": tokenizers.__version__,
        },
        "segmenter": {"name": segmenter.model_name, "spacy_version": spacy.__version__},
        "counts": counts,
        "shards": writer.shards,
        "corpora": [describe(c) for c in config.corpora],
        "throughput": throughput,
        "config": dataclasses.asdict(config),
    }


def _vocabulary(
    config: PrepareConfig, out: Path, mix_seed: np.random.SeedSequence, timer: _Timer
) -> tuple[Path, dict[str, Any]]:
    """`out/vocab.txt`, trained on the corpora or copied from `vocab_file`, and where it came from."""
    if config.train_vocab:
        start = time.perf_counter()
        vocab_path = train_vocab(config, out, np.random.default_rng(mix_seed))
        timer.add("train_vocab", start)
        return vocab_path, {"trained": True, "vocab_size": config.vocab_size}
    vocab_path = out / "vocab.txt"
    assert config.vocab_file is not None  # validate refused a run with neither it nor train_vocab
    shutil.copyfile(vocab_source_file(config.vocab_file), vocab_path)
    return vocab_path, {"trained": False, "path": str(config.vocab_file)}


def _wordpiece(vocab_path: Path, lowercase: bool) -> Any:
    """BERT's WordPiece tokenizer of `vocab_path`, as a `tokenizers.Tokenizer`."""
    import tokenizers

    wordpiece = tokenizers.BertWordPieceTokenizer(str(vocab_path), lowercase=lowercase)
    tokenizer = tokenizers.Tokenizer.from_str(wordpiece.to_str())
    # "[SEP]" or "[PAD]" written in a corpus stays text, as BERT's own tokenizer has it, instead of
    # becoming a separator or padding inside a segment.
    tokenizer.encode_special_tokens = True
    return tokenizer


def _pools(docs: Iterable[TokenizedDocument], pool_tokens: int) -> Iterator[list[TokenizedDocument]]:
    """The documents in pools of at least `pool_tokens` tokens (the last may hold fewer), each of
    two documents or more: a pool of one document would draw every "random" B from A's own
    document, so a pool closes only with two documents in it, and a full pool waits until the next
    one holds two: a lone last document joins it instead of making a pool of its own."""
    held: list[TokenizedDocument] = []
    pool: list[TokenizedDocument] = []
    tokens = 0
    for doc in docs:
        pool.append(doc)
        tokens += len(doc.ids)
        if tokens >= pool_tokens and len(pool) >= 2:
            if held:
                yield held
            held, pool, tokens = pool, [], 0
    if len(pool) < 2:
        held, pool = held + pool, []
    for last in (held, pool):
        if last:
            yield last


def _write_instances(
    pools: Iterable[list[TokenizedDocument]],
    config: PrepareConfig,
    index: dict[str, int],
    spec: MaskingSpec,
    writer: ShardWriter,
    seeds: tuple[np.random.SeedSequence, np.random.SeedSequence],
    timer: _Timer,
    counts: dict[str, int],
    begin: float,
) -> None:
    """Each pool's instances (masked here under masking=static) into `writer`'s shards, counted in
    `counts`; `seeds`: those of the instances and of the masks."""
    instance_rng, mask_rng = (np.random.default_rng(seed) for seed in seeds)
    for pool in pools:
        start = time.perf_counter()
        instances = create_instances(
            pool,
            config.max_seq_length,
            config.short_seq_prob,
            instance_rng,
            cls_id=index["[CLS]"],
            sep_id=index["[SEP]"],
            pad_id=index["[PAD]"],
            dupe_factor=config.dupe_factor,
            short_seq_per=config.short_seq_per,
            pair_task=config.pair_task,
        )
        timer.add("instances", start)
        start = time.perf_counter()
        arrays = _instance_arrays(instances, spec, config.masking == "static", mask_rng)
        writer.add(arrays)
        timer.add("mask_write", start)
        counts["instances"] += len(instances)
        counts["random_next"] += int(instances.nsp_labels.sum())
        elapsed = time.perf_counter() - begin
        log.info(
            "%d documents, %d tokens, %d instances; %.0f tokens/s",
            counts["documents"],
            counts["tokens"],
            counts["instances"],
            counts["tokens"] / elapsed,
        )


def _throughput(counts: dict[str, int], timer: _Timer, seconds: float) -> dict[str, Any]:
    """meta.json's rates over the whole preparation (`seconds`), and its time per stage: reading and
    segmenting is what the timed stages leave."""
    stages = dict(timer.seconds)
    stages["read_segment"] = seconds - sum(stages.values())
    return {
        "seconds": seconds,
        "tokens_per_s": counts["tokens"] / seconds,
        "documents_per_s": counts["documents"] / seconds,
        "instances_per_s": counts["instances"] / seconds,
        "stage_seconds": stages,
    }


@dataclasses.dataclass(frozen=True, kw_only=True)  # keyword-only: the flags in --help's order, required or not
class PrepareFlags:
    """The command's own flags; the data's settings are the config's keys (`PrepareConfig`)."""

    config: str | None = setting(None, help="YAML file with PrepareConfig fields")
    out: str = setting(help="output directory (new or empty)")
    print_config: bool = print_config_setting()
    overrides: tuple[str, ...] = overrides_setting("corpora.0.path=DIR")


def build_parser() -> argparse.ArgumentParser:
    return command_parser("train.prepare", __doc__, PrepareFlags, PrepareConfig)


def main(argv: Sequence[str] | None = None) -> None:
    flags = parse_command(build_parser(), PrepareFlags, argv)
    config = load_config(PrepareConfig, None if flags.config is None else Path(flags.config), flags.overrides)
    print_config_if_asked(flags.print_config, config)
    prepare(config, Path(flags.out))


if __name__ == "__main__":
    cli.run(main)
