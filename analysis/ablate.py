"""`python -m analysis.ablate`: Kovaleva et al. 2019, "Revealing the Dark Secrets of BERT": disabling
heads and layers, attention pattern classes and attention to linguistic features; and Michel et al.
2019 §3, masking one head at a time and keeping one head per layer.

- `patterns` (§4.1): every head's attention map on every example classified by fixed rules as
  vertical, diagonal, vertical+diagonal, block or heterogeneous (see `classify_patterns`); the share
  of each class over heads × examples per task (their Figure 2).
- `features` (§4.4): per head, the attention all tokens pay to nouns, verbs, pronouns, subjects,
  objects, negation words, [CLS] and [SEP] (see `feature_scores`), for the checkpoint and, with
  `--compare-ckpt`, for a second one (the pre-trained model).
- `disable` (§4.6): the metrics with each single head disabled (uniform attention over the real
  tokens), and with each whole layer disabled, against the baseline; CSVs and heatmaps.
- `mask` (Michel §3.1–3.2): the metrics with one head masked (ξ_h = 0), for every head (their
  Table 1), and per layer with only its best head kept (their Table 2).

`disable` and `mask` compare each ablation with the unablated model by the exact McNemar test of
per-example accuracy, Holm-adjusted over the rows of each table.

Attention is streamed batch by batch: only per-map summaries leave the device.

Outputs are written into a temporary sibling of `--out` and renamed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx
from matplotlib import colormaps
from matplotlib.colors import CenteredNorm
from matplotlib.figure import Figure
from tqdm import tqdm

from analysis import plots
from analysis.ablation import (
    MaskedEvaluator,
    Scored,
    add_holm,
    change_counts,
    check_classifier,
    compare,
    full_mask,
    head_heatmap,
    load_eval_set,
    no_disable,
)
from analysis.plots import save_figure
from analysis.roles import fit_max_length, padded_batches, resolve_tasks
from bertjax import cli, glue, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import from_pretrained, load_tokenizer, resolve
from sieves.align import EncodedSequence, encode_batch
from sieves.parse import SpacyParser

ANALYSES = ("patterns", "features", "disable", "mask")
# The analyses that read the classifier's predictions, so need one trained for the task.
CLASSIFIER_ANALYSES = ("disable", "mask")
PATTERNS = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")
PATTERN_COLOURS = ("#a50f15", "#08519c", "#6a51a3", "#31a354", "#969696")


@dataclasses.dataclass(frozen=True)
class PatternThresholds:
    """The rules' thresholds, on per-map quantities averaged over the word (non-special) query rows:
    v, the mass on [CLS] and [SEP]; d, the mass on the word keys at t − 1, t and t + 1; b, the share
    of the mass on words that stays in the query's own segment, corrected for chance (0: as much
    as uniform attention over the words keeps there, 1: all of it)."""

    structured: float = 0.5  # v + d at least this: vertical, diagonal or vertical+diagonal
    minor_share: float = 0.25  # the smaller of v, d under this share of v + d: the pure class
    block: float = 0.6  # b at least this (two-segment inputs only): block; a raw share of 0.8 on equal segments


def pattern_quantities(attn, real, special, segment):
    """(v, d, b) of every map, each [..., B, H], from attention [..., B, H, T, T].

    `real`, `special` [B, T] bool and `segment` [B, T] int (token type). Query rows are the real
    non-special tokens; keys outside `real` carry no mass. Works on numpy and jax arrays alike.

    d counts t itself: a head that attends to its own token draws the main diagonal (without it,
    such a head had v = d = 0 and a raw in-segment share of 1, and was called block). b is
    chance-corrected, (share − share₀) / (1 − share₀) with share₀ = Σ_seg |seg|² / |words|², the
    share uniform attention over the words keeps in-segment: on a pair of 5 and 45 words share₀ is
    0.82, so a uniform head passed a raw threshold of 0.8 as block.
    """
    xp = jnp if isinstance(attn, jax.Array) else np
    length = attn.shape[-1]
    words = real & ~special
    word_keys = words[:, None, None, :]
    v_rows = (attn * (real & special)[:, None, None, :]).sum(-1)
    positions = xp.arange(length)
    neighbours = xp.abs(positions[:, None] - positions[None, :]) <= 1
    d_rows = (attn * (neighbours & word_keys)).sum(-1)
    same_segment = segment[:, :, None] == segment[:, None, :]
    w_rows = (attn * (same_segment[:, None] & word_keys)).sum(-1)
    u_rows = (attn * word_keys).sum(-1)
    rows = words[:, None, :]
    count = xp.maximum(rows.sum(-1), 1)
    mean = lambda x: (x * rows).sum(-1) / count
    word_mass = mean(u_rows)
    share = xp.where(word_mass > 0, mean(w_rows) / xp.where(word_mass > 0, word_mass, 1.0), 0.0)
    n_words = xp.maximum(words.sum(-1), 1)
    own_words = (same_segment & words[:, None, :]).sum(-1) / n_words[:, None]  # [B, T]
    chance = ((own_words * words).sum(-1) / n_words)[:, None]  # [B, 1]: one segment gives 1
    split = chance < 1
    corrected = xp.where(split, (share - chance) / xp.where(split, 1 - chance, 1.0), 0.0)
    return mean(v_rows), mean(d_rows), corrected


def classify_patterns(v, d, b, paired, t: PatternThresholds = PatternThresholds()) -> np.ndarray:
    """Pattern index (into PATTERNS) of every map from its (v, d, b); arrays of any one shape, and
    `paired` (two-segment input) a bool broadcastable to it.

    1. v + d ≥ structured: vertical if d < minor_share·(v + d), diagonal if v < minor_share·(v + d),
       otherwise vertical+diagonal;
    2. else, for two-segment inputs, block if b (chance-corrected) ≥ block;
    3. else heterogeneous. Block is not defined for single-segment inputs (SST-2).
    """
    v, d, b = (np.asarray(x, float) for x in (v, d, b))
    structured = v + d
    codes = np.full(v.shape, PATTERNS.index("heterogeneous"))
    codes[np.broadcast_to(paired, v.shape) & (b >= t.block)] = PATTERNS.index("block")
    mixed = structured >= t.structured
    codes[mixed] = PATTERNS.index("vertical+diagonal")
    codes[mixed & (v < t.minor_share * structured)] = PATTERNS.index("diagonal")
    codes[mixed & (d < t.minor_share * structured)] = PATTERNS.index("vertical")
    return codes


def column_mass(attn, real):
    """[..., B, H, T]: the attention each key receives from all real query rows, over n."""
    rows = real[:, None, :, None]
    n = real.sum(-1)[:, None, None]
    return (attn * rows).sum(-2) / n


FEATURES = ("noun", "verb", "pronoun", "subject", "object", "negation", "[CLS]", "[SEP]")
NOUN_TAGS = frozenset({"NOUN", "PROPN"})
SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass", "nsubj:pass"})
# UD `obj` is read as `dobj`; spaCy marks indirect objects `dative`.
OBJECT_DEPS = frozenset({"dobj", "iobj", "dative"})
NEGATIONS = frozenset({"not", "n't", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "cannot"})


def word_features(text: str, pos: str, dep: str) -> set[str]:
    """The word-level features of one parsed word; negation by whole-word match on its text."""
    found = set()
    if pos in NOUN_TAGS:
        found.add("noun")
    if pos == "VERB":
        found.add("verb")
    if pos == "PRON":
        found.add("pronoun")
    if dep in SUBJECT_DEPS:
        found.add("subject")
    if dep in OBJECT_DEPS:
        found.add("object")
    if text.lower().replace("’", "'") in NEGATIONS:
        found.add("negation")
    return found


def feature_occurrences(seq: EncodedSequence, word_texts: Sequence[str]) -> dict[str, list[np.ndarray]]:
    """Per feature, the piece positions of each occurrence (a word's pieces; each [CLS]/[SEP]).

    Words cut away by truncation own no piece and are skipped.
    """
    found: dict[str, list[np.ndarray]] = {f: [] for f in FEATURES}
    for word, (text, pos, dep) in enumerate(zip(word_texts, seq.word_pos, seq.word_dep, strict=True)):
        pieces = np.flatnonzero(seq.word_ids == word)
        if pieces.size:
            for feature in word_features(text, pos, dep):
                found[feature].append(pieces)
    found["[CLS]"] = [np.array([i]) for i in np.flatnonzero(seq.is_cls)]
    found["[SEP]"] = [np.array([i]) for i in np.flatnonzero(seq.is_sep)]
    return found


def feature_scores(columns: np.ndarray, occurrences: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    """Kovaleva's §4.4 score of one sequence: for each occurrence, the attention all real tokens
    pay to its pieces, over n (`column_mass`, [L, H, T]); the maximum over occurrences, [L, H].
    Features absent from the sequence are left out."""
    return {
        feature: np.max([columns[..., pieces].sum(-1) for pieces in where], axis=0)
        for feature, where in occurrences.items()
        if where
    }


@dataclasses.dataclass(frozen=True)
class KovalevaConfig:
    """Everything that decides the numbers of a run; saved in run.json."""

    ckpt: str
    task: str = "mrpc"
    step: int | None = None
    glue_dir: str | None = None
    split: str = "dev"
    n: int | None = None
    max_length: int = 128
    batch_size: int = 32
    analyses: tuple[str, ...] = ANALYSES
    alpha: float = 0.05
    compare_ckpt: str | None = None
    compare_step: int | None = None
    spacy_model: str | None = None
    cache_dir: str = str(cli.CACHE_ROOT)
    out: str = "ablate_out"
    overwrite: bool = False
    figure_format: str = "png"

    def __post_init__(self) -> None:
        if self.n is not None and self.n < 1:
            raise UserError(f"--n must be at least 1, got {self.n}")
        if not 0.0 < self.alpha < 1.0:
            raise UserError(f"--alpha must be in (0, 1), got {self.alpha}")
        unknown = [a for a in self.analyses if a not in ANALYSES]
        if unknown or not self.analyses:
            raise UserError(
                f"--analyses: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ANALYSES)}"
            )


def make_summariser(model: nnx.Module):
    """One jitted function per batch: forward with attentions → pattern quantities and column mass,
    so only [L, B, H] and [L, B, H, T] summaries leave the device."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def summarise(state, input_ids, attention_mask, token_type_ids, special):
        out = nnx.merge(graphdef, state)(input_ids, attention_mask, token_type_ids, output_attentions=True)
        attn = jnp.stack(out.attentions)
        real = attention_mask.astype(bool)
        return pattern_quantities(attn, real, special, token_type_ids), column_mass(attn, real)

    return lambda *arrays: summarise(state, *arrays)


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
    thresholds: PatternThresholds = PatternThresholds(),
    desc: str = "attention",
) -> AttentionSummary:
    """Streams the sequences through `summariser`; features only when `word_texts` (by example
    index) are given."""
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


