"""`python -m analysis.roles`: which attention heads hold which roles (Pande et al. 2021).

Data flow: GLUE (or CoNLL-U) examples → parses (cached) → encoded sequences → per batch: sieve masks
and one jitted function doing the model forward *and* the sieve-bias kernel, so attention never
leaves the device and memory does not grow with N → per-sequence scores → one-sided tests →
`roles.csv`, `scores.npz`, figures, `run.json`.

Outputs are written into a temporary sibling of `--out` and renamed at the end, so a failed run
leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx
from tqdm import tqdm

from analysis import plots, stats, summary
from bertjax import cli, glue, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import from_pretrained, load_tokenizer, resolve
from sieves.align import EncodedSequence, encode_batch
from sieves.builders import DEFAULT_ROLES, ROLES, SieveOptions, arc_row_weights, build_batch, get_role
from sieves.kernel import sieve_scores
from sieves.parse import SpacyParser, read_conllu

log = logging.getLogger(__name__)
C = TypeVar("C")

CONLLU_TASK = "ud"
MIN_LENGTH = 5
BLOCK_SCORES = ("paper", "entropy")
SYNTACTIC_AVERAGES = ("rows", "arcs")
LENGTH_BUCKET = 32  # pad batches to a multiple of this: few compiles, little wasted compute
_SCORERS: dict[tuple, object] = {}


@dataclasses.dataclass(frozen=True)
class RolesConfig:
    """Everything that decides the numbers of a run; saved in run.json."""

    ckpt: str
    task: str = "all"
    step: int | None = None
    glue_dir: str | None = None
    split: str = "dev"
    n: int = 1000
    max_length: int = 128
    batch_size: int = 32
    roles: tuple[str, ...] = DEFAULT_ROLES
    window: int = 2
    special_rows: bool = True
    tau: str = "3"
    alpha: float = 0.05
    test: str = "t"
    correction: str = "none"
    parser: str = "spacy"
    spacy_model: str | None = None
    conllu: str | None = None
    cache_dir: str = str(cli.CACHE_ROOT)
    out: str = "roles_out"
    overwrite: bool = False
    # `--figures` and `--figure-format` as given; each analysis checks them against its own kinds.
    figures: str = "all"
    figure_format: str = "png"
    html: bool = False
    # The authors' variants (docs/fidelity.md); the defaults are the paper's definitions.
    block_score: str = "paper"
    syntactic_average: str = "rows"

    def __post_init__(self) -> None:
        if self.block_score not in BLOCK_SCORES:
            raise UserError(f"--block-score must be one of {', '.join(BLOCK_SCORES)}, got {self.block_score!r}")
        if self.syntactic_average not in SYNTACTIC_AVERAGES:
            raise UserError(
                f"--syntactic-average must be one of {', '.join(SYNTACTIC_AVERAGES)}, got {self.syntactic_average!r}"
            )
        if self.n < 1:
            raise UserError(f"--n must be at least 1, got {self.n}")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.window < 1:
            raise UserError(f"--window must be at least 1, got {self.window}")
        if not 0.0 < self.alpha < 1.0:
            raise UserError(f"--alpha must be in (0, 1), got {self.alpha}")
        if self.tau != "auto":
            try:
                finite = math.isfinite(float(self.tau))
            except ValueError:
                finite = False
            if not finite:
                raise UserError(f"--tau must be a finite number or 'auto', got {self.tau!r}")
        for role in self.roles:
            get_role(role)
        if len(set(self.roles)) < len(self.roles):
            raise UserError(f"--roles names a role twice: {','.join(self.roles)}")
        if self.parser == "conllu" and not self.conllu:
            raise UserError("--parser conllu needs --conllu FILE (a CoNLL-U file of gold trees)")


@dataclasses.dataclass
class TaskScores:
    """Per-sequence scores of one task: role → ([n_f, L, H] scores, [n_f] example indices)."""

    scores: dict[str, np.ndarray]
    indices: dict[str, np.ndarray]
    absent: list[str]
    n_sequences: int


def resolve_tasks(spec: str) -> list[str]:
    """`all`, one task, or a comma-separated list, in the order given."""
    tasks = [t for part in spec.split(",") for t in glue.resolve_tasks(part.strip())]
    return list(dict.fromkeys(tasks))


def config_tasks(config: RolesConfig) -> list[str]:
    return [CONLLU_TASK] if config.parser == "conllu" else resolve_tasks(config.task)


def examples_for(config: RolesConfig, task: str) -> tuple[list[tuple[str, ...]], list[int], list[Path]]:
    """(segments per example, example indices, files read) in file order."""
    if task == CONLLU_TASK:
        sentences = read_conllu(Path(config.conllu), limit=config.n)
        return [(text,) for text, _ in sentences], list(range(len(sentences))), [Path(config.conllu)]
    glue_dir = None if config.glue_dir is None else Path(config.glue_dir)
    examples = glue.load_glue(task, config.split, glue_dir, config.n)
    files = glue.glue_files(task, config.split, glue_dir) if glue_dir else []
    segments = [(e.text_a,) if e.text_b is None else (e.text_a, e.text_b) for e in examples]
    return segments, [e.index for e in examples], files


def parse_segments(config: RolesConfig, task: str, segments: Sequence[tuple[str, ...]], parser):
    if task == CONLLU_TASK:
        return [(words,) for _, words in read_conllu(Path(config.conllu), limit=config.n)]
    flat = [text for example in segments for text in example]
    parsed = iter(parser.parse(flat))
    return [tuple(next(parsed) for _ in example) for example in segments]


def entropy_roles(config: RolesConfig) -> tuple[bool, ...]:
    """Per role of `config.roles`: scored as β · row entropy (`--block-score entropy`)."""
    return tuple(role == "block" and config.block_score == "entropy" for role in config.roles)


def make_scorer(model: nnx.Module, entropy: tuple[bool, ...] = ()):
    """One jitted function: forward pass with attentions, then β for every role/layer/head
    (times the row entropy for the roles `entropy` marks)."""
    graphdef, state = nnx.split(model)
    # Keyed by class and config, not by the graphdef (a new one per instance), so all checkpoints
    # of one architecture share one compiled function: tracking a run compiles once.
    key = (type(model), model.config)
    if key not in _SCORERS:
        _SCORERS[key] = _jit_scorer(graphdef)
    score = _SCORERS[key]
    return lambda *arrays: score(state, *arrays, entropy_roles=entropy)


def _jit_scorer(graphdef):
    @partial(jax.jit, static_argnames="entropy_roles")
    def score(state, input_ids, attention_mask, token_type_ids, rows, sieves, row_weights=None, entropy_roles=()):
        out = nnx.merge(graphdef, state)(
            input_ids, attention_mask, token_type_ids, output_attentions=True
        )
        real = attention_mask.astype(bool)
        return sieve_scores(jnp.stack(out.attentions), real, rows, sieves, row_weights, entropy_roles)

    return score


def batches(seqs: Sequence[EncodedSequence], size: int) -> Iterator[list[EncodedSequence]]:
    """Batches of similar length (sorted), so padding — and forward cost — stays small."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].length)
    for begin in range(0, len(order), size):
        yield [seqs[i] for i in order[begin : begin + size]]


