"""Benchmark 5: the pre-training input pipeline, on one CPU core.

First `train.prepare` turns the staged WikiText-2 + Gutenberg text into shards (as
`configs/pretrain/tiny.yaml` does, BERT-base vocabulary, T = 128); its tokenisation throughput is
the `tokenize` stage's tokens per second (the Rust WordPiece tokenizer over sentence batches), and
the whole preparation's, including sentence segmentation, is reported beside it. Then
`train.data.PretrainingData` is drained for `--batches` batches from those shards, dynamic
masking included, pinned to one core: sequences per second delivered to the trainer.

    python -m benchmarks.input_pipeline --data ../shared/data
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchmarks import common
from bertjax import cli
from bertjax.settings import load_config
from train.data import PretrainingData
from train.prepare import PrepareConfig, prepare

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "pretrain" / "tiny.yaml"


def prepare_config(data: Path, max_documents: int | None) -> PrepareConfig:
    """The `data:` section of tiny.yaml, pointed at the staged data in `data`."""
    from omegaconf import OmegaConf

    overrides = [
        f"corpora.0.path={data / 'wikitext' / 'wikitext-2-raw'}",
        f"corpora.1.path={data / 'gutenberg'}",
        f"vocab_file={data / 'vocab' / 'bert-base-uncased-vocab.txt'}",
    ]
    if max_documents:
        overrides.append(f"max_documents={max_documents}")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as section:
        section.write(OmegaConf.to_yaml(OmegaConf.load(CONFIG)["data"]))
        section.flush()
        return load_config(PrepareConfig, section.name, overrides)


def drain(data_dir: Path, batch_size: int, batches: int) -> tuple[float, int]:
    """(seconds, sequences) for `batches` batches of the iterator, as the trainer pulls them."""
    iterator = PretrainingData(data_dir, batch_size, seed=0)
    next(iterator)  # opens the memory maps and draws the first permutation
    clock = time.perf_counter()
    sequences = 0
    for _ in range(batches):
        sequences += len(next(iterator)["input_ids"])
    return time.perf_counter() - clock, sequences


def run(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-input-") as scratch:
        shards = Path(scratch) / "shards"
        meta = prepare(prepare_config(Path(args.data), args.max_documents), shards)
        counts, throughput = meta["counts"], meta["throughput"]
        stages = throughput["stage_seconds"]
        prepared = common.emit(
            "input_pipeline",
            stage="prepare",
            documents=counts["documents"],
            sentences=counts["sentences"],
            tokens=counts["tokens"],
            instances=counts["instances"],
            seconds=throughput["seconds"],
            tokens_per_s=throughput["tokens_per_s"],
            tokenize_tokens_per_s=counts["tokens"] / stages["tokenize"],
            stage_seconds=stages,
            segmenter=meta["segmenter"]["name"],
        )
        # One core, as a host feeding one accelerator per core would give it.
        cores = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cores)})
        try:
            times = []
            for _ in range(args.repeat):
                seconds, sequences = drain(shards, args.batch_size, args.batches)
                times.append(seconds)
        finally:
            os.sched_setaffinity(0, cores)
        stats = common.summary(times)
        delivered = common.emit(
            "input_pipeline",
            stage="iterator",
            batch_size=args.batch_size,
            batches=args.batches,
            max_seq_length=meta["max_seq_length"],
            max_predictions=meta["max_predictions_per_seq"],
            masking=meta["masking"],
            cores=1,
            **stats,
            sequences_per_s=sequences / stats["median_s"],
            target=10_000,
        )
    return [prepared, delivered]


def main(argv: list[str] | None = None) -> None:
    p = common.arguments(__doc__.split("\n\n")[0], repeat=3)
    p.add_argument("--data", required=True, help="the staged data directory (wikitext/, gutenberg/, vocab/)")
    p.add_argument("--max-documents", type=int, help="cap the documents prepared (smoke runs)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=200)
    run(p.parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
