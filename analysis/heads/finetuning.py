"""What fine-tuning does to the heads (`python -m analysis.finetune_effect`): the change in mean
sieve bias score per coarse role and layer third (Pande et al. Fig. 6) and the per-head cosine
similarity of the attention maps before and after (Kovaleva et al.), on the same sequences.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx
from matplotlib import colormaps
from matplotlib.figure import Figure

from analysis.common.examples import fit_max_length, prepare_inputs, resolve_tasks
from analysis.common.figures import save_figure
from analysis.common.finite import check_finite, silent_heads, warn_undefined
from analysis.common.flags import select_figures, select_formats
from analysis.common.forward import DataParallel, Devices, at_precision, compiled
from analysis.common.writing import write_tables
from analysis.heads.config import EFFECT_FIGURES as FIGURES
from analysis.heads.config import ONE_READING, RolesConfig
from analysis.heads.scoring import (
    SCORER_BATCH_AXES,
    ScoreCollector,
    TaskScores,
    gather_scores,
    reference_length,
    scored_batches,
)
from analysis.heads.summary import layer_groups
from analysis.tools import FigureJob
from bertjax import distributed, glue
from bertjax.config import BertConfig
from bertjax.errors import UserError
from bertjax.model import Model
from bertjax.pretrained import Checkpoint, from_pretrained, load_tokenizer
from bertjax.readings import attention_reading, attention_rows
from bertjax.settings import comma_list
from sieves.align import EncodedSequence
from sieves.builders import ROLES, present_roles
from sieves.kernel import sieve_scores

# Fig. 6's bars: the four coarse roles, then the delimiter's two halves on their own.
BARS: tuple[tuple[str, str], ...] = (
    ("local", "coarse"), ("syntactic", "coarse"), ("block", "coarse"), ("delimiter", "coarse"),
    ("cls", "fine"), ("sep", "fine"),
)  # fmt: skip

# What `.bertjax-output` says of this tool's `--out` (`runinfo.atomic_out`): only its kind is replaced.
EFFECT_OUTPUT = "finetune_effect output"

SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size", "max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class Post:
    """A fine-tuned checkpoint, the tasks to compare it on, and its name in tables and figures."""

    ckpt: str
    tasks: tuple[str, ...]
    label: str


@dataclasses.dataclass(frozen=True)
class EffectConfig:
    """`data.ckpt` is the pre-trained checkpoint; `data` also holds the data and output settings."""

    data: RolesConfig
    posts: tuple[Post, ...]

    # The output settings, as the runner (`analysis.tools.execute`) reads them of every tool's.
    out = property(lambda self: self.data.out)
    overwrite = property(lambda self: self.data.overwrite)
    distributed = property(lambda self: self.data.distributed)
    figure_format = property(lambda self: self.data.figure_format)


def parse_post(spec: str, default_tasks: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """`CKPT` (tasks from --task) or `CKPT:TASK[,TASK]` when the suffix names tasks; a suffix that
    names none must belong to an existing path."""
    path, sep, suffix = spec.rpartition(":")
    if sep and path:
        try:
            return path, tuple(resolve_tasks(comma_list(suffix)))
        except UserError:
            if not Path(spec).expanduser().exists():
                raise UserError(
                    f"--post {spec}: {suffix!r} after the last ':' is not a task (choose from {', '.join(glue.TASKS)}, "
                    f"all, or a comma-separated list) and {spec} is not an existing path"
                ) from None
    return spec, tuple(resolve_tasks(default_tasks))


def post_labels(paths: Sequence[str]) -> list[str]:
    """The run's directory name (a step folder gets `<run>@<step>`), numbered when repeated."""
    names = []
    for text in paths:
        path = Path(text).expanduser().resolve()
        is_step = path.name.isdigit() and path.parent.name == "checkpoints"
        names.append(f"{path.parent.parent.name}@{path.name}" if is_step else path.name)
    return [f"{n}#{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def effect_config(post: Sequence[str], data: RolesConfig) -> EffectConfig:
    """The comparison of `data.ckpt` (--pre) with each `--post` spec (at least one: the CLI
    requires the flag, the API checks its keyword); `data` holds the data and output flags, its
    task the posts' default tasks (then the union of the posts' tasks)."""
    if data.parser == "conllu" or data.conllu:
        # The comparison runs per GLUE task of each --post; gold trees would need a task of their own.
        raise UserError("--parser conllu / --conllu: finetune_effect compares on GLUE tasks parsed by spaCy only; "
                        "run analysis.roles --parser conllu on each checkpoint instead")  # fmt: skip
    if data.attention not in ONE_READING:
        raise UserError(
            f"--attention must be one of {', '.join(ONE_READING)} in analysis.finetune_effect, got {data.attention!r}"
        )
    specs = [parse_post(spec, data.task) for spec in post]
    labels = post_labels([path for path, _ in specs])
    posts = tuple(Post(path, tasks, label) for (path, tasks), label in zip(specs, labels, strict=True))
    tasks = tuple(dict.fromkeys(t for p in posts for t in p.tasks))
    return EffectConfig(data=dataclasses.replace(data, task=tasks), posts=posts)


def role_bars(role: str) -> list[str]:
    """The Fig. 6 bars a fine role counts towards: its coarse role, and [CLS] / [SEP] themselves."""
    return [bar for bar, kind in BARS if (bar == ROLES[role].coarse if kind == "coarse" else bar == role)]


def group_means(head_means: Mapping[str, np.ndarray], n_layers: int) -> pd.DataFrame:
    """Mean β of each Fig. 6 bar in each layer group.

    `head_means[role]` is [L, H], each head's mean per-sequence score. A bar's value in a group is
    the mean over the group's heads and the bar's fine roles (all have the same number of heads,
    so this is also the mean of the per-role means). A role no sequence scored (all NaN: a small
    --n or a short --max-length can leave `advmod` none) is left out of its bar, and a bar without
    a scored role is left out.
    """
    scored = {role: means for role, means in head_means.items() if not np.isnan(means).all()}
    rows = []
    for group, layers in layer_groups(n_layers):
        for bar, _ in BARS:
            members = [scored[r][layers] for r in scored if bar in role_bars(r)]
            if members:
                span = f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else f"{layers[0]}"
                rows.append({"group": group, "layers": span, "bar": bar, "mean": float(np.mean(members))})
    return pd.DataFrame(rows)


def mean_per_head(scores: np.ndarray) -> np.ndarray:
    """[L, H] mean over the sequences of [n, L, H] scores; NaN where no sequence has a scored row
    (a short --max-length can leave a role none)."""
    return scores.mean(axis=0) if len(scores) else np.full(scores.shape[1:], np.nan)


def attention_cosine(pre: jax.Array, post: jax.Array, real: jax.Array) -> jax.Array:
    """Cosine similarity of each head's attention map, flattened over real × real tokens.

    pre, post: float[L, B, H, T, T]; real: bool[B, T]. Returns float[L, B, H].
    """
    mask = (real[:, :, None] & real[:, None, :])[None, :, None]
    dtype = jnp.promote_types(pre.dtype, jnp.float32)
    a = jnp.where(mask, pre.astype(dtype), 0)
    b = jnp.where(mask, post.astype(dtype), 0)
    dot = (a * b).sum((-2, -1))
    return dot / jnp.sqrt((a * a).sum((-2, -1)) * (b * b).sum((-2, -1)))


def make_comparer(
    pre: Model,
    post: Model,
    devices: Devices | None = None,
    reading: str = "weights",
    reference: int | None = None,
) -> DataParallel:
    """One jitted function, one forward pass of each model: β of every role, layer and head for
    both, the rows' counts, and the per-example cosine of every head's attention maps, all on
    `reading` (`--attention`: the weights or the norm-weighted attention); data parallel over
    `devices`. `reference` (`scoring.reference_length`): the share score instead of β."""
    compare, states = compiled(_jit_comparer, pre, post, static=(reading, reference))
    return DataParallel(compare, states, devices, SCORER_BATCH_AXES)


def _jit_comparer(pre_graph, post_graph, reading, reference):
    @jax.jit
    def compare(states, input_ids, attention_mask, token_type_ids, rows, sieves):
        pre_state, post_state = states
        real = attention_mask.astype(bool)

        def attend(graph, state):
            out = nnx.merge(graph, state)(
                input_ids, attention_mask, token_type_ids, output_attentions=True, attention_norms=reading == "norms"
            )
            return out

        pre_out, post_out = attend(pre_graph, pre_state), attend(post_graph, post_state)
        (a, pre_keys), (b, post_keys) = attention_rows(pre_out, reading), attention_rows(post_out, reading)
        pre_scores, counts = sieve_scores(a, real, rows, sieves, key_weights=pre_keys, reference_length=reference)
        post_scores, _ = sieve_scores(b, real, rows, sieves, key_weights=post_keys, reference_length=reference)
        silent = (silent_heads(a, pre_keys, real), silent_heads(b, post_keys, real))
        if reading == "norms":
            # β ignores each row's scale, a whole map's cosine does not: it compares the renormalised rows.
            a, b = (jnp.stack(attention_reading(out, reading)) for out in (pre_out, post_out))
        return pre_scores, post_scores, counts, attention_cosine(a, b, real), *silent

    return compare


def compare_task(
    comparer, seqs: Sequence[EncodedSequence], config: RolesConfig, desc: str
) -> tuple[TaskScores, TaskScores, np.ndarray]:
    """Pre and post β of the task's sequences and the [L, H] cosine similarity summed over them,
    streamed batch by batch."""
    present, absent = present_roles((seq.num_segments for seq in seqs), config.roles)
    before, after = ScoreCollector(config.roles, present), ScoreCollector(config.roles, present)
    total: np.ndarray = np.zeros(())  # broadcasts to [L, H] at the first batch
    for chunk, (pre_scores, post_scores, counts, cosine, pre_silent, post_silent) in scored_batches(
        comparer, seqs, present, config, desc
    ):
        allowed = config.allow_nonfinite
        before.add(chunk, pre_scores, counts, pre_silent, f"{desc} (pre)", allowed)
        after.add(chunk, post_scores, counts, post_silent, f"{desc} (post)", allowed)
        silent = (pre_silent | post_silent)[:, : len(chunk)]
        check_finite(np.moveaxis(cosine[:, : len(chunk)], 1, 0), "the cosine", desc, np.moveaxis(silent, 1, 0), allowed)
        # An undefined head's map has no cosine: NaN, not the 0 of its all-zero rows.
        total = total + np.where(silent, np.nan, cosine[:, : len(chunk)]).astype(np.float64).sum(axis=1)
    warn_undefined(before.silent | after.silent, desc, "their scores and cosines are")
    return before.result(absent, len(seqs)), after.result(absent, len(seqs)), total


def shape_differences(one: BertConfig, other: BertConfig) -> list[str]:
    """The sizes in which two models differ, as `field one vs other`: models compared head by head
    (or token by token) must have none."""
    return [
        f"{f} {getattr(one, f)} vs {getattr(other, f)}" for f in SHAPE_FIELDS if getattr(one, f) != getattr(other, f)
    ]


def check_same_shape(pre: str, post: str, pre_source: Checkpoint, post_source: Checkpoint) -> None:
    differ = shape_differences(pre_source.config, post_source.config)
    if differ:
        raise UserError(
            f"--pre {pre} and --post {post} have different shapes ({', '.join(differ)}); compare a model with its own fine-tuned copy"
        )


def check_same_vocabulary(pre_tokenizer, post: str, post_source: Checkpoint) -> None:
    """The sequences are encoded once with the pre tokenizer, so the post one must agree."""
    if load_tokenizer(post_source).get_vocab() != pre_tokenizer.get_vocab():
        raise UserError(f"--post {post}: its tokenizer's vocabulary differs from the pre-trained checkpoint's")


@dataclasses.dataclass(eq=False)
class EffectRun:
    """A finetune_effect run held in memory: `tables` by file name without `.csv` (beta_change,
    head_means, attention_similarity), `info` (run.json's provenance and settings, without the
    figures and the environment, which the writer adds) and the timings of its stages."""

    config: EffectConfig
    tables: dict[str, pd.DataFrame]
    info: dict
    timings: dict[str, float]

    def text(self) -> str:
        """What the CLI prints at the end of a run."""
        return format_changes(self.tables["beta_change"], self.tables["attention_similarity"])

    @property
    def figures(self) -> tuple[str, ...]:
        """The figure kinds the config asks for, in drawing order."""
        return select_figures(self.config.data.figures, FIGURES)


def prepare(config: EffectConfig, sources: Sequence[Checkpoint], post_models: Sequence | None = None) -> EffectConfig:
    """The checks made before anything is read or written, and `config` with its max length cut to
    the pre-trained model's positions (the sequences are encoded once, before any model loads).
    `sources`: the pre-trained checkpoint, then each of `config.posts`, opened."""
    if post_models is not None and len(post_models) != len(config.posts):
        raise UserError(f"post_models: {len(post_models)} models for {len(config.posts)} --post checkpoints")
    select_figures(config.data.figures, FIGURES)
    select_formats(config.data.figure_format)
    pre_source, *post_sources = sources
    for post, post_source in zip(config.posts, post_sources, strict=True):
        check_same_shape(config.data.ckpt, post.ckpt, pre_source, post_source)
    positions = pre_source.config.max_sequence_length
    config = dataclasses.replace(config, data=fit_max_length(config.data, positions))
    distributed.initialize(config.data.distributed)
    return config


def compute(
    config: EffectConfig,
    sources: Sequence[Checkpoint],
    model=None,
    tokenizer=None,
    post_models: Sequence | None = None,
) -> EffectRun:
    """Both comparisons for every post checkpoint, in memory; writes nothing (the parse cache
    aside). `sources`: the pre-trained checkpoint, then each of `config.posts`, opened. `model`,
    `tokenizer`: the pre-trained checkpoint already loaded; `post_models`: each post checkpoint
    already loaded, in the order of `config.posts`."""
    return _compute(prepare(config, sources, post_models), sources, model, tokenizer, post_models)


@at_precision("data.precision")
def _compute(
    config: EffectConfig, sources: Sequence[Checkpoint], pre, tokenizer, post_models: Sequence | None
) -> EffectRun:
    rc = config.data
    pre_source, *post_sources = sources
    timings: dict[str, float] = {}
    if tokenizer is None:
        tokenizer = load_tokenizer(pre_source)
    for post, post_source in zip(config.posts, post_sources, strict=True):
        check_same_vocabulary(tokenizer, post.ckpt, post_source)
    inputs = prepare_inputs(rc, list(dict.fromkeys(t for post in config.posts for t in post.tasks)))
    sequences = inputs.encode(tokenizer, timings)
    devices = Devices.local(rc.devices)

    clock = time.perf_counter()
    if pre is None:
        pre = from_pretrained(pre_source, allow_nonfinite=rc.allow_nonfinite)
    timings["load_pre"] = time.perf_counter() - clock
    n_layers = pre.config.num_hidden_layers

    parts: dict[str, list[pd.DataFrame]] = {"beta_change": [], "head_means": [], "attention_similarity": []}
    for i, post in enumerate(config.posts):
        clock = time.perf_counter()
        loaded = None if post_models is None else post_models[i]
        if loaded is None:
            loaded = from_pretrained(post_sources[i], allow_nonfinite=rc.allow_nonfinite)
        comparer = make_comparer(pre, loaded, devices, rc.attention, reference_length(rc))
        for task in post.tasks:
            with distributed.all_ok("scoring"):
                before, after, cosine = compare_task(comparer, sequences[task], rc, f"{post.label} {task}")
            before, after = (gather_scores({task: r}, inputs.n_sequences)[task] for r in (before, after))
            cosine = distributed.gather_rows(cosine[None]).sum(axis=0) / inputs.n_sequences[task]
            tables = task_tables(before, after, cosine, post.label, task, inputs.n_sequences[task], n_layers)
            for name, table in tables.items():
                parts[name].append(table)
        timings[post.label] = time.perf_counter() - clock

    keys = ["post_ckpt", "task"]
    tables = {
        "beta_change": pd.concat(parts["beta_change"], ignore_index=True)[
            [*keys, "group", "layers", "bar", "pre", "post", "change"]
        ],
        "head_means": pd.concat(parts["head_means"], ignore_index=True),
        "attention_similarity": pd.concat(parts["attention_similarity"], ignore_index=True),
    }
    tables["head_means"]["change"] = tables["head_means"]["post"] - tables["head_means"]["pre"]
    info = {
        "config": dataclasses.asdict(config),
        "pre": pre_source.describe(),
        "posts": {p.label: s.describe() for p, s in zip(config.posts, post_sources, strict=True)},
        "layer_groups": {name: [int(x) for x in layers] for name, layers in layer_groups(n_layers)},
        "data_files": inputs.data_files,
        "sequences": inputs.n_sequences,
        "mesh": devices.record(),
        "processes": jax.process_count(),
    }
    return EffectRun(config, tables, info, timings)


def task_tables(
    before: TaskScores, after: TaskScores, cosine: np.ndarray, label: str, task: str, n_sequences: int, n_layers: int
) -> dict[str, pd.DataFrame]:
    """One (post, task)'s rows of the three tables, from the pre and post scores of every sequence
    and the [L, H] mean cosine."""
    head_before = {r: mean_per_head(s) for r, s in before.scores.items()}
    head_after = {r: mean_per_head(s) for r, s in after.scores.items()}
    bars = (
        group_means(head_before, n_layers)
        .merge(group_means(head_after, n_layers), on=["group", "layers", "bar"], suffixes=("_pre", "_post"))
        .rename(columns={"mean_pre": "pre", "mean_post": "post"})
    )
    bars["change"] = bars["post"] - bars["pre"]
    means = []
    for role in before.scores:
        layers, heads = np.meshgrid(np.arange(n_layers), np.arange(head_before[role].shape[1]), indexing="ij")
        means.append(pd.DataFrame({"post_ckpt": label, "task": task, "layer": layers.ravel(), "head": heads.ravel(),
                                   "role": role, "n": len(before.scores[role]), "pre": head_before[role].ravel(),
                                   "post": head_after[role].ravel()}))  # fmt: skip
    layers, heads = np.meshgrid(np.arange(cosine.shape[0]), np.arange(cosine.shape[1]), indexing="ij")
    similarity = pd.DataFrame({"post_ckpt": label, "task": task, "layer": layers.ravel(), "head": heads.ravel(),
                               "n": n_sequences, "cosine": cosine.ravel()})  # fmt: skip
    return {"beta_change": bars.assign(post_ckpt=label, task=task), "head_means": pd.concat(means, ignore_index=True),
            "attention_similarity": similarity}  # fmt: skip


def write(result: EffectRun, directory: Path) -> dict:
    """The one writer of a finetune_effect run's tables (the CLI's and the API's) into `directory`;
    returns what run.json records of the run, its own stages' `timings_s` among them, for the
    runner to complete."""
    write_tables(result.tables, directory)
    # `config` again: its place kept, its `out` a saved copy's
    return result.info | {"config": dataclasses.asdict(result.config), "timings_s": result.timings}


def draw_jobs(result: EffectRun, directory: Path) -> list[FigureJob]:
    """The figures `result.config` asks for, as jobs drawing into `directory`."""
    return [(PLOTS[kind], (result.tables[kind], directory, kind)) for kind in result.figures]


def format_changes(changes: pd.DataFrame, similarity: pd.DataFrame) -> str:
    lines = []
    for (label, task), part in changes.groupby(["post_ckpt", "task"], sort=False):
        lines.append(f"{label} on {task}: change in mean β (post − pre)")
        lines.append(part.pivot(index="bar", columns="group", values="change").reindex(
            [b for b, _ in BARS if b in set(part["bar"])])[list(dict.fromkeys(part["group"]))].round(3).to_string())  # fmt: skip
        cos = similarity[(similarity["post_ckpt"] == label) & (similarity["task"] == task)]
        by_layer = cos.groupby("layer")["cosine"].mean().round(3).rename("cosine").to_frame().T
        lines.append("attention cosine similarity (pre vs post), mean over each layer's heads:")
        lines.append(by_layer.rename_axis(columns="layer").to_string())
    return "\n".join(lines)


def _panels(count: int, width: float, height: float) -> tuple[Figure, list]:
    ncols = min(2, count)
    nrows = math.ceil(count / ncols)
    fig = Figure(figsize=(width * ncols + 1.0, height * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for spare in axes[count:]:
        fig.delaxes(spare)
    return fig, list(axes[:count])


def plot_beta_change(changes: pd.DataFrame, out_dir: Path, stem: str) -> list[Path]:
    """Paper Fig. 6: per (post, task) grouped bars, one bar per layer group for each role."""
    pairs = list(dict.fromkeys(zip(changes["post_ckpt"], changes["task"], strict=True)))
    fig, axes = _panels(len(pairs), 5.2, 3.4)
    cmap = colormaps["viridis"]
    for ax, (label, task) in zip(axes, pairs, strict=True):
        part = changes[(changes["post_ckpt"] == label) & (changes["task"] == task)]
        bars = [b for b, _ in BARS if b in set(part["bar"])]
        groups = list(dict.fromkeys(part["group"]))
        width = 0.8 / len(groups)
        for g, group in enumerate(groups):
            values = part[part["group"] == group].set_index("bar")["change"].reindex(bars)
            layers = part.loc[part["group"] == group, "layers"].iloc[0]
            ax.bar(np.arange(len(bars)) + (g - (len(groups) - 1) / 2) * width, values, width,
                   color=cmap((g + 0.5) / len(groups)), label=f"{group} ({layers})")  # fmt: skip
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(bars)), ["[CLS]" if b == "cls" else "[SEP]" if b == "sep" else b for b in bars])
        ax.set_ylabel("Δ mean β (post − pre)")
        ax.set_title(f"{label} on {task}", fontsize=9)
        ax.legend(fontsize=7, title="layers", title_fontsize=7)
    fig.suptitle("Change in mean sieve bias score after fine-tuning, per layer group")
    return save_figure(fig, out_dir, stem)


def plot_similarity(similarity: pd.DataFrame, out_dir: Path, stem: str) -> list[Path]:
    """Kovaleva et al.: layers × heads cosine similarity of pre and post attention, per (post, task)."""
    pairs = list(dict.fromkeys(zip(similarity["post_ckpt"], similarity["task"], strict=True)))
    n_layers, n_heads = int(similarity["layer"].max()) + 1, int(similarity["head"].max()) + 1
    fig, axes = _panels(len(pairs), max(3.6, 1.2 + 0.42 * n_heads), max(2.6, 0.8 + 0.42 * n_layers))
    low = min(0.0, float(similarity["cosine"].min()))
    for ax, (label, task) in zip(axes, pairs, strict=True):
        part = similarity[(similarity["post_ckpt"] == label) & (similarity["task"] == task)]
        grid = part.set_index(["layer", "head"])["cosine"].unstack("head").to_numpy()
        mesh = ax.pcolormesh(np.arange(n_heads + 1) - 0.5, np.arange(n_layers + 1) - 0.5, grid,
                             cmap=colormaps["viridis"], vmin=low, vmax=1.0)  # fmt: skip
        for (layer, head), value in np.ndenumerate(grid):
            ax.text(head, layer, f"{value:.3f}", ha="center", va="center", fontsize=6,
                    color="black" if value > low + 0.6 * (1 - low) else "white")  # fmt: skip
        ax.set_ylim(n_layers - 0.5, -0.5)
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{label} on {task}", fontsize=9)
    fig.colorbar(mesh, ax=axes, shrink=0.8, label="cosine similarity")
    fig.suptitle("Attention before vs after fine-tuning, per head")
    return save_figure(fig, out_dir, stem)


PLOTS = {"beta_change": plot_beta_change, "attention_similarity": plot_similarity}
