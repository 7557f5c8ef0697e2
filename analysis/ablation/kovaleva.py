"""The analyses of `python -m analysis.ablate` (Kovaleva et al. 2019; Michel et al. §3) as compute →
result → writer: attention patterns and features streamed batch by batch, then the classifier
under disabled and masked heads, held in memory (`compute`); `write` turns the run into the
tables, figures and run.json of a saved result (`analysis.api.ablation.ABLATE` is the tool's `Analysis`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx

from analysis.ablation.disabling import best_head_only, disable_sweep, mask_one_head
from analysis.ablation.evaluation import (
    MaskedEvaluator,
    change_counts,
    check_classifier,
    load_eval_set,
)
from analysis.ablation.features import FEATURES, feature_occurrences, feature_scores
from analysis.ablation.figures import (
    plot_disabling,
    plot_features,
    plot_mask_one_head,
    plot_pattern_shares,
)
from analysis.ablation.options import ANALYSES, KovalevaConfig  # noqa: F401 — the names callers import from here
from analysis.ablation.patterns import (
    DEFAULT_THRESHOLDS,
    PATTERNS,
    PatternThresholds,
    classify_patterns,
    column_mass,
    pattern_quantities,
    pattern_shares,
)
from analysis.common.examples import fit_max_length, resolve_tasks
from analysis.common.finite import check_finite
from analysis.common.flags import select_formats
from analysis.common.forward import Devices, at_precision, compiled, padded_batches
from analysis.common.writing import write_tables_run
from analysis.heads.finetuning import shape_differences
from analysis.tools import FigureJob
from bertjax import glue, runinfo
from bertjax.errors import UserError
from bertjax.model import Model
from bertjax.pretrained import Checkpoint
from sieves.align import EncodedSequence, encode_batch
from sieves.parse import SpacyParser, parse_examples

# What `.bertjax-output` says of this tool's `--out` (`runinfo.atomic_out`): only its kind is replaced.
ABLATE_OUTPUT = "ablate output"

# The analyses that read the classifier's predictions, so need one trained for the task.
CLASSIFIER_ANALYSES = ("disable", "mask")


def make_summariser(model: Model):
    """One jitted function per batch: forward with attentions → pattern quantities and column mass,
    so only [L, B, H] and [L, B, H, T] summaries leave the device."""
    summarise, (state,) = compiled(_jit_summariser, model)
    return lambda *arrays: summarise(state, *arrays)


def _jit_summariser(graphdef):
    @jax.jit
    def summarise(state, input_ids, attention_mask, token_type_ids, special):
        out = nnx.merge(graphdef, state)(input_ids, attention_mask, token_type_ids, output_attentions=True)
        attn = jnp.stack(out.attentions)
        real = attention_mask.astype(bool)
        return pattern_quantities(attn, real, special, token_type_ids), column_mass(attn, real)

    return summarise


@dataclasses.dataclass
class AttentionSummary:
    """Pattern counts [L, H, len(PATTERNS)] over the maps, and per feature the sum [L, H] of the
    per-sequence scores and the number of sequences having it."""

    pattern_counts: np.ndarray
    feature_sums: dict[str, np.ndarray]
    feature_sequences: dict[str, int]

    def feature_means(self) -> dict[str, np.ndarray]:
        return {f: self.feature_sums[f] / n for f, n in self.feature_sequences.items() if n}


def summarise_sequences(
    summariser,
    seqs: Sequence[EncodedSequence],
    word_texts: dict[int, list[str]] | None,
    batch_size: int,
    max_length: int,
    shape: tuple[int, int],
    thresholds: PatternThresholds = DEFAULT_THRESHOLDS,
    desc: str = "attention",
    allowed: bool = False,
) -> AttentionSummary:
    """Streams the sequences through `summariser`; features only when `word_texts` (by example
    index) are given. A pattern quantity that is not finite stops the run (`finite.check_finite`,
    `allowed` its)."""
    counts = np.zeros((*shape, len(PATTERNS)), np.int64)
    sums = {f: np.zeros(shape) for f in FEATURES}
    present = dict.fromkeys(FEATURES, 0)
    for chunk, arrays in padded_batches(seqs, batch_size, max_length, desc):
        length = arrays["input_ids"].shape[1]
        special = np.zeros((batch_size, length), bool)
        for row, seq in enumerate(chunk):
            special[row, : seq.length] = seq.special
        (v, d, b), columns = summariser(
            arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], special
        )
        used = slice(0, len(chunk))
        paired = np.array([seq.num_segments == 2 for seq in chunk])[None, :, None]
        v, d, b = (np.asarray(x)[:, used] for x in (v, d, b))
        for quantity in (v, d, b):  # [L, B, H]
            check_finite(np.moveaxis(quantity, 1, 0), "an attention pattern's quantity", desc, allowed=allowed)
        codes = classify_patterns(v, d, b, paired, thresholds)
        counts += (codes[..., None] == np.arange(len(PATTERNS))).sum(axis=1)
        if word_texts is not None:
            columns = np.asarray(columns)
            for row, seq in enumerate(chunk):
                occurrences = feature_occurrences(seq, word_texts[seq.index])
                for feature, score in feature_scores(columns[:, row], occurrences).items():
                    sums[feature] += score
                    present[feature] += 1
    return AttentionSummary(counts, sums, present)


@dataclasses.dataclass(eq=False)
class KovalevaRun:
    """An ablate run held in memory: `tables` by CSV name without `.csv` (per task patterns,
    features, disable_heads, disable_layers, mask_one_head, best_head_only; pattern_shares),
    `figures` (drawing jobs: each a function drawing one or more figures into a folder),
    `results` (run.json's `tasks`), the lines the CLI prints, `info` (run.json's provenance and
    settings, without the figures and the environment, which the writer adds), the timings so far
    and the clock the run started at."""

    config: KovalevaConfig
    tables: dict[str, pd.DataFrame]
    figures: dict[str, Callable[[Path], list[Path]]]
    results: dict[str, dict]
    lines: list[str]
    info: dict
    timings: dict[str, float]
    started: float

    def text(self) -> str:
        """What the CLI prints: each task's changes, then the pattern shares."""
        return "\n".join(self.lines)

    def job(self, name: str, out_dir: Path) -> FigureJob:
        """Drawing job `name` into `out_dir`: its function and arguments."""
        return self.figures[name], (out_dir,)

    def draw(self, job: str, out_dir: Path) -> list[Path]:
        """The figures of drawing job `job` into `out_dir`, in the `figure_formats` in force."""
        return self.figures[job](out_dir)


