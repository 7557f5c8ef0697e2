"""The analyses of Clark et al. 2019 end to end (`python -m analysis.clark`): inputs (WikiText
segment pairs, a GLUE task, UD English-EWT, GAP), the surface, cluster, gradient, dependency-head,
probe and coreference analyses, their tables and figures (`compute`; `write` writes a saved
result; `analysis.api.attention.CLARK` is the tool's `Analysis`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from analysis.attention import coref, depheads, gradients, probes, surface
from analysis.attention.options import ANALYSES, ClarkConfig  # noqa: F401 — the names callers import from here
from analysis.attention.wordattn import iter_word_attention, make_word_attention_fn
from analysis.common.examples import fit_max_length
from analysis.common.figures import save_figure
from analysis.common.flags import select_formats
from analysis.common.forward import at_precision
from analysis.common.writing import write_tables_run
from analysis.heads.report import readable_checkpoint
from analysis.tools import FigureJob
from bertjax import glue, runinfo, wikitext
from bertjax.errors import UserError
from bertjax.model import BertForPreTraining
from bertjax.pretrained import Checkpoint
from sieves import depattn
from sieves.align import EncodedSequence, encode_batch
from sieves.parse import Parse, Word, read_conllu

# What `.bertjax-output` says of this tool's `--out` (`runinfo.atomic_out`): only its kind is replaced.
CLARK_OUTPUT = "clark output"

EWT_FILES = {split: f"en_ewt-ud-{split}.conllu" for split in ("train", "dev", "test")}

PUNCT_TOKENS = (".", ",")

GAP_FILES = {"dev": "gap-development.tsv", "test": "gap-test.tsv"}


def wikitext_segment_pairs(text: str, n: int) -> list[tuple[str, str]]:
    """The first n pairs of consecutive paragraphs of one article (paragraphs 1+2, 3+4, ...).

    Articles start at level-1 headings (` = T = `); section headings and blank lines are not
    paragraphs. WikiText's number escapes (`1 @,@ 000`) are undone, as real text has no `@`.
    """
    pairs: list[tuple[str, str]] = []
    for article in wikitext.articles(text):
        for first in range(0, len(article) - 1, 2):
            pairs.append((article[first], article[first + 1]))
            if len(pairs) == n:
                return pairs
    return pairs


def _read(path: Path) -> str:
    try:
        return runinfo.read_input(path).decode("utf-8")  # run.json's sha256 is of these bytes
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error})") from None


def with_segment_ids(seqs: list[EncodedSequence], segment_ids: str) -> list[EncodedSequence]:
    """The sequences with the token type ids the model reads (`SEGMENT_IDS`); the segments
    themselves ([SEP] positions, which pieces are A and B) do not change."""
    if segment_ids == "pairs":
        return seqs
    return [dataclasses.replace(s, token_type_ids=np.zeros_like(s.token_type_ids)) for s in seqs]


def input_sequences(config: ClarkConfig, tokenizer) -> tuple[list, list[Path]]:
    """Encoded inputs of the surface, cluster and gradient analyses, and the files they came from."""
    if config.inputs == "wikitext":
        pairs = wikitext_segment_pairs(_read(config.wikitext_file), config.surface_n)
        if not pairs:
            raise UserError(f"{config.wikitext_file}: no pair of paragraphs found")
        seqs, files = encode_batch(tokenizer, pairs, None, config.max_length), [config.wikitext_file]
    else:
        glue_dir = None if config.glue_dir is None else Path(config.glue_dir)
        examples = glue.load_glue(config.inputs, config.split, glue_dir, config.surface_n)
        segments = [e.segments for e in examples]
        files = glue.glue_files(config.inputs, config.split, glue_dir) if glue_dir else []
        seqs = encode_batch(tokenizer, segments, None, config.max_length, [e.index for e in examples])
    return with_segment_ids(seqs, config.segment_ids), files


def joined_words(text: str, words: Parse) -> tuple[str, Parse]:
    """The sentence as the authors' `extract_attention.py` feeds it, `" ".join(words)` (so "don't"
    becomes "do n't"), with each word's span in that text. A word's form is its span of the
    original text (multiword tokens that spell their words, as English ones do, give each word
    its own part)."""
    forms = [text[word.start : word.end] for word in words]
    joined, start, spans = " ".join(forms), 0, []
    for form in forms:
        spans.append((start, start + len(form)))
        start += len(form) + 1
    return joined, tuple(Word(a, b, w.dep, w.head, w.pos) for (a, b), w in zip(spans, words, strict=True))


def ewt_sequences(config: ClarkConfig, tokenizer, split: str, limit: int | None) -> list:
    path = config.ewt_dir / EWT_FILES[split]
    if not path.is_file():
        raise UserError(f"{path}: no such file (UD English-EWT is expected under --data-dir)")
    sentences = read_conllu(path, limit=limit)
    if config.word_text == "joined":
        sentences = [joined_words(text, words) for text, words in sentences]
    texts = [(text,) for text, _ in sentences]
    return encode_batch(tokenizer, texts, [(words,) for _, words in sentences], config.max_length)


def head_labels(layers: int, heads: int) -> list[str]:
    return [f"{layer}-{head}" for layer in range(layers) for head in range(heads)]


def model_class(config: ClarkConfig, checkpoint: Checkpoint) -> str:
    """The class the analyses load the checkpoint as: with its MLM head when the gradients run
    (asked for, and the checkpoint has a trained head), else the bare encoder."""
    with_head = "gradients" in config.analyses and gradients.has_mlm_head(checkpoint)
    return "BertForPreTraining" if with_head else "BertModel"


# The tables written with their index (the heads' labels), the others without.
INDEXED_TABLES = ("head_js_divergence",)


@dataclasses.dataclass(eq=False)
class ClarkRun:
    """A clark run held in memory: `tables` by CSV name without `.csv` (head_js_divergence indexed
    by its heads' labels), `figures` (stem → the plotting function, the table it draws and the
    function's other arguments), `results` (run.json's: what was skipped and why, the relations
    beating their baseline, the best coreference head), the lines the CLI prints, `info` (run.json's
    provenance and settings, without the figures and the environment, which the writer adds), the
    timings so far and the clock the run started at."""

    config: ClarkConfig
    tables: dict[str, pd.DataFrame]
    figures: dict[str, tuple[Callable, str, tuple]]
    results: dict
    lines: list[str]
    info: dict
    timings: dict[str, float]
    started: float

    def text(self) -> str:
        """What the CLI prints: the skipped analyses and each analysis's summary, in run order."""
        return "\n".join(self.lines)

    def job(self, stem: str, out_dir: Path) -> FigureJob:
        """The drawing job of figure `stem` into `out_dir`: its plotting function and arguments."""
        plot, table, args = self.figures[stem]
        return plot, (self.tables[table], out_dir, *args)

    def draw(self, stem: str, out_dir: Path) -> list[Path]:
        """The figure `stem` into `out_dir`, in the `figure_formats` in force."""
        plot, args = self.job(stem, out_dir)
        return plot(*args)