def pattern_shares(counts: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per task, the share of each class over all heads × examples; block's is NaN (undefined, not
    0%) for single-sentence tasks."""
    rows = []
    for task, per_head in counts.items():
        totals = per_head.sum(axis=(0, 1))
        paired = glue.task_spec(task).text_b is not None
        for pattern, maps in zip(PATTERNS, totals, strict=True):
            share = maps / totals.sum() if paired or pattern != "block" else np.nan
            rows.append({"task": task, "pattern": pattern, "maps": int(maps), "share": share})
    return pd.DataFrame(rows)


def plot_pattern_shares(shares: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Kovaleva's Figure 2: per task, the % of head × example maps in each pattern class."""
    tasks = list(pd.unique(shares["task"]))
    fig = Figure(figsize=(2.0 + 1.3 * len(tasks), 4.4), layout="constrained")
    ax = fig.add_subplot()
    bottom = np.zeros(len(tasks))
    for pattern, colour in zip(PATTERNS, PATTERN_COLOURS, strict=True):
        # NaN (block on single sentences) stacks as nothing.
        share = 100 * np.nan_to_num(shares[shares["pattern"] == pattern].set_index("task").loc[tasks, "share"].to_numpy())
        bars = ax.bar(tasks, share, bottom=bottom, color=colour, label=pattern, width=0.6)
        texts = [f"{x:.0f}%" if x >= 4 else "" for x in share]
        ax.bar_label(bars, labels=texts, label_type="center", fontsize=7, color="white")
        bottom += share
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of maps (heads × examples)")
    ax.set_title("attention pattern classes", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, out_dir, "pattern_shares")