def compute(config: KovalevaConfig, sources: Sources, model, tokenizer, compare) -> KovalevaRun:
    """The whole analysis of `sources` in memory; writes nothing (the parse cache aside). `model`
    and `tokenizer`: `config.ckpt` loaded (a BertForSequenceClassification); `compare`: (model,
    tokenizer) of `--compare-ckpt` where the features are compared with it (`compares`), else None."""
    started = time.perf_counter()
    tasks = resolve_tasks(config.task)
    select_formats(config.figure_format)
    return _compute(config, sources, tasks, started, model, tokenizer, compare)


def write(result: KovalevaRun, directory: Path) -> dict:
    """The one writer of an ablate run (the CLI's and the API's): the tables, every figure (in the
    formats `result.config` asks for) and run.json, into `directory`; returns the run.json written."""
    return write_tables_run(result, directory)


@dataclasses.dataclass(frozen=True)
class Sources:
    """The checkpoints of an ablate run, opened: `--ckpt`'s, and `--compare-ckpt`'s where the
    features are compared (`compares`), else None."""

    checkpoint: Checkpoint
    compare: Checkpoint | None = None


def trained_heads(config: KovalevaConfig) -> bool:
    """Whether the analyses read the classifier's output (disable, mask), so need a trained one."""
    return any(a in CLASSIFIER_ANALYSES for a in config.analyses)


def compares(config: KovalevaConfig) -> bool:
    """Whether the features are compared with `--compare-ckpt`'s (patterns are of the checkpoint only)."""
    return "features" in config.analyses and bool(config.compare_ckpt)


def _parse(parser: SpacyParser, segments: list[tuple[str, ...]], indices: list[int]):
    """One parse per segment, and each example's word texts (by example index) for the features."""
    parses = parse_examples(parser, segments)
    word_texts = {
        index: [text[w.start : w.end] for text, words in zip(example, parse, strict=True) for w in words]
        for index, example, parse in zip(indices, segments, parses, strict=True)
    }
    return parses, word_texts


@dataclasses.dataclass
class _Collected:
    """What the analyses of one run add up: tables, drawing jobs and printed lines."""

    tables: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)
    figures: dict[str, Callable[[Path], list[Path]]] = dataclasses.field(default_factory=dict)
    lines: list[str] = dataclasses.field(default_factory=list)