def prepare(config: ClarkConfig, source: Checkpoint) -> bool:
    """The checks made before anything is loaded or written; returns whether the checkpoint has a
    trained MLM head (the gradients need one)."""
    select_formats(config.figure_format)
    gradients_ok = gradients.has_mlm_head(source)
    if "gradients" in config.analyses and not gradients_ok and config.analyses_explicit:
        gradients.require_mlm_head(source)
    return gradients_ok


def compute(config: ClarkConfig, source: Checkpoint, model, tokenizer) -> ClarkRun:
    """The selected analyses of `source` (`config.ckpt` opened) in memory; writes nothing. `model`
    and `tokenizer`: `config.ckpt` loaded (`model_class`, or the caller's own)."""
    started = time.perf_counter()
    gradients_ok = prepare(config, source)
    return _compute(config, source, gradients_ok, model, tokenizer, started)


def write(result: ClarkRun, directory: Path) -> dict:
    """The one writer of a clark run (the CLI's and the API's): the tables, every figure (in the
    formats `result.config` asks for) and run.json, into `directory`; returns the run.json written."""
    return write_tables_run(result, directory, INDEXED_TABLES)


def wanted_analyses(config: ClarkConfig, source, gradients_ok: bool, results: dict, lines: list[str]) -> set[str]:
    """The analyses to run: those asked for, less the gradients without a trained MLM head and
    coreference without GAP (when not asked for by name), each skip recorded and said."""
    wanted = set(config.analyses)
    if "gradients" in wanted and not gradients_ok:
        wanted.discard("gradients")
        results["skipped"]["gradients"] = "the checkpoint has no trained MLM head"
        lines.append(f"gradients: skipped, {source.path} has no trained MLM head ({gradients.MLM_TENSOR})")
    gap_missing = [config.gap_dir / name for name in GAP_FILES.values() if not (config.gap_dir / name).is_file()]
    if "coref" in wanted and gap_missing:
        if config.analyses_explicit:
            raise UserError(f"{gap_missing[0]}: no such file (GAP is expected under --data-dir)")
        wanted.discard("coref")
        results["skipped"]["coref"] = f"{gap_missing[0]} is missing"
        lines.append(f"coref: skipped, {gap_missing[0]} is missing")
    return wanted