def plot_features(means: dict[str, dict[str, np.ndarray]], task: str, out_dir: Path) -> list[Path]:
    """One row per feature: the mean score of every head per checkpoint, and their difference."""
    labels = list(means)
    features = [f for f in FEATURES if all(f in means[c] for c in labels)]
    columns = labels + (["difference"] if len(labels) == 2 else [])
    n_layers, n_heads = next(iter(means[labels[0]].values())).shape
    size = (1.0 + len(columns) * (0.6 + 0.22 * n_heads), 0.6 + len(features) * (0.5 + 0.22 * n_layers))
    fig = Figure(figsize=size, layout="constrained")
    grid = fig.subplots(len(features), len(columns), squeeze=False)
    for r, feature in enumerate(features):
        values = [means[c][feature] for c in labels]
        top = max(float(np.max(x)) for x in values)
        for c, column in enumerate(columns):
            ax = grid[r, c]
            if column == "difference":
                diff = values[0] - values[1]
                norm = CenteredNorm(0.0, max(float(np.abs(diff).max()), 1e-9))
                image = ax.imshow(diff, cmap=colormaps["RdBu"], norm=norm)
            else:
                image = ax.imshow(values[c], cmap=colormaps["viridis"], vmin=0.0, vmax=top)
            fig.colorbar(image, ax=ax, shrink=0.8)
            ax.set_xticks(range(n_heads))
            ax.set_yticks(range(n_layers))
            ax.tick_params(labelsize=5, length=1)
            ax.set_title(f"{feature}: {column}", fontsize=7)
        grid[r, 0].set_ylabel("layer", fontsize=7)
    for ax in grid[-1]:
        ax.set_xlabel("head", fontsize=7)
    fig.suptitle(
        f"{task}: attention paid to each feature (max over occurrences, over n; mean over sequences)", fontsize=9
    )
    return save_figure(fig, out_dir, f"{task}_features")