def _attention_analyses(
    config: KovalevaConfig, task: str, examples, checkpoints: dict, parser, got: _Collected
) -> dict:
    """Patterns of the first checkpoint and features of every checkpoint, with their tables."""
    segments = [e.segments for e in examples]
    indices = [e.index for e in examples]
    parses, word_texts = _parse(parser, segments, indices) if parser else (None, None)
    summaries = {}
    for label, (model, tokenizer) in checkpoints.items():
        seqs = encode_batch(tokenizer, segments, parses, config.max_length, indices)
        shape = (model.config.num_hidden_layers, model.config.num_attention_heads)
        summaries[label] = summarise_sequences(
            make_summariser(model),
            seqs,
            word_texts,
            config.batch_size,
            config.max_length,
            shape,
            desc=f"{task} attention ({label})",
            allowed=config.allow_nonfinite,
        )
    result: dict = {}
    if "patterns" in config.analyses:
        counts = next(iter(summaries.values())).pattern_counts
        layers, heads = np.indices(counts.shape[:2])
        table = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel()})
        for k, pattern in enumerate(PATTERNS):
            table[pattern] = counts[..., k].ravel()
        got.tables[f"{task}_patterns"] = table
        result["pattern_counts"] = counts
    if "features" in config.analyses:
        means = {label: summary.feature_means() for label, summary in summaries.items()}
        rows = [
            {"checkpoint": label, "layer": layer, "head": head, "feature": feature,
             "sequences": summaries[label].feature_sequences[feature], "mean": values[layer, head]}
            for label, by_feature in means.items() for feature, values in by_feature.items()
            for layer, head in np.ndindex(values.shape)
        ]  # fmt: skip
        got.tables[f"{task}_features"] = pd.DataFrame(rows)
        got.figures[f"{task}_features"] = functools.partial(plot_features, means, task)
        result["feature_sequences"] = {label: summary.feature_sequences for label, summary in summaries.items()}
    return result


def _counts_line(task: str, what: str, counts: dict[str, int], alpha: float) -> str:
    return (
        f"{task}: {what}: {counts['raise_accuracy']} raise accuracy ({counts['raise_accuracy_significant']} "
        f"significant), {counts['lower_accuracy_by_one_point']} lower it by ≥ 1 point "
        f"({counts['lower_accuracy_by_one_point_significant']} significant; McNemar, Holm p < {alpha:g})"
    )


def _classifier_analyses(
    config: KovalevaConfig, task: str, model, tokenizer, glue_dir: Path | None, devices: Devices, got: _Collected
) -> dict:
    """`disable` and `mask` on one evaluator: one baseline pass, one compile per batch shape."""
    eval_set, _ = load_eval_set(tokenizer, task, config.split, glue_dir, config.n, config.max_length, config.batch_size)
    evaluator = MaskedEvaluator(model, eval_set, devices, config.allow_nonfinite)
    baseline = evaluator.score()
    split, alpha, names = config.split, config.alpha, eval_set.metric_names
    result: dict = {"baseline": baseline.metrics}
    if "disable" in config.analyses:
        _, heads, layers = disable_sweep(evaluator, f"{task} disable", alpha, baseline)
        got.tables[f"{task}_disable_heads"] = heads
        got.tables[f"{task}_disable_layers"] = layers
        for metric in names:
            worst = heads.loc[heads[f"{metric}_change"].idxmin()]
            got.lines.append(
                f"{task}: baseline {metric} {baseline.metrics[metric]:.4f}; one head disabled: {heads[metric].min():.4f} … "
                f"{heads[metric].max():.4f} (worst L{int(worst['layer'])} H{int(worst['head'])}); "
                f"one layer disabled: {layers[metric].min():.4f} … {layers[metric].max():.4f}"
            )
        result["disable"] = {"heads": change_counts(heads), "layers": change_counts(layers)}
        got.lines.append(_counts_line(task, "one head disabled", result["disable"]["heads"], alpha))
        got.figures[f"{task}_disable"] = functools.partial(
            plot_disabling, baseline.metrics, heads, layers, names, task, split, alpha=alpha
        )
    if "mask" in config.analyses:
        heads = mask_one_head(evaluator, baseline, alpha, desc=f"{task} mask one head")
        got.tables[f"{task}_mask_one_head"] = heads
        best = best_head_only(evaluator, baseline, names[0], alpha, desc=f"{task} keep one head")
        got.tables[f"{task}_best_head_only"] = best
        result["mask"] = {"one_head_masked": change_counts(heads), "best_head_only": change_counts(best)}
        got.lines.append(_counts_line(task, "one head masked", result["mask"]["one_head_masked"], alpha))
        got.lines.append(f"{task}: best head only, {names[0]} per layer: " + ", ".join(
            f"L{r.layer} H{r.head} {getattr(r, names[0]):.4f}" for r in best.itertuples()
        ))  # fmt: skip
        got.figures[f"{task}_mask_one_head"] = functools.partial(
            plot_mask_one_head, baseline.metrics, heads, names, task, split, alpha=alpha
        )
    result.update(
        forward_passes=evaluator.forward_passes,
        compiled_executables=evaluator.compiled_shapes(),
        batch_shapes=sorted(eval_set.shapes),
    )
    return result