@dataclasses.dataclass
class _Collected:
    """What the analyses of one run add up: tables, figures, results, printed lines, data files
    read and timings."""

    tables: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)
    figures: dict[str, tuple[Callable, str, tuple]] = dataclasses.field(default_factory=dict)
    results: dict = dataclasses.field(default_factory=lambda: {"skipped": {}})
    lines: list[str] = dataclasses.field(default_factory=list)
    data_files: list[Path] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)


@at_precision()
def _compute(config: ClarkConfig, source, gradients_ok: bool, model, tokenizer, started: float) -> ClarkRun:
    got = _Collected()
    wanted = wanted_analyses(config, source, gradients_ok, got.results, got.lines)
    if "gradients" in wanted and not isinstance(model, BertForPreTraining):  # a caller's own model
        raise UserError(
            f"model: the gradients need {config.ckpt} loaded as BertForPreTraining (its MLM head), "
            f"not {type(model).__name__}: bertjax.from_pretrained(ckpt, 'BertForPreTraining')"
        )
    encoder = model.bert if isinstance(model, BertForPreTraining) else model
    config = fit_max_length(config, encoder.config.max_sequence_length)

    if wanted & {"surface", "cluster", "gradients"}:
        _sequence_analyses(config, wanted, model, encoder, tokenizer, got)
    if wanted & {"depheads", "probes"}:
        _dependency_analyses(config, wanted, encoder, tokenizer, got)
    if "coref" in wanted:
        _coref_analysis(config, encoder, tokenizer, got)
    got.timings["total"] = time.perf_counter() - started
    info = {
        "config": dataclasses.asdict(config),
        "checkpoint": source.describe(),
        "model_config": encoder.config.to_hf_dict(),
        "results": got.results,
        "data_files": [{"path": str(f), "sha256": runinfo.input_sha256(f)} for f in dict.fromkeys(got.data_files)],
    }
    return ClarkRun(config, got.tables, got.figures, got.results, got.lines, info, got.timings, started)