def disable_sweep(
    evaluator: MaskedEvaluator, desc: str = "disable", alpha: float = 0.05, baseline: Scored | None = None
) -> tuple[dict[str, float], pd.DataFrame, pd.DataFrame]:
    """Baseline metrics, then one row per disabled head and one per disabled layer.

    Each row holds every metric, its change from the baseline (`<metric>_change`) and the McNemar
    test of accuracy against the baseline (`ablation.compare`), Holm-adjusted over the L·H head rows
    and, separately, over the L layer rows. `baseline` saves its pass when the caller has it.
    """
    n_layers, n_heads = evaluator.n_layers, evaluator.n_heads
    if baseline is None:
        baseline = evaluator.score()
    head_rows, layer_rows = [], []
    with tqdm(total=n_layers * n_heads + n_layers, desc=desc, unit="mask") as progress:
        for layer in range(n_layers):
            for head in range(n_heads):
                disable = no_disable(n_layers, n_heads)
                disable[layer, head] = True
                head_rows.append({"layer": layer, "head": head, **compare(evaluator.score(disable=disable), baseline)})
                progress.update()
        for layer in range(n_layers):
            disable = no_disable(n_layers, n_heads)
            disable[layer] = True
            layer_rows.append({"layer": layer, **compare(evaluator.score(disable=disable), baseline)})
            progress.update()
    return baseline.metrics, add_holm(pd.DataFrame(head_rows), alpha), add_holm(pd.DataFrame(layer_rows), alpha)


def mask_one_head(evaluator: MaskedEvaluator, baseline: Scored, alpha: float, desc: str = "mask") -> pd.DataFrame:
    """Michel's Table 1: one row per head, the metrics with that head alone masked (ξ_h = 0), their
    changes and the McNemar test against the baseline, Holm-adjusted over the L·H rows."""
    shape = (evaluator.n_layers, evaluator.n_heads)
    rows = []
    for layer, head in tqdm(list(np.ndindex(shape)), desc=desc, unit="mask"):
        mask = full_mask(*shape)
        mask[layer, head] = 0.0
        rows.append({"layer": layer, "head": head, **compare(evaluator.score(head_mask=mask), baseline)})
    return add_holm(pd.DataFrame(rows), alpha)