def bucketed(length: int) -> int:
    """`length` rounded up to a multiple of LENGTH_BUCKET: the padded size of a batch."""
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


def padded_batches(
    seqs: Sequence[EncodedSequence], batch_size: int, max_length: int, desc: str
) -> Iterator[tuple[list[EncodedSequence], dict[str, np.ndarray]]]:
    """(the sequences, their model inputs [batch_size, bucketed length]) of each length-sorted
    batch, with a progress bar over the sequences; padding never goes past `max_length` (the
    encoding's, which fits the model's positions where a bucket may not)."""
    with tqdm(total=len(seqs), desc=desc, unit="seq") as progress:
        for chunk in batches(seqs, batch_size):
            length = bucketed(max(s.length for s in chunk))
            yield chunk, pad_batch(chunk, batch_size, min(length, max_length))
            progress.update(len(chunk))


def pad_batch(seqs: Sequence[EncodedSequence], batch_size: int, length: int) -> dict[str, np.ndarray]:
    """Model inputs padded to [batch_size, length]; missing rows are all-padding (no scored rows)."""
    arrays = {k: np.zeros((batch_size, length), np.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
    for b, seq in enumerate(seqs):
        arrays["input_ids"][b, : seq.length] = seq.input_ids
        arrays["attention_mask"][b, : seq.length] = 1
        arrays["token_type_ids"][b, : seq.length] = seq.token_type_ids
    # An all-padding row would softmax over nothing; give it one real token (its scores are unused).
    arrays["attention_mask"][len(seqs) :, 0] = 1
    return arrays


def present_roles(num_segments: Iterable[int], roles: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the roles inputs with these segment counts define, those they do not): pair roles need
    two segments in every input."""
    paired = all(n == 2 for n in num_segments)
    present = [r for r in roles if paired or not get_role(r).needs_pair]
    return present, [r for r in roles if r not in present]


def scored_batches(
    scorer, seqs: Sequence[EncodedSequence], present: Sequence[str], config: RolesConfig, desc: str
) -> Iterator[tuple[list[EncodedSequence], tuple[np.ndarray, ...]]]:
    """Each length-sorted batch and what `scorer(input_ids, attention_mask, token_type_ids, rows,
    sieves)` returns for it (with the row weights appended under `--syntactic-average arcs`), on
    the host. The masks hold every role of `config.roles`, in that order, and are empty for roles
    not `present`."""
    options = SieveOptions(window=config.window, special_rows=config.special_rows)
    # The same role count for every task, so single-segment tasks (no `block`) reuse the pair
    # tasks' compiled shapes: an empty role costs a sliver of β, a recompile costs seconds (on a
    # GPU, most of a cold run).
    slots = [config.roles.index(role) for role in present]
    for chunk, arrays in padded_batches(seqs, config.batch_size, config.max_length, desc):
        length = arrays["input_ids"].shape[1]
        built_rows, built_sieves = build_batch(chunk, present, options, length)
        rows = np.zeros((len(config.roles), config.batch_size, length), bool)
        sieves = np.zeros((len(config.roles), config.batch_size, length, length), bool)
        rows[slots, : len(chunk)], sieves[slots, : len(chunk)] = built_rows, built_sieves
        extra = ()
        if config.syntactic_average == "arcs":
            weights = np.ones((len(config.roles), config.batch_size, length), np.float32)
            weights[slots, : len(chunk)] = arc_row_weights(chunk, present, length)
            extra = (weights,)
        outputs = scorer(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], rows, sieves, *extra)
        yield chunk, tuple(np.asarray(x) for x in outputs)


class ScoreCollector:
    """Per-sequence scores gathered batch by batch, returned in file order as `TaskScores`."""

    def __init__(self, roles: Sequence[str], present: Sequence[str]):
        self.slots = {role: list(roles).index(role) for role in present}
        self.present = list(present)
        self.scores: dict[str, list[np.ndarray]] = {r: [] for r in present}
        self.indices: dict[str, list[np.ndarray]] = {r: [] for r in present}

    def add(self, chunk: Sequence[EncodedSequence], scores: np.ndarray, counts: np.ndarray) -> None:
        """scores [R, B, L, H] and counts [R, B] of a padded batch whose first rows are `chunk`,
        one slot per role of `roles`."""
        index = np.array([s.index for s in chunk])
        for role, r in self.slots.items():
            kept = counts[r, : len(chunk)] > 0
            self.scores[role].append(scores[r, : len(chunk)][kept])
            self.indices[role].append(index[kept])

    def result(self, absent: list[str], n_sequences: int) -> TaskScores:
        merged, merged_index = {}, {}
        for role in self.present:
            index = np.concatenate(self.indices[role])
            order = np.argsort(index, kind="stable")  # back to file order
            merged[role] = np.concatenate(self.scores[role])[order]
            merged_index[role] = index[order]
        return TaskScores(merged, merged_index, absent, n_sequences)


def score_task(scorer, seqs: Sequence[EncodedSequence], config: RolesConfig, desc: str) -> TaskScores:
    present, absent = present_roles((seq.num_segments for seq in seqs), config.roles)
    collector = ScoreCollector(config.roles, present)
    for chunk, (scores, counts) in scored_batches(scorer, seqs, present, config, desc):
        collector.add(chunk, scores, counts)
    return collector.result(absent, len(seqs))


def test_roles(results: dict[str, TaskScores], config: RolesConfig) -> tuple[pd.DataFrame, float]:
    """One row per (task, layer, head, role) with the test of H0: mean β ≤ τ."""
    if config.tau == "auto":
        tau = float(stats.tau_auto(s for r in results.values() for s in r.scores.values()))
    else:
        tau = float(config.tau)
    frames = []
    for task, result in results.items():
        for role, scores in result.scores.items():
            test = stats.one_sided_test(scores, tau, axis=0, test=config.test)
            layers, heads = np.meshgrid(np.arange(scores.shape[1]), np.arange(scores.shape[2]), indexing="ij")
            frames.append(
                pd.DataFrame(
                    {
                        "task": task,
                        "layer": layers.ravel(),
                        "head": heads.ravel(),
                        "role": role,
                        "n": test.n.ravel(),
                        "mean": test.mean.ravel(),
                        "std": test.std.ravel(),
                        "ci_low": test.ci_low.ravel(),
                        "ci_high": test.ci_high.ravel(),
                        "t": test.statistic.ravel(),
                        "p_value": test.p_value.ravel(),
                    }
                )
            )
    table = pd.concat(frames, ignore_index=True)
    table["p_adjusted"] = stats.adjust_pvalues(table["p_value"].to_numpy(), config.correction)
    table["assigned"] = stats.assign(table["p_adjusted"].to_numpy(), config.alpha)
    return table, tau


def run(config: RolesConfig, parser=None) -> pd.DataFrame:
    """The whole analysis; returns the roles table (also written under config.out).

    `parser`: anything with `parse(texts) -> list[Parse]`, `name` and `version` (default: spaCy,
    as `config` says), e.g. parses made elsewhere and shipped with the job."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    tasks = config_tasks(config)
    kinds = plots.select_figures(config.figures, plots.ROLES_FIGURES)
    formats = plots.select_formats(config.figure_format)
    with (
        runinfo.atomic_out(config.out, config.overwrite) as tmp,
        # Started before the model loads, so that the workers' imports overlap the loading.
        plots.FigurePool(plots.pool_size(len(tasks) * len(kinds))) as pool,
        plots.figure_formats(formats),
    ):
        return _run(config, tasks, tmp, timings, started, parser, pool, kinds)


@dataclasses.dataclass
class TaskData:
    """One task's examples as read: segments per example, example indices, files read."""

    segments: list[tuple[str, ...]]
    indices: list[int]
    files: list[Path]


def load_tasks(config: RolesConfig, tasks: Sequence[str]) -> dict[str, TaskData]:
    """Every task's examples, or a UserError when a task defines none of `config.roles` (checked
    here, before any parse or forward pass: such a task would leave nothing to test)."""
    data = {task: TaskData(*examples_for(config, task)) for task in tasks}
    for task, d in data.items():
        present, absent = present_roles((len(segments) for segments in d.segments), config.roles)
        if not present:
            verb = "needs" if len(absent) == 1 else "need"
            raise UserError(
                f"--roles {','.join(config.roles)}: no requested role is defined for {task} ({', '.join(absent)} {verb} sentence pairs)"
            )
    return data


def data_file_hashes(data: dict[str, TaskData]) -> dict[str, list[dict[str, str]]]:
    return {t: [{"path": str(f), "sha256": runinfo.sha256(f)} for f in d.files] for t, d in data.items()}


def make_parser(config: RolesConfig) -> SpacyParser | None:
    """The spaCy parser when a role needs parses (CoNLL-U trees come with the data)."""
    if config.parser == "spacy" and any(get_role(r).needs_parse for r in config.roles):
        return SpacyParser(config.spacy_model, cache_dir=Path(config.cache_dir).expanduser())
    return None


def encode_tasks(
    config: RolesConfig, data: dict[str, TaskData], tokenizer, parser, timings: dict[str, float]
) -> dict[str, list[EncodedSequence]]:
    """Parses (cached on disk) and encodes every task once; any number of models can score them."""
    sequences = {}
    for task, d in data.items():
        clock = time.perf_counter()
        parses = parse_segments(config, task, d.segments, parser) if parser or task == CONLLU_TASK else None
        sequences[task] = encode_batch(tokenizer, d.segments, parses, config.max_length, d.indices)
        timings[f"{task}/prepare"] = time.perf_counter() - clock
    return sequences


def score_sequences(
    scorer, sequences: dict[str, list[EncodedSequence]], config: RolesConfig, timings: dict[str, float]
) -> dict[str, TaskScores]:
    results = {}
    for task, seqs in sequences.items():
        clock = time.perf_counter()
        results[task] = score_task(scorer, seqs, config, desc=f"{task} β")
        timings[f"{task}/score"] = time.perf_counter() - clock
    return results


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
    log.warning("--max-length %d exceeds the model's %d positions; truncating to %d", config.max_length, positions, positions)
    return dataclasses.replace(config, max_length=positions)


def _run(
    config: RolesConfig,
    tasks: list[str],
    tmp: Path,
    timings: dict[str, float],
    started: float,
    parser,
    pool: plots.FigurePool,
    kinds: tuple[str, ...],
) -> pd.DataFrame:
    clock = time.perf_counter()
    source = resolve(config.ckpt, config.step)
    model = from_pretrained(config.ckpt, step=config.step)
    tokenizer = load_tokenizer(config.ckpt, step=config.step)
    scorer = make_scorer(model, entropy_roles(config))
    timings["load_model"] = time.perf_counter() - clock
    config = fit_max_length(config, model.config.max_position_embeddings)

    clock = time.perf_counter()
    data = load_tasks(config, tasks)
    data_files = data_file_hashes(data)
    timings["load_data"] = time.perf_counter() - clock
    if parser is None or config.parser != "spacy":
        parser = make_parser(config)
    sequences = encode_tasks(config, data, tokenizer, parser, timings)
    results = score_sequences(scorer, sequences, config, timings)

    clock = time.perf_counter()
    table, tau = test_roles(results, config)
    table.to_csv(tmp / "roles.csv", index=False)
    arrays = {}
    for task, result in results.items():
        for role, scores in result.scores.items():
            arrays[f"{task}/{role}"] = scores
            arrays[f"{task}/{role}/index"] = result.indices[role]
    np.savez(tmp / "scores.npz", **arrays)
    timings["tests_and_tables"] = time.perf_counter() - clock

    clock = time.perf_counter()
    coarse = {name: role.coarse for name, role in ROLES.items()}
    scores_by_key = {(t, r): s for t, res in results.items() for r, s in res.scores.items()}
    pool.submit(plots.figure_jobs(table, scores_by_key, tmp, tau=tau, alpha=config.alpha, coarse=coarse, kinds=kinds))
    figures = pool.results()
    timings["figures"] = time.perf_counter() - clock
    digest = summary.summarize(table, coarse=coarse)
    digest.to_csv(tmp / "summary.csv", index=False)
    timings["total"] = time.perf_counter() - started

    run_info = {
        "config": dataclasses.asdict(config),
        "tau": tau,
        "checkpoint": source.describe(),
        "model_config": model.config.to_hf_dict(),
        "parser": None if parser is None else {"name": parser.name, "version": parser.version},
        "tasks": {
            t: {"sequences": r.n_sequences, "n_by_role": {k: len(v) for k, v in r.scores.items()}, "absent_roles": r.absent}
            for t, r in results.items()
        },
        "data_files": data_files,
        "figures": sorted(p.name for p in figures),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    runinfo.write_run_json(tmp, run_info)
    print(summary.format_summary(digest))
    for task, result in results.items():
        if result.absent:
            print(f"{task}: roles not defined for these inputs (absent): {', '.join(result.absent)}")
    return table


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose the sequences and how they are scored (shared by the analyses that
    score checkpoints: roles, track, finetune_effect)."""
    p.add_argument("--task", default="all", help="qnli, qqp, mrpc, sst2, a comma-separated list, or all")
    p.add_argument("--glue-dir", help="local GLUE directory (glue_data/<TASK>/<split>.tsv); default: the hub")
    p.add_argument("--split", default="dev", choices=["train", "dev", "validation", "test"])
    p.add_argument("--n", type=int, default=1000, help="first N examples of each task (file order)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--roles", help="comma-separated roles (default: all fine-grained roles)")
    p.add_argument("--window", type=int, default=2, help="local window k")
    p.add_argument("--no-special-rows", action="store_true", help="do not score [CLS]/[SEP] rows for positional roles")
    p.add_argument("--parser", choices=["spacy", "conllu"], default="spacy")
    p.add_argument("--spacy-model", help="spaCy pipeline name (default en_core_web_sm)")
    p.add_argument("--conllu", help="CoNLL-U file of gold trees (with --parser conllu)")
    p.add_argument("--cache-dir", default=RolesConfig.cache_dir, help="where parses are cached")


def add_test_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the hypothesis tests."""
    p.add_argument("--tau", default="3", help="threshold τ, or 'auto' (smallest integer above the grand mean)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--test", choices=["t", "z"], default="t")
    p.add_argument("--correction", choices=["none", "holm", "bh"], default="none")


def add_output_arguments(p: argparse.ArgumentParser, default_out: str, figure_kinds: Sequence[str]) -> None:
    p.add_argument("--out", default=default_out)
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    plots.add_figure_arguments(p, figure_kinds)
    p.add_argument("--html", action="store_true", help="also write report.html (python -m analysis.report) into --out")


def add_variant_arguments(p: argparse.ArgumentParser) -> None:
    """The authors' variants of the definitions (docs/fidelity.md); only `analysis.roles` offers
    them, as track and finetune_effect score with the published definitions."""
    p.add_argument("--block-score", choices=BLOCK_SCORES, default="paper",
                   help="paper: mean β over the rows; entropy: each row's β times its attention entropy, "
                        "as the authors' block_score notebook")  # fmt: skip
    p.add_argument("--syntactic-average", choices=SYNTACTIC_AVERAGES, default="rows",
                   help="rows: mean β over the wordpiece rows of the relation roles; arcs: mean over arcs "
                        "(each dependent word once), as the authors' syntactic notebook")  # fmt: skip


def config_from_args(a: argparse.Namespace, **fields) -> RolesConfig:
    """A RolesConfig from the flags above that `a` has (the others keep their defaults); `fields`
    set the rest and take precedence."""
    given = vars(a)
    # Flags whose argparse dest is the RolesConfig field's name.
    same = ("task", "glue_dir", "split", "n", "max_length", "batch_size", "window", "tau", "alpha", "test",
            "correction", "parser", "spacy_model", "conllu", "cache_dir", "out", "overwrite", "figures",
            "figure_format", "html", "block_score", "syntactic_average")  # fmt: skip
    settings = {name: given[name] for name in same if name in given}
    if "roles" in given:
        settings["roles"] = tuple(a.roles.split(",")) if a.roles else DEFAULT_ROLES
    if "no_special_rows" in given:
        settings["special_rows"] = not a.no_special_rows
    return RolesConfig(**(settings | fields))


def parse_args(argv: list[str] | None) -> RolesConfig:
    p = argparse.ArgumentParser(prog="python -m analysis.roles", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="HF-format directory, bertjax run workdir, or hub id")
    p.add_argument("--step", type=int, help="checkpoint step of a bertjax run (default: latest)")
    add_data_arguments(p)
    add_test_arguments(p)
    add_variant_arguments(p)
    add_output_arguments(p, "roles_out", plots.ROLES_FIGURES)
    a = p.parse_args(argv)
    return config_from_args(a, ckpt=a.ckpt, step=a.step)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    run(config)
    if config.html:
        write_html(config.out)


def write_html(out: str) -> None:
    """`--html`: the report of the output just written."""
    # Imported here: analysis.report reads runs with this module's functions.
    from analysis import report

    report.write_report(report.ReportConfig(out))


if __name__ == "__main__":
    cli.run(main)