def _sequence_analyses(config: ClarkConfig, wanted: set[str], model, encoder, tokenizer, got: _Collected) -> None:
    """Attention to special tokens and neighbours (surface), the heads' clusters and the gradients,
    on the input sequences."""
    layers, heads = encoder.config.num_hidden_layers, encoder.config.num_attention_heads
    punct_ids = tokenizer.convert_tokens_to_ids(list(PUNCT_TOKENS))
    seqs, files = input_sequences(config, tokenizer)
    got.data_files += files
    if "surface" in wanted:
        clock = time.perf_counter()
        means = surface.surface_statistics(
            encoder, seqs, punct_ids, config.batch_size, config.max_length, config.surface_weighting,
            config.attention, config.allow_nonfinite,
        )  # fmt: skip
        got.tables["surface"] = surface_table(means)
        got.figures["surface_by_layer"] = (plot_surface, "surface", (config.inputs, about(config, len(seqs))))
        got.figures["entropy_by_layer"] = (plot_entropy, "surface", (config.inputs, about(config, len(seqs))))
        got.results["surface_sequences"] = len(seqs)
        got.timings["surface"] = time.perf_counter() - clock
    if "cluster" in wanted:
        clock = time.perf_counter()
        chosen = seqs[: config.cluster_n]
        js = surface.head_js_divergence(
            encoder, chosen, config.batch_size, config.max_length, config.attention, config.allow_nonfinite
        )
        labels = head_labels(layers, heads)
        got.tables["head_js_divergence"] = pd.DataFrame(js, index=labels, columns=labels).rename_axis("head")
        # MDS needs a metric; the square root of the JS divergence is one. A head whose attention
        # is undefined (`finite.silent_heads`) has no distances and no place in the map.
        defined = np.isfinite(js).all(axis=1)
        coords = np.full((len(js), 2), np.nan)
        if defined.any():
            coords[defined] = surface.classical_mds(np.sqrt(np.clip(js[np.ix_(defined, defined)], 0.0, None)))
        got.tables["head_mds"] = pd.DataFrame({"layer": np.repeat(np.arange(layers), heads),
                                               "head": np.tile(np.arange(heads), layers),
                                               "x": coords[:, 0], "y": coords[:, 1]})  # fmt: skip
        got.figures["head_mds"] = (plot_mds, "head_mds", (len(chosen), about(config, len(chosen))))
        got.results["cluster_sequences"] = len(chosen)
        got.timings["cluster"] = time.perf_counter() - clock
    if "gradients" in wanted:
        clock = time.perf_counter()
        chosen = seqs[: config.gradient_n]
        importance = gradients.gradient_importance(
            model, chosen, punct_ids, tokenizer.mask_token_id, config.batch_size, config.max_length, config.seed,
            config.allow_nonfinite,
        )  # fmt: skip
        table = pd.DataFrame(importance, columns=list(gradients.KEY_KINDS)).rename_axis("layer").reset_index()
        got.tables["gradient_importance"] = table
        got.figures["gradient_importance"] = (
            plot_gradients,
            "gradient_importance",
            (len(chosen), about(config, len(chosen))),
        )
        got.results["gradient_sequences"] = len(chosen)
        got.timings["gradients"] = time.perf_counter() - clock