def best_head_only(
    evaluator: MaskedEvaluator, baseline: Scored, metric: str, alpha: float, desc: str = "keep one head"
) -> pd.DataFrame:
    """Michel's Table 2: for each layer, every head is tried as the only one left unmasked in it (the
    other layers intact); the row is the head with the highest `metric` (ties: the lowest index),
    with its metrics, changes and McNemar test, Holm-adjusted over the L rows.

    The head is chosen on the same examples it is scored on, and the test does not account for that
    choice among H heads."""
    shape = (evaluator.n_layers, evaluator.n_heads)
    rows = []
    with tqdm(total=shape[0] * shape[1], desc=desc, unit="mask") as progress:
        for layer in range(shape[0]):
            kept = []
            for head in range(shape[1]):
                mask = full_mask(*shape)
                mask[layer] = 0.0
                mask[layer, head] = 1.0
                kept.append(evaluator.score(head_mask=mask))
                progress.update()
            best = max(range(shape[1]), key=lambda h: kept[h].metrics[metric])
            rows.append({"layer": layer, "head": best, **compare(kept[best], baseline)})
    return add_holm(pd.DataFrame(rows), alpha)


def head_grid(table: pd.DataFrame, column: str, n_layers: int, n_heads: int) -> np.ndarray:
    grid = np.full((n_layers, n_heads), np.nan)
    grid[table["layer"].to_numpy(), table["head"].to_numpy()] = table[column].to_numpy()
    return grid


def significance_marks(
    table: pd.DataFrame, metric: str, n_layers: int, n_heads: int, alpha: float
) -> tuple[np.ndarray | None, str]:
    """The cells to box on `metric`'s change map and the title's note: the McNemar test is of
    accuracy, so only accuracy's map is marked."""
    if metric != "accuracy":
        return None, ""
    marked = head_grid(table, "significant_holm", n_layers, n_heads) == 1
    return marked, f"; boxed: McNemar Holm p < {alpha:g}"


def plot_disabling(
    baseline: dict[str, float], heads: pd.DataFrame, layers: pd.DataFrame, metric_names, task: str, split: str,
    out_dir: Path, alpha: float = 0.05,
) -> list[Path]:  # fmt: skip
    """Per metric: the metric with each head disabled, its change, and the change per layer."""
    n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    paths: list[Path] = []
    for metric in metric_names:
        base = f"baseline {metric} {baseline[metric]:.4f}"
        marked, note = significance_marks(heads, metric, n_layers, n_heads, alpha)
        paths += head_heatmap(
            head_grid(heads, metric, n_layers, n_heads), f"{task}: {split} {metric} with one head disabled ({base})",
            metric, out_dir, f"{task}_disable_heads_{metric}",
        )  # fmt: skip
        paths += head_heatmap(
            head_grid(heads, f"{metric}_change", n_layers, n_heads),
            f"{task}: change in {split} {metric} when one head is disabled\n({base}{note})",
            f"{metric} − baseline", out_dir, f"{task}_disable_heads_{metric}_change", diverging=True, marked=marked,
        )  # fmt: skip
        paths += head_heatmap(
            layers[f"{metric}_change"].to_numpy()[:, None],
            f"{task}: layer disabled\n({base})", f"{metric} − baseline", out_dir,
            f"{task}_disable_layers_{metric}_change", diverging=True, columns=None,
        )  # fmt: skip
    return paths


def plot_mask_one_head(
    baseline: dict[str, float], heads: pd.DataFrame, metric_names, task: str, split: str, out_dir: Path, alpha: float
) -> list[Path]:
    """Per metric: the L × H map of its change when one head is masked (Michel's Table 1)."""
    n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    paths: list[Path] = []
    for metric in metric_names:
        marked, note = significance_marks(heads, metric, n_layers, n_heads, alpha)
        paths += head_heatmap(
            head_grid(heads, f"{metric}_change", n_layers, n_heads),
            f"{task}: change in {split} {metric} when one head is masked\n(baseline {baseline[metric]:.4f}{note})",
            f"{metric} − baseline", out_dir, f"{task}_mask_one_head_{metric}_change", diverging=True, marked=marked,
        )  # fmt: skip
    return paths