def check_comparable(config: KovalevaConfig, model_config, tokenizer, other_config, other_tokenizer) -> None:
    """The features are compared head by head, on sequences each model encodes: of two sizes or
    two vocabularies, the comparison had no meaning and was made without a word."""
    differ = shape_differences(model_config, other_config)
    if differ:
        raise UserError(
            f"--compare-ckpt {config.compare_ckpt}: a model of another size than --ckpt {config.ckpt} "
            f"({', '.join(differ)}); compare a model with its own pre-trained start"
        )
    if tokenizer.get_vocab() != other_tokenizer.get_vocab():
        raise UserError(
            f"--compare-ckpt {config.compare_ckpt}: its tokenizer's vocabulary differs from --ckpt {config.ckpt}'s"
        )


@at_precision()
def _compute(
    config: KovalevaConfig, sources: Sources, tasks: list[str], started: float, model, tokenizer, compare
) -> KovalevaRun:
    timings: dict[str, float] = {}
    classifier = [a for a in config.analyses if a in CLASSIFIER_ANALYSES]
    if classifier:
        check_classifier(model, config.ckpt, sources.checkpoint, tasks)
    # With --compare-ckpt, the checkpoint is taken as the fine-tuned model and the other as its
    # pre-trained start (Kovaleva's comparison); patterns are of the checkpoint only.
    checkpoints = {"checkpoint": (model, tokenizer)}
    if compare is not None:
        check_comparable(config, model.config, tokenizer, compare[0].config, compare[1])
        checkpoints = {"fine-tuned": (model, tokenizer), "pre-trained": compare}
    config = fit_max_length(config, min(m.config.max_sequence_length for m, _ in checkpoints.values()))
    glue_dir = None if config.glue_dir is None else Path(config.glue_dir)
    # The classifier analyses run data parallel; the attention summaries (patterns, features) on
    # one device, as their per-batch summaries are small and their cost is the host-side parse.
    devices = Devices.local(config.devices)
    parser = None
    if "features" in config.analyses:
        parser = SpacyParser(config.spacy_model, cache_dir=Path(config.cache_dir).expanduser())
    results: dict[str, dict] = {}
    got = _Collected()
    pattern_counts: dict[str, np.ndarray] = {}
    for task in tasks:
        examples = glue.load_glue(task, config.split, glue_dir, config.n)
        files = glue.glue_files(task, config.split, glue_dir) if glue_dir else []
        result: dict = {
            "split": config.split,
            "examples": len(examples),
            "data_files": [{"path": str(f), "sha256": runinfo.input_sha256(f)} for f in files],
        }
        if {"patterns", "features"} & set(config.analyses):
            clock = time.perf_counter()
            attention = _attention_analyses(config, task, examples, checkpoints, parser, got)
            timings[f"{task}/attention"] = time.perf_counter() - clock
            if "pattern_counts" in attention:
                pattern_counts[task] = attention.pop("pattern_counts")
            result.update(attention)
        if classifier:
            clock = time.perf_counter()
            result["masked_evaluation"] = _classifier_analyses(config, task, model, tokenizer, glue_dir, devices, got)
            timings[f"{task}/{'+'.join(classifier)}"] = time.perf_counter() - clock
        results[task] = result
    if pattern_counts:
        shares = pattern_shares(pattern_counts)
        got.tables["pattern_shares"] = shares
        got.figures["pattern_shares"] = functools.partial(plot_pattern_shares, shares)
        for task, rows in shares.groupby("task", sort=False):
            got.lines.append(f"{task}: " + ", ".join(
                f"{r.pattern} {'not defined' if np.isnan(r.share) else f'{100 * r.share:.1f}%'}" for r in rows.itertuples()
            ))  # fmt: skip
    timings["total"] = time.perf_counter() - started
    info = {
        "config": dataclasses.asdict(config),
        "checkpoint": sources.checkpoint.describe(),
        "compare_checkpoint": None if compare is None or sources.compare is None else sources.compare.describe(),
        "model_config": model.config.to_hf_dict(),
        "pattern_thresholds": dataclasses.asdict(PatternThresholds()),
        "tasks": results,
        "figures": [],  # the writer's
        "mesh": devices.record(),
    }
    return KovalevaRun(config, got.tables, got.figures, results, got.lines, info, timings, started)