def _dependency_analyses(config: ClarkConfig, wanted: set[str], encoder, tokenizer, got: _Collected) -> None:
    """Dependency heads and the attention-based probes, on EWT's dev, test (and train) trees."""
    layers, heads = encoder.config.num_hidden_layers, encoder.config.num_attention_heads
    clock = time.perf_counter()
    run_words = make_word_attention_fn(encoder)
    words = lambda seqs, desc: iter_word_attention(
        run_words, seqs, config.batch_size, config.max_length, config.first_piece, desc, config.allow_nonfinite
    )
    got.data_files += [config.ewt_dir / EWT_FILES[s] for s in ("dev", "test")]
    counts = {}
    test_probe: list[probes.ProbeSentence] = []
    for split in ("dev", "test"):
        counts[split] = depattn.DependencyCounts(
            layers, heads, config.baseline_offsets, config.all_relations_include_root
        )
        for word in words(ewt_sequences(config, tokenizer, split, config.ewt_limit), f"EWT {split}"):
            counts[split].update(word)
            if split == "test" and "probes" in wanted:
                test_probe.append(probes.probe_sentence(word))
    got.timings["ewt_dev_test"] = time.perf_counter() - clock
    if "depheads" in wanted:
        table = depheads.dependency_table(counts["dev"], counts["test"])
        got.tables["dependency_heads"] = table
        best = depheads.best_per_relation(table)
        beating = (best["test_accuracy"] > best["baseline_accuracy"]) & (best["count"] >= config.min_count)
        got.results["relations_beating_baseline"] = sorted(best.loc[beating, "relation"])
        got.lines.append(depheads.format_summary(table, config.min_count))
    if "probes" in wanted:
        clock = time.perf_counter()
        got.data_files.append(config.ewt_dir / EWT_FILES["train"])
        train_seqs = ewt_sequences(config, tokenizer, "train", config.probe_train_limit)
        train_probe = [probes.probe_sentence(w) for w in words(train_seqs, "EWT train")]
        rows = []
        for name, kind, with_embeddings in (
            ("attention-only", "attention", False),
            ("attention + embeddings", "attention", True),
            ("distance + embeddings", "distance", True),
        ):
            params = probes.train_probe(
                train_probe, kind, with_embeddings, epochs=config.probe_epochs, batch_size=config.batch_size,
                learning_rate=config.probe_learning_rate, seed=config.seed, desc=name,
            )  # fmt: skip
            score, counted = probes.uas(params, test_probe, kind, config.batch_size)
            rows.append({"probe": name, "test_uas": score, "test_words": counted, "train_sentences": len(train_probe)})
        table = pd.DataFrame(rows)
        got.tables["probes"] = table
        got.lines.append(table.to_string(index=False, float_format=lambda x: f"{100 * x:.1f}%"))
        got.timings["probes"] = time.perf_counter() - clock


def _coref_analysis(config: ClarkConfig, encoder, tokenizer, got: _Collected) -> None:
    """Coreference heads on GAP's dev and test examples, against the rule baselines."""
    clock = time.perf_counter()
    run_coref = coref.make_candidate_attention_fn(encoder)
    heads_correct, baselines = {}, {}
    for split, name in GAP_FILES.items():
        path = config.gap_dir / name
        got.data_files.append(path)
        inputs, counts = coref.encode_gap(
            tokenizer, coref.read_gap(path, config.gap_limit), config.max_length, config.coref_target,
            config.coref_mentions,
        )  # fmt: skip
        if not inputs:
            raise UserError(f"{path}: no example left to score ({counts})")
        scores = coref.candidate_scores(
            run_coref, inputs, config.batch_size, config.max_length, config.first_piece, f"GAP {split}",
            config.allow_nonfinite,
        )  # fmt: skip
        heads_correct[split] = coref.correct_choices(scores, np.array([item.label for item in inputs]))
        baselines[split] = coref.baseline_correct(inputs)
        got.results[f"coref_{split}"] = counts
        got.lines.append(f"GAP {split}: {', '.join(f'{k} {v}' for k, v in counts.items())}")
    table = coref.head_table(heads_correct["dev"], heads_correct["test"])
    got.tables["coref_heads"] = table
    got.tables["coref_best_per_layer"] = coref.best_per_layer(table)
    baseline_table = coref.baseline_table(baselines["dev"], baselines["test"])
    got.tables["coref_baselines"] = baseline_table
    best = coref.best_head(table)
    got.results["coref_best_head"] = {k: (int(v) if k in ("layer", "head", "dev_n", "test_n") else float(v))
                                      for k, v in best.items()}  # fmt: skip
    got.figures["coref_accuracy"] = (plot_coref, "coref_heads", (config.coref_target, config.coref_mentions,
                                                                   readable_checkpoint(config.ckpt)))  # fmt: skip
    got.lines.append(coref.format_summary(table, baseline_table))
    got.timings["coref"] = time.perf_counter() - clock


def about(config: ClarkConfig, n: int) -> str:
    """The line under a figure's title: the model and the sequences it read."""
    return f"{readable_checkpoint(config.ckpt)} · N = {n} sequences"