def run(config: KovalevaConfig) -> dict[str, dict]:
    """The whole analysis; returns per task what run.json records about it."""
    started = time.perf_counter()
    tasks = resolve_tasks(config.task)
    formats = plots.select_formats(config.figure_format)
    with runinfo.atomic_out(config.out, config.overwrite) as tmp, plots.figure_formats(formats):
        return _run(config, tasks, tmp, started)


def _load(ckpt: str, step: int | None, trained_heads: bool = False):
    # The classifier class loads fine-tuned runs and pre-trained encoders alike (a missing
    # classifier is initialised and unused: patterns and features read attention only; disabling
    # and masking read the classifier's accuracy, so they need a trained one).
    model = from_pretrained(ckpt, "BertForSequenceClassification", step=step, trained_heads=trained_heads)
    return model, load_tokenizer(ckpt, step=step)


def _parse(parser: SpacyParser, segments: list[tuple[str, ...]], indices: list[int]):
    """One parse per segment, and each example's word texts (by example index) for the features."""
    flat = iter(parser.parse([text for example in segments for text in example]))
    parses = [tuple(next(flat) for _ in example) for example in segments]
    word_texts = {
        index: [text[w.start : w.end] for text, words in zip(example, parse, strict=True) for w in words]
        for index, example, parse in zip(indices, segments, parses, strict=True)
    }
    return parses, word_texts


def _attention_analyses(config: KovalevaConfig, task: str, examples, checkpoints: dict, parser, tmp: Path) -> dict:
    """Patterns of the first checkpoint and features of every checkpoint; writes their tables."""
    segments = [(e.text_a,) if e.text_b is None else (e.text_a, e.text_b) for e in examples]
    indices = [e.index for e in examples]
    parses, word_texts = _parse(parser, segments, indices) if parser else (None, None)
    summaries = {}
    for label, (model, tokenizer) in checkpoints.items():
        seqs = encode_batch(tokenizer, segments, parses, config.max_length, indices)
        shape = (model.config.num_hidden_layers, model.config.num_attention_heads)
        summaries[label] = summarise_sequences(
            make_summariser(model), seqs, word_texts, config.batch_size, config.max_length, shape, desc=f"{task} attention ({label})"
        )
    result: dict = {"figures": []}
    if "patterns" in config.analyses:
        counts = next(iter(summaries.values())).pattern_counts
        layers, heads = np.indices(counts.shape[:2])
        table = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel()})
        for k, pattern in enumerate(PATTERNS):
            table[pattern] = counts[..., k].ravel()
        table.to_csv(tmp / f"{task}_patterns.csv", index=False)
        result["pattern_counts"] = counts
    if "features" in config.analyses:
        means = {label: summary.feature_means() for label, summary in summaries.items()}
        rows = [
            {"checkpoint": label, "layer": layer, "head": head, "feature": feature,
             "sequences": summaries[label].feature_sequences[feature], "mean": values[layer, head]}
            for label, by_feature in means.items() for feature, values in by_feature.items()
            for layer, head in np.ndindex(values.shape)
        ]  # fmt: skip
        pd.DataFrame(rows).to_csv(tmp / f"{task}_features.csv", index=False)
        result["figures"] += plot_features(means, task, tmp)
        result["feature_sequences"] = {label: summary.feature_sequences for label, summary in summaries.items()}
    return result


def _print_counts(task: str, what: str, counts: dict[str, int], alpha: float) -> None:
    print(
        f"{task}: {what}: {counts['raise_accuracy']} raise accuracy ({counts['raise_accuracy_significant']} "
        f"significant), {counts['lower_accuracy_by_one_point']} lower it by ≥ 1 point "
        f"({counts['lower_accuracy_by_one_point_significant']} significant; McNemar, Holm p < {alpha:g})"
    )