def surface_table(means: np.ndarray) -> pd.DataFrame:
    layers, heads, _ = means.shape
    table = pd.DataFrame(means.reshape(layers * heads, -1), columns=list(surface.STATISTICS))
    table.insert(0, "head", np.tile(np.arange(heads), layers))
    table.insert(0, "layer", np.repeat(np.arange(layers), heads))
    return table


def _layer_strip(ax, table: pd.DataFrame, column: str, title: str, rng: np.random.Generator) -> None:
    """Paper-style strip: one dot per head at its layer (jittered), the layer mean as a bar."""
    layers = table["layer"].to_numpy()
    ax.scatter(layers + rng.uniform(-0.2, 0.2, layers.size), table[column], s=10, alpha=0.7, color="#1f77b4")
    means = table.groupby("layer")[column].mean()
    ax.hlines(means.to_numpy(), means.index - 0.3, means.index + 0.3, color="black", linewidth=1.5)
    ax.set_title(title, fontsize=9)
    ax.set_xticks(sorted(set(layers)))
    ax.set_xlabel("layer")


def plot_surface(table: pd.DataFrame, out_dir: Path, inputs: str, about: str) -> list[Path]:
    """Paper Figs. 1–2: per head, mean attention to special tokens, punctuation and neighbours."""
    panels = (
        ("cls", "to [CLS]"), ("sep", "to [SEP]"), ("punct", 'to "." and ","'),
        ("prev", "to the previous token"), ("self", "to the token itself"), ("next", "to the next token"),
    )  # fmt: skip
    fig = Figure(figsize=(13, 6), layout="constrained")
    axes = fig.subplots(2, 3, sharey=True).ravel()
    rng = np.random.default_rng(0)
    for ax, (column, title) in zip(axes, panels, strict=True):
        _layer_strip(ax, table, column, title, rng)
    for ax in axes[::3]:
        ax.set_ylabel("mean attention")
    fig.suptitle(f"{inputs}: average attention per head (dot), layer mean (bar)\n{about}")
    return save_figure(fig, out_dir, "surface_by_layer")