def _classifier_analyses(config: KovalevaConfig, task: str, model, tokenizer, glue_dir: Path | None, tmp: Path) -> dict:
    """`disable` and `mask` on one evaluator: one baseline pass, one compile per batch shape."""
    eval_set, _ = load_eval_set(tokenizer, task, config.split, glue_dir, config.n, config.max_length, config.batch_size)
    evaluator = MaskedEvaluator(model, eval_set)
    baseline = evaluator.score()
    split, alpha, names = config.split, config.alpha, eval_set.metric_names
    result: dict = {"baseline": baseline.metrics, "figures": []}
    if "disable" in config.analyses:
        _, heads, layers = disable_sweep(evaluator, f"{task} disable", alpha, baseline)
        heads.to_csv(tmp / f"{task}_disable_heads.csv", index=False)
        layers.to_csv(tmp / f"{task}_disable_layers.csv", index=False)
        for metric in names:
            worst = heads.loc[heads[f"{metric}_change"].idxmin()]
            print(
                f"{task}: baseline {metric} {baseline.metrics[metric]:.4f}; one head disabled: {heads[metric].min():.4f} … "
                f"{heads[metric].max():.4f} (worst L{int(worst['layer'])} H{int(worst['head'])}); "
                f"one layer disabled: {layers[metric].min():.4f} … {layers[metric].max():.4f}"
            )
        result["disable"] = {"heads": change_counts(heads), "layers": change_counts(layers)}
        _print_counts(task, "one head disabled", result["disable"]["heads"], alpha)
        result["figures"] += plot_disabling(baseline.metrics, heads, layers, names, task, split, tmp, alpha)
    if "mask" in config.analyses:
        heads = mask_one_head(evaluator, baseline, alpha, desc=f"{task} mask one head")
        heads.to_csv(tmp / f"{task}_mask_one_head.csv", index=False)
        best = best_head_only(evaluator, baseline, names[0], alpha, desc=f"{task} keep one head")
        best.to_csv(tmp / f"{task}_best_head_only.csv", index=False)
        result["mask"] = {"one_head_masked": change_counts(heads), "best_head_only": change_counts(best)}
        _print_counts(task, "one head masked", result["mask"]["one_head_masked"], alpha)
        print(f"{task}: best head only, {names[0]} per layer: " + ", ".join(
            f"L{r.layer} H{r.head} {getattr(r, names[0]):.4f}" for r in best.itertuples()
        ))  # fmt: skip
        result["figures"] += plot_mask_one_head(baseline.metrics, heads, names, task, split, tmp, alpha)
    result.update(
        forward_passes=evaluator.forward_passes,
        compiled_executables=evaluator.compiled_shapes(),
        batch_shapes=sorted(eval_set.shapes),
    )
    return result