def plot_entropy(table: pd.DataFrame, out_dir: Path, inputs: str, about: str) -> list[Path]:
    """Paper Fig. 4: per-head attention entropy by layer against uniform attention's entropy."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    rng = np.random.default_rng(0)
    panels = (("entropy", "uniform_entropy", "all rows"), ("entropy_cls", "uniform_entropy_cls", "[CLS] row"))
    for ax, (column, uniform, title) in zip(axes, panels, strict=True):
        _layer_strip(ax, table, column, title, rng)
        ax.axhline(table[uniform].iloc[0], color="#d62728", linestyle="--", label="uniform attention")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("mean entropy (nats)")
    fig.suptitle(f"{inputs}: attention entropy per head\n{about}")
    return save_figure(fig, out_dir, "entropy_by_layer")


# Where a head's label may go, in points from its dot, tried in this order; a label moved off the
# first place gets a thin line back to its dot.
LABEL_OFFSETS = ((2, 2), (2, -7), (-13, 2), (-13, -7), (5, 9), (5, -14), (-18, 9), (-18, -14), (10, 0), (-24, 0))
# A label's box ("11-11" at 5 pt) and the MDS panel's size, in points: enough to tell overlaps apart.
LABEL_BOX = (13.0, 6.0)
PANEL_POINTS = (330.0, 330.0)


def label_offsets(points: np.ndarray) -> list[tuple[int, int]]:
    """A label offset (points) per point: the first of `LABEL_OFFSETS` whose box overlaps no label
    placed before it, else the first (a simple repel: in a dense cloud of heads the labels
    stacked into an unreadable blot)."""
    span = np.ptp(points, axis=0)
    scaled = (points - points.min(axis=0)) / np.where(span > 0, span, 1.0) * np.array(PANEL_POINTS)
    placed: list[tuple[float, float]] = []
    chosen = []
    for x, y in scaled:
        for dx, dy in LABEL_OFFSETS:
            left, bottom = x + dx, y + dy
            if all(abs(left - px) >= LABEL_BOX[0] or abs(bottom - py) >= LABEL_BOX[1] for px, py in placed):
                break
        else:
            dx, dy = LABEL_OFFSETS[0]
        placed.append((x + dx, y + dy))
        chosen.append((dx, dy))
    return chosen


def plot_mds(mds: pd.DataFrame, out_dir: Path, sequences: int, about: str) -> list[Path]:
    """Paper Fig. 6: heads embedded in 2-D by MDS of √JS, coloured by layer."""
    layers = int(mds["layer"].max()) + 1
    fig = Figure(figsize=(6.5, 5.5), layout="constrained")
    ax = fig.add_subplot()
    points = ax.scatter(
        mds["x"], mds["y"], c=mds["layer"], cmap=colormaps["viridis"].resampled(layers),
        norm=BoundaryNorm(np.arange(layers + 1) - 0.5, layers), s=30, edgecolor="black", linewidth=0.3,
    )  # fmt: skip
    for row, (dx, dy) in zip(mds.itertuples(), label_offsets(mds[["x", "y"]].to_numpy()), strict=True):
        ax.annotate(f"{row.layer}-{row.head}", (row.x, row.y), fontsize=5, xytext=(dx, dy), textcoords="offset points",
                    arrowprops={"arrowstyle": "-", "lw": 0.3, "color": "grey"} if (dx, dy) != LABEL_OFFSETS[0] else None)  # fmt: skip
    fig.colorbar(points, ax=ax, ticks=range(layers), label="layer")
    ax.set_xlabel("MDS dimension 1")
    ax.set_ylabel("MDS dimension 2")
    ax.set_title(
        f"classical MDS of √(Jensen–Shannon divergence) between heads ({sequences} sequences)\n{about}", fontsize=9
    )
    return save_figure(fig, out_dir, "head_mds")


def plot_gradients(table: pd.DataFrame, out_dir: Path, sequences: int, about: str) -> list[Path]:
    """Paper Fig. 3: mean |∂MLM loss/∂α| per layer for attention to each kind of key."""
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    for kind in gradients.KEY_KINDS:
        ax.plot(table["layer"], table[kind], marker="o", label=kind)
    ax.set_xticks(table["layer"])
    ax.set_xlabel("layer")
    ax.set_ylabel("mean |∂ MLM loss / ∂ attention|")
    ax.legend()
    ax.set_title(f"gradient-based importance of attention ({sequences} masked sequences)\n{about}", fontsize=9)
    return save_figure(fig, out_dir, "gradient_importance")


def plot_coref(table: pd.DataFrame, out_dir: Path, target: str, mentions: str, model: str) -> list[Path]:
    """Test accuracy of every head (layer × head), the head chosen on dev framed."""
    layers, heads = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    grid = table.sort_values(["layer", "head"])["test_accuracy"].to_numpy().reshape(layers, heads)
    spread = max(float(np.nanmax(np.abs(grid - coref.CHANCE))), 0.01)
    fig = Figure(figsize=(0.55 * heads + 2.5, 0.45 * layers + 1.6), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="RdBu_r", vmin=coref.CHANCE - spread, vmax=coref.CHANCE + spread)
    for (layer, head), value in np.ndenumerate(grid):
        ax.text(head, layer, f"{100 * value:.0f}", ha="center", va="center", fontsize=6)
    best = coref.best_head(table)
    ax.add_patch(Rectangle((best["head"] - 0.5, best["layer"] - 0.5), 1, 1, fill=False, edgecolor="black", lw=2))
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(image, ax=ax, label="test accuracy (chance 0.5)")
    which = "any mention" if mentions == "all" else "marked mention"
    ax.set_title(
        f"GAP test: pronoun → candidate ({which}, {target}) accuracy per head, n = {int(best['test_n'])}; "
        f"framed: chosen on dev\n{model}",
        fontsize=9,
    )
    return save_figure(fig, out_dir, "coref_accuracy")