def _run(config: KovalevaConfig, tasks: list[str], tmp: Path, started: float) -> dict[str, dict]:
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    classifier = [a for a in config.analyses if a in CLASSIFIER_ANALYSES]
    model, tokenizer = _load(config.ckpt, config.step, trained_heads=bool(classifier))
    if classifier:
        check_classifier(model, config.ckpt, config.step, tasks)
    # With --compare-ckpt, the checkpoint is taken as the fine-tuned model and the other as its
    # pre-trained start (Kovaleva's comparison); patterns are of the checkpoint only.
    checkpoints = {"checkpoint": (model, tokenizer)}
    if "features" in config.analyses and config.compare_ckpt:
        checkpoints = {"fine-tuned": (model, tokenizer), "pre-trained": _load(config.compare_ckpt, config.compare_step)}
    timings["load_model"] = time.perf_counter() - clock
    config = fit_max_length(config, min(m.config.max_position_embeddings for m, _ in checkpoints.values()))
    glue_dir = None if config.glue_dir is None else Path(config.glue_dir)
    parser = None
    if "features" in config.analyses:
        parser = SpacyParser(config.spacy_model, cache_dir=Path(config.cache_dir).expanduser())
    results: dict[str, dict] = {}
    figures: list[Path] = []
    pattern_counts: dict[str, np.ndarray] = {}
    for task in tasks:
        examples = glue.load_glue(task, config.split, glue_dir, config.n)
        files = glue.glue_files(task, config.split, glue_dir) if glue_dir else []
        result: dict = {
            "split": config.split,
            "examples": len(examples),
            "data_files": [{"path": str(f), "sha256": runinfo.sha256(f)} for f in files],
        }
        if {"patterns", "features"} & set(config.analyses):
            clock = time.perf_counter()
            attention = _attention_analyses(config, task, examples, checkpoints, parser, tmp)
            timings[f"{task}/attention"] = time.perf_counter() - clock
            figures += attention.pop("figures")
            if "pattern_counts" in attention:
                pattern_counts[task] = attention.pop("pattern_counts")
            result.update(attention)
        if classifier:
            clock = time.perf_counter()
            result["masked_evaluation"] = _classifier_analyses(config, task, model, tokenizer, glue_dir, tmp)
            timings[f"{task}/{'+'.join(classifier)}"] = time.perf_counter() - clock
            figures += result["masked_evaluation"].pop("figures")
        results[task] = result
    if pattern_counts:
        shares = pattern_shares(pattern_counts)
        shares.to_csv(tmp / "pattern_shares.csv", index=False)
        figures += plot_pattern_shares(shares, tmp)
        for task, rows in shares.groupby("task", sort=False):
            print(f"{task}: " + ", ".join(
                f"{r.pattern} {'not defined' if np.isnan(r.share) else f'{100 * r.share:.1f}%'}" for r in rows.itertuples()
            ))  # fmt: skip
    timings["total"] = time.perf_counter() - started
    runinfo.write_run_json(
        tmp,
        {
            "config": dataclasses.asdict(config),
            "checkpoint": resolve(config.ckpt, config.step).describe(),
            "compare_checkpoint": (
                resolve(config.compare_ckpt, config.compare_step).describe() if "pre-trained" in checkpoints else None
            ),
            "model_config": model.config.to_hf_dict(),
            "pattern_thresholds": dataclasses.asdict(PatternThresholds()),
            "tasks": results,
            "figures": sorted(p.name for p in figures),
            "timings_s": {k: round(v, 3) for k, v in timings.items()},
        },
    )
    return results


def parse_args(argv: list[str] | None) -> KovalevaConfig:
    p = argparse.ArgumentParser(prog="python -m analysis.ablate", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="fine-tuned classifier: bertjax run workdir, HF directory or hub id")
    p.add_argument("--step", type=int, help="checkpoint step of a bertjax run (default: latest)")
    p.add_argument("--task", default="mrpc", help="qnli, qqp, mrpc, sst2, a comma-separated list, or all")
    p.add_argument("--glue-dir", help="local GLUE directory (glue_data/<TASK>/<split>.tsv); default: the hub")
    p.add_argument("--split", default="dev", choices=["train", "dev", "validation"])
    p.add_argument("--n", type=int, help="first N examples of the split (default: all)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--analyses", default=",".join(ANALYSES), help=f"comma-separated subset of {','.join(ANALYSES)}")
    p.add_argument("--alpha", type=float, default=0.05, help="disable, mask: level of the Holm McNemar tests")
    p.add_argument("--compare-ckpt", help="features: a second checkpoint to compare with (the pre-trained model)")
    p.add_argument("--compare-step", type=int, help="checkpoint step of --compare-ckpt's run")
    p.add_argument("--spacy-model", help="spaCy pipeline for the features (default en_core_web_sm)")
    p.add_argument("--cache-dir", default=KovalevaConfig.cache_dir, help="where parses are cached")
    p.add_argument("--out", default="ablate_out")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--figure-format", default="png", help="comma-separated subset of png,svg,pdf (default: png)")
    a = p.parse_args(argv)
    return KovalevaConfig(
        ckpt=a.ckpt, task=a.task, step=a.step, glue_dir=a.glue_dir, split=a.split, n=a.n,
        max_length=a.max_length, batch_size=a.batch_size, analyses=tuple(x for x in a.analyses.split(",") if x),
        alpha=a.alpha, compare_ckpt=a.compare_ckpt, compare_step=a.compare_step, spacy_model=a.spacy_model, cache_dir=a.cache_dir,
        out=a.out, overwrite=a.overwrite, figure_format=a.figure_format,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
