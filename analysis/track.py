"""`python -m analysis.track --run WORKDIR | --ckpt SRC[@LABEL] ...`: head roles along a series of checkpoints.

The series is the checkpoints of a bertjax training run (pre-training or fine-tuning; `--with-init`
adds the checkpoint a fine-tuning run started from as step 0), or any ordered list of checkpoints
that `from_pretrained` loads: `--ckpt` repeated, each `SOURCE[@LABEL]`, or one `--ckpt` pattern with
a `{step}` placeholder filled from `--steps` (e.g. a hub series of intermediate checkpoints). The x
axis is the step: a run's step, an integer label, the placeholder's value, or, when some member has
no integer step, its position in the order given (0, 1, ...). The members must share the numbers
of layers and heads and the tokenizer vocabulary; a mismatch stops the run before any scoring.

The sequences (examples → parses → encodings) are prepared once and scored by each checkpoint
with `analysis.roles`' jitted forward + sieve kernel. The per-sequence scores of each step are
cached on disk under a key of every setting that changes them and of the checkpoint's identity (an
orbax step's params files; a HF directory's files, whose resolved hub-cache blobs name their
content hashes and whose snapshot path names the hub revision), so a re-run after more checkpoints
appear analyses only the new ones; the hypothesis tests are recomputed from the cached scores, so τ,
α, the test and the correction can change without re-scoring.

Outputs (written into a temporary sibling of `--out` and renamed when complete): `track.csv` (the
`roles.csv` columns plus `step`), `onset.csv` (when each head takes on each role: `analysis.onset`),
per task the figures `role_fractions`, `emergence`, `mean_beta` and `onset` (heads holding each
role against step, with the run's held-out MLM accuracy when it recorded one), and `run.json`
(with the series: each member's step, label, source and resolved path).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import os
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from tqdm import tqdm

from analysis import onset, plots, roles
from analysis.summary import layer_groups, ordered_roles
from bertjax import checkpoint as ckpt
from bertjax import cli, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import Source, from_pretrained, load_config, load_tokenizer, resolve

TRACK_CSV = "track.csv"
STEP_PLACEHOLDER = "{step}"
INIT_LABEL = "init"
# Bump when the cached arrays or the way they are computed change: old entries are then ignored.
SCORES_FORMAT = 1
# The figure kinds drawn per task, for `--figures`.
FIGURES = ("role_fractions", "emergence", "mean_beta", "onset")

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrackConfig:
    """`roles.ckpt` is the run's workdir (`--run`), empty for a `--ckpt` series; `series` the
    `--ckpt` texts as given; `steps` the run's steps to analyse (None: every checkpoint) or the
    values of a `{step}` pattern."""

    roles: roles.RolesConfig
    steps: tuple[int, ...] | None = None
    scores_cache: str | None = None
    series: tuple[str, ...] = ()
    with_init: bool = False

    @property
    def cache_dir(self) -> Path:
        if self.scores_cache is not None:
            return Path(self.scores_cache).expanduser().resolve()
        out = Path(self.roles.out).expanduser().resolve()
        return out.parent / f"{out.name}.cache"


def run_steps(run: str, wanted: Sequence[int] | None) -> tuple[Path, list[int]]:
    """(orbax manager directory, sorted steps to analyse) of a training run's workdir."""
    path = Path(run).expanduser()
    if not path.is_dir():
        raise UserError(f"--run {path}: no such directory")
    if (path / "config.json").is_file():
        raise UserError(f"--run {path}: a HF-format directory has no checkpoints to track; pass a training run's workdir")
    directory = ckpt.checkpoint_dir(path.resolve())
    if directory is None:
        raise UserError(f"--run {path}: no bertjax checkpoints found (expected {ckpt.CHECKPOINTS}/<step>/)")
    available = ckpt.available_steps(directory)
    if wanted is None:
        return directory, available
    if not wanted:
        raise UserError("--steps names no step; give comma-separated steps, or leave --steps out for every checkpoint")
    missing = sorted(set(wanted) - set(available))
    if missing:
        raise UserError(f"--steps: {path} has no checkpoint for step {', '.join(map(str, missing))}; available: {available}")
    return directory, sorted(set(wanted))


@dataclasses.dataclass(frozen=True)
class Member:
    """One checkpoint of the tracked series: `step` places it on the x axis, `label` names it,
    `given` is the text it came from (a `--ckpt` source or the `--run` workdir)."""

    step: int
    label: str
    given: str
    source: Source

    def describe(self) -> dict:
        source = self.source
        return {"step": self.step, "label": self.label, "given": self.given, "kind": source.kind,
                "path": str(source.path), "checkpoint_step": source.step}  # fmt: skip


def run_members(run: str, wanted: Sequence[int] | None, with_init: bool) -> list[Member]:
    """The checkpoints of a training run's workdir, led by its init at step 0 with `with_init`."""
    directory, steps = run_steps(run, wanted)
    check_one_tokenizer(directory, steps)
    members = [Member(s, str(s), run, Source("orbax", directory, s)) for s in steps]
    if not with_init:
        return members
    run_config = ckpt.read_meta(directory, steps[-1]).get("run_config") or {}
    if not run_config.get("init") or "task" not in run_config:
        raise UserError(f"--with-init: {run} is not a fine-tuning run (its config names no init checkpoint)")
    if steps[0] == 0:
        raise UserError(f"--with-init: {run} has a checkpoint at step 0 already")
    init = Member(0, INIT_LABEL, run_config["init"], resolve(run_config["init"], run_config.get("init_step")))
    return [init, *members]


def split_label(text: str) -> tuple[str, str | None]:
    """`SOURCE@LABEL` → (SOURCE, LABEL); an `@` followed by a path separator belongs to the path."""
    source, at, label = text.rpartition("@")
    if not at or not source or not label or "/" in label:
        return text, None
    return source, label


def _integer(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def series_members(specs: Sequence[str], steps: Sequence[int] | None) -> list[Member]:
    """The members of a `--ckpt` series, ordered by step (resolving, hence downloading, hub ids)."""
    patterns = [s for s in specs if STEP_PLACEHOLDER in s]
    if patterns:
        if len(specs) > 1:
            raise UserError(f"--ckpt {patterns[0]}: a {STEP_PLACEHOLDER} pattern is the only --ckpt of its series")
        if steps is None:
            raise UserError(f"--ckpt {patterns[0]}: a {STEP_PLACEHOLDER} pattern needs --steps (comma-separated)")
        if not steps:
            raise UserError("--steps names no step; give comma-separated steps")
        pattern = specs[0]
        if split_label(pattern)[1] is not None:
            raise UserError(f"--ckpt {pattern}: a {STEP_PLACEHOLDER} pattern takes no @LABEL (steps label it)")
        filled = [(s, pattern.replace(STEP_PLACEHOLDER, str(s))) for s in sorted(set(steps))]
        return [Member(s, str(s), text, resolve(text)) for s, text in filled]
    if steps is not None:
        raise UserError(f"--steps goes with --run or a --ckpt pattern holding {STEP_PLACEHOLDER}, not a --ckpt list")
    parts = [split_label(s) for s in specs]
    sources = [resolve(text) for text, _ in parts]
    # An integer label is the step; an unlabelled bertjax checkpoint brings its own.
    numeric = [_integer(label) if label is not None else (src.step if src.kind == "orbax" else None)
               for (_, label), src in zip(parts, sources, strict=True)]  # fmt: skip
    if all(n is not None for n in numeric):
        members = [Member(n, label if label is not None else str(n), text, src)
                   for n, (text, label), src in zip(numeric, parts, sources, strict=True)]  # fmt: skip
        members.sort(key=lambda m: m.step)
    else:
        members = [Member(i, label if label is not None else text, text, src)
                   for i, ((text, label), src) in enumerate(zip(parts, sources, strict=True))]  # fmt: skip
    for a, b in itertools.pairwise(members):
        if a.step == b.step or a.label == b.label:
            what = f"step {a.step}" if a.step == b.step else f"label {a.label!r}"
            raise UserError(f"--ckpt {a.given} and {b.given} are both at {what}; give each a distinct @LABEL")
    return members


def check_series(members: Sequence[Member]) -> list:
    """The members' model configs, after checking that they share layers, heads and the tokenizer
    vocabulary: the sequences are encoded once, and the tables and figures index heads by
    (layer, head). The first mismatch with the first member is one line."""
    configs = [load_config(m.source) for m in members]
    first, shape = members[0], (configs[0].num_hidden_layers, configs[0].num_attention_heads)
    for member, config in zip(members[1:], configs[1:], strict=True):
        other = (config.num_hidden_layers, config.num_attention_heads)
        if other != shape:
            raise UserError(
                f"the series mixes model shapes: {first.given} ({first.label}) has {shape[0]} layers × {shape[1]} heads, "
                f"{member.given} ({member.label}) has {other[0]} layers × {other[1]} heads; track them separately"
            )
    vocabularies: dict = {}
    for member in members:
        key = tokenizer_location(member.source)
        if key not in vocabularies:
            vocabularies[key] = (member, load_tokenizer(member.source.path, step=member.source.step).get_vocab())
    (first, vocabulary), *others = vocabularies.values()
    for member, other in others:
        if other != vocabulary:
            raise UserError(
                f"the series mixes tokenizers: {member.given} ({member.label}) has another tokenizer vocabulary "
                f"({len(other)} tokens) than {first.given} ({first.label}, {len(vocabulary)} tokens); track them separately"
            )
    return configs


def tokenizer_location(source: Source) -> tuple:
    """Where a checkpoint's tokenizer is stored: members sharing one are compared once."""
    if source.kind == "hf":
        return ("hf", str(source.path.resolve()))
    return ("orbax", str(source.path.resolve()), ckpt.read_meta(source.path, source.step)["tokenizer"])


def check_one_tokenizer(directory: Path, steps: Sequence[int]) -> None:
    """Sequences are encoded once for all steps, so every step must name the same tokenizer."""
    tokenizers = {step: ckpt.read_meta(directory, step)["tokenizer"] for step in steps}
    if len(set(tokenizers.values())) > 1:
        found = ", ".join(f"step {s}: {t}" for s, t in tokenizers.items())
        raise UserError(f"{directory}: the checkpoints use different tokenizers ({found}); track them separately")


def checkpoint_identity(directory: Path, step: int) -> dict:
    """Path, step and the params files' names, sizes and mtimes: a re-trained step misses the cache."""
    folder = (directory / str(step)).resolve()
    files = sorted(p for p in (folder / ckpt.PARAMS).rglob("*") if p.is_file())
    return {
        "path": str(folder),
        "step": step,
        "params": [[str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns] for p in files],
    }


def hf_identity(path: Path, step: int) -> dict:
    """A HF directory's resolved path and its files' resolved names, sizes and mtimes. In the hub
    cache the path names the revision and each file resolves to a blob named by its content hash."""
    folder = path.resolve()
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {
        "path": str(folder),
        "step": step,
        "files": [[p.name, str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files],
    }


def member_identity(member: Member) -> dict:
    if member.source.kind == "hf":
        return hf_identity(member.source.path, member.step)
    # The path names the checkpoint's own step; "step" is its place in the series (and the cache
    # file's name), the same for a run's members.
    return {**checkpoint_identity(member.source.path, member.source.step), "step": member.step}


def settings_key(config: roles.RolesConfig, data_files: dict, tokenizer, parser) -> dict:
    """Every setting that changes the per-sequence scores (not τ, α, the test or the correction)."""
    return {
        "format": SCORES_FORMAT,
        "jax": jax.__version__,
        "tasks": list(data_files),
        "glue": "hub" if config.glue_dir is None and config.parser != "conllu" else "files",
        "data_files": data_files,
        "split": config.split,
        "n": config.n,
        "max_length": config.max_length,
        # Batch composition fixes the padded lengths, hence the float summation order.
        "batch_size": config.batch_size,
        "roles": list(config.roles),
        "window": config.window,
        "special_rows": config.special_rows,
        "parser": config.parser if parser is None else [parser.name, parser.version],
        "tokenizer": hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest(),
    }


def cache_path(cache_dir: Path, settings: dict, identity: dict) -> Path:
    digest = hashlib.sha256(json.dumps([settings, identity], sort_keys=True).encode()).hexdigest()
    return cache_dir / f"step-{identity['step']:09d}-{digest[:16]}.npz"


def prepare_cache(cache_dir: Path, out: Path) -> None:
    """Creates the scores cache, or stops before any scoring when it cannot serve: inside --out,
    which every run replaces whole, it would be deleted each time."""
    if cache_dir == out or out in cache_dir.parents:
        raise UserError(f"--scores-cache {cache_dir}: inside --out {out}, which each run replaces; put the cache elsewhere")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--scores-cache {cache_dir}: cannot create it ({e.strerror})") from None


def save_scores(path: Path, results: dict[str, roles.TaskScores], settings: dict, identity: dict) -> None:
    arrays = {}
    for task, result in results.items():
        for role, scores in result.scores.items():
            arrays[f"{task}/{role}"] = scores
            arrays[f"{task}/{role}/index"] = result.indices[role]
    about = {
        "tasks": {t: {"n_sequences": r.n_sequences, "absent": r.absent, "roles": list(r.scores)} for t, r in results.items()},
        "settings": settings,
        "checkpoint": identity,
    }
    arrays["about"] = np.array(json.dumps(about))
    # The process id keeps two runs that score the same step from writing one temporary file.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def load_scores(path: Path) -> dict[str, roles.TaskScores]:
    with np.load(path) as stored:
        about = json.loads(str(stored["about"]))
        return {
            task: roles.TaskScores(
                scores={r: stored[f"{task}/{r}"] for r in info["roles"]},
                indices={r: stored[f"{task}/{r}/index"] for r in info["roles"]},
                absent=info["absent"],
                n_sequences=info["n_sequences"],
            )
            for task, info in about["tasks"].items()
        }


def read_cached(path: Path) -> dict[str, roles.TaskScores] | None:
    """The cache entry at `path`, or None when there is none or it cannot be read whole (torn,
    overwritten, holding pickled objects): that one is reported and scored again, which replaces it."""
    if not path.is_file():
        return None
    try:
        return load_scores(path)
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:
        log.warning("scores cache entry %s cannot be read (%s: %s); its step is scored again", path, type(e).__name__, e)
        return None


def run(config: TrackConfig) -> pd.DataFrame:
    """Analyses the series' checkpoints (cached ones from the cache); returns the track table."""
    started = time.perf_counter()
    plots.select_figures(config.roles.figures, FIGURES)
    plots.select_formats(config.roles.figure_format)
    if config.series:
        if config.with_init:
            raise UserError("--with-init goes with --run (a fine-tuning workdir); in a --ckpt series, list the init")
        members = series_members(config.series, config.steps)
    else:
        members = run_members(config.roles.ckpt, config.steps, config.with_init)
    # Before anything is encoded or scored; the cut too: the sequences are encoded once, before
    # any model is loaded.
    positions = min(c.max_position_embeddings for c in check_series(members))
    config = dataclasses.replace(config, roles=roles.fit_max_length(config.roles, positions))
    rc = config.roles
    tasks = roles.config_tasks(rc)
    out = Path(rc.out).expanduser().resolve()
    prepare_cache(config.cache_dir, out)
    # Re-running into the same --out is the point of the cache: a previous track output may go.
    with runinfo.atomic_out(out, rc.overwrite or (out / TRACK_CSV).is_file()) as tmp:
        return _run(config, members, tasks, tmp, started)


def _run(config: TrackConfig, members: list[Member], tasks: list[str], tmp: Path, started: float) -> pd.DataFrame:
    rc = config.roles
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    steps = [m.step for m in members]
    by_step = {m.step: m for m in members}
    tokenizer = load_tokenizer(members[0].source.path, step=members[0].source.step)
    data = roles.load_tasks(rc, tasks)
    data_files = roles.data_file_hashes(data)
    parser = roles.make_parser(rc)
    settings = settings_key(rc, data_files, tokenizer, parser)
    identities = {m.step: member_identity(m) for m in members}
    paths = {s: cache_path(config.cache_dir, settings, identities[s]) for s in steps}
    # Each step is tested as soon as its scores are read or computed (the tests are cheap), so its
    # scores are read once and only one step's are held at a time.
    tested: dict[int, tuple[pd.DataFrame, float]] = {}
    for step in steps:
        if (cached_scores := read_cached(paths[step])) is not None:
            tested[step] = roles.test_roles(cached_scores, rc)
    todo = [s for s in steps if s not in tested]
    timings["load_data"] = time.perf_counter() - clock
    print(f"track: {len(steps)} checkpoints, {len(steps) - len(todo)} from the cache {config.cache_dir}, {len(todo)} to analyse")

    if todo:
        sequences = roles.encode_tasks(rc, data, tokenizer, parser, timings)
        for step in tqdm(todo, desc="checkpoints", unit="ckpt"):
            clock = time.perf_counter()
            source = by_step[step].source
            model = from_pretrained(source.path, step=source.step)
            step_timings: dict[str, float] = {}
            results = roles.score_sequences(roles.make_scorer(model), sequences, rc, step_timings)
            save_scores(paths[step], results, settings, identities[step])
            tested[step] = roles.test_roles(results, rc)
            timings[f"step {step}"] = time.perf_counter() - clock

    clock = time.perf_counter()
    taus = {step: tested[step][1] for step in steps}
    tables = [tested[step][0].assign(step=step)[["step", *tested[step][0].columns]] for step in steps]
    track = pd.concat(tables, ignore_index=True)
    track.to_csv(tmp / TRACK_CSV, index=False)
    onsets = onset.role_onsets(track)
    onsets.to_csv(tmp / onset.ONSET_CSV, index=False)
    # Held-out metrics are a bertjax pre-training workdir's; a --ckpt series has no workdir.
    heldout = None if config.series else onset.read_heldout(Path(rc.ckpt).expanduser())
    timings["tests"] = time.perf_counter() - clock

    clock = time.perf_counter()
    figures = []
    draw = {
        "role_fractions": plot_role_fractions,
        "emergence": plot_emergence,
        "mean_beta": functools.partial(plot_mean_beta, taus=taus),
        "onset": functools.partial(onset.plot_onset, heldout=heldout),
    }
    with plots.figure_formats(plots.select_formats(rc.figure_format)):
        for kind in plots.select_figures(rc.figures, FIGURES):
            for task in pd.unique(track["task"]):
                figures += draw[kind](track, task, out_dir=tmp, stem=f"{task}_{kind}")
    timings["figures"] = time.perf_counter() - clock
    timings["total"] = time.perf_counter() - started

    runinfo.write_run_json(
        tmp,
        {
            "config": dataclasses.asdict(config),
            # --run's checkpoints directory, as before the series (null for a --ckpt series).
            "checkpoints": None if config.series else str(members[-1].source.path),
            "series": [m.describe() for m in members],
            "steps": steps,
            "analysed_steps": todo,
            "cached_steps": [s for s in steps if s not in todo],
            "scores_cache": {str(s): str(p) for s, p in paths.items()},
            "tau": {str(s): t for s, t in taus.items()},
            "parser": None if parser is None else {"name": parser.name, "version": parser.version},
            "data_files": data_files,
            "heldout_metrics": None if heldout is None else heldout.reset_index().to_dict("records"),
            "figures": sorted(p.name for p in figures),
            "timings_s": {k: round(v, 3) for k, v in timings.items()},
        },
    )
    print(format_fractions(track))
    print(onset.format_onsets(track, onsets))
    return track


# -- tables and figures -------------------------------------------------------------------------


def held_fractions(track: pd.DataFrame, task: str) -> pd.DataFrame:
    """Fraction of heads holding each role at each step, overall and per layer group.

    Rows (step, group) with group "all" and the names of `layer_groups`; columns are roles. The
    denominator is every head of the group (a head with no test does not hold the role).
    """
    rows = track[track["task"] == task]
    n_layers = int(rows["layer"].max()) + 1
    held = rows.assign(assigned=rows["assigned"].astype(bool))
    frames = [held.assign(group="all")]
    if n_layers > 1:
        frames += [held[held["layer"].isin(layers)].assign(group=name) for name, layers in layer_groups(n_layers)]
    stacked = pd.concat(frames)
    fractions = stacked.groupby(["step", "group", "role"], sort=False)["assigned"].mean().unstack("role")
    return fractions[ordered_roles(fractions.columns)]


def format_fractions(track: pd.DataFrame) -> str:
    lines = []
    for task in pd.unique(track["task"]):
        overall = held_fractions(track, task).xs("all", level="group")
        lines.append(f"{task}: % of heads holding each role, by step")
        lines.append((100 * overall).round(1).to_string())
    return "\n".join(lines)


def plot_role_fractions(track: pd.DataFrame, task: str, out_dir: Path, stem: str) -> list[Path]:
    """Fraction of heads holding each role against step: all layers, then each layer group."""
    fractions = held_fractions(track, task)
    groups = list(dict.fromkeys(fractions.index.get_level_values("group")))
    colours = plots.role_colours(list(fractions.columns))
    fig = Figure(figsize=(3.6 * len(groups) + 1.6, 3.6), layout="constrained")
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    n_layers = int(track.loc[track["task"] == task, "layer"].max()) + 1
    spans = {"all": np.arange(n_layers), **dict(layer_groups(n_layers))}
    for ax, group in zip(axes, groups, strict=True):
        part = fractions.xs(group, level="group")
        steps = part.index.to_numpy()
        for role in part.columns:
            ax.plot(steps, part[role], marker="o", markersize=3, color=colours[role], label=role)
        plots.step_axis(ax, steps)
        layers = spans[group]
        ax.set_title(f"{group} (layers {layers[0]}–{layers[-1]})" if len(layers) > 1 else f"{group} (layer {layers[0]})", fontsize=9)
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("fraction of heads holding the role")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"{task}: heads holding each role during training")
    return plots.save_figure(fig, out_dir, stem)


def plot_emergence(track: pd.DataFrame, task: str, out_dir: Path, stem: str) -> list[Path]:
    """Per role, heads (rows, layer-major) × steps (columns): coloured where the head holds it."""
    rows = track[track["task"] == task]
    names = ordered_roles(rows["role"])
    steps = np.sort(pd.unique(rows["step"]))
    n_layers, n_heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    grid = pd.MultiIndex.from_product([range(n_layers), range(n_heads)], names=["layer", "head"])
    colours = plots.role_colours(names)
    fig, axes = plots.panel_grid(
        len(names),
        (max(0.9, 0.22 * len(steps)), max(0.9, 0.035 * n_layers * n_heads)),
        f"{task}: which heads hold each role at each step\n"
        "(rows: heads by layer; light grey: not held; dark grey: untested)",
        xlabel="step",
        # Room for step numbers written upright.
        margins=plots.Margins(bottom=0.8),
    )
    for ax, role in zip(axes, names, strict=True):
        part = rows[rows["role"] == role].set_index(["layer", "head", "step"])
        # A NaN p-value (n < 2, zero variance) is untested, which must not read as "not held".
        held = part["assigned"].astype(float).where(part["p_value"].notna())
        cells = held.unstack("step").reindex(index=grid, columns=steps).to_numpy()
        ax.pcolormesh(
            np.arange(len(steps) + 1) - 0.5,
            np.arange(n_layers * n_heads + 1) - 0.5,
            np.ma.masked_invalid(cells),
            cmap=ListedColormap([plots.NOT_HELD, colours[role]]).with_extremes(bad=plots.NO_DATA),
            vmin=0,
            vmax=1,
        )
        for boundary in range(1, n_layers):
            ax.axhline(boundary * n_heads - 0.5, color="white", linewidth=0.8)
        ax.tick_params(labelsize=6, length=2)
        ax.tick_params(axis="x", labelrotation=90)
        ax.set_title(role, fontsize=9)
    axes[0].set_ylim(n_layers * n_heads - 0.5, -0.5)
    axes[0].set_yticks(np.arange(n_layers) * n_heads + (n_heads - 1) / 2, [f"L{layer}" for layer in range(n_layers)])
    axes[0].set_xticks(range(len(steps)), [str(s) for s in steps])
    return plots.save_figure(fig, out_dir, stem)


def plot_mean_beta(track: pd.DataFrame, task: str, taus: dict[int, float], out_dir: Path, stem: str) -> list[Path]:
    """Mean β over all heads for each role against step, with τ dashed."""
    rows = track[track["task"] == task]
    means = rows.groupby(["step", "role"])["mean"].mean().unstack("role")
    means = means[ordered_roles(means.columns)]
    steps = means.index.to_numpy()
    colours = plots.role_colours(list(means.columns))
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for role in means.columns:
        ax.plot(steps, means[role], marker="o", markersize=3, color=colours[role], label=role)
    ax.plot(steps, [taus[s] for s in steps], color="black", linestyle="--", linewidth=1, label="τ")
    plots.step_axis(ax, steps)
    values = means.to_numpy(dtype=float)
    if plots._all_positive(values[np.isfinite(values)]):
        plots._log_scale(ax, "y")
    ax.set_ylabel("mean β over heads")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.set_title(f"{task}: mean sieve bias score per role during training")
    return plots.save_figure(fig, out_dir, stem)


# -- command line -------------------------------------------------------------------------------


def parse_steps(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UserError(f"--steps must be comma-separated integers, got {text!r}") from None


def parse_args(argv: list[str] | None) -> TrackConfig:
    p = argparse.ArgumentParser(prog="python -m analysis.track", description=__doc__.split("\n\n")[0])
    series = p.add_mutually_exclusive_group(required=True)
    series.add_argument("--run", help="a bertjax pre-training or fine-tuning workdir (checkpoints/<step>/)")
    series.add_argument("--ckpt", action="append", metavar="SOURCE[@LABEL]",
                        help="a member of the series (HF directory, hub id, bertjax workdir or step folder), repeated; "
                             "an integer LABEL is its step; or one pattern with {step}, filled from --steps")  # fmt: skip
    p.add_argument("--steps", help="comma-separated steps of --run (default: every checkpoint) or of a {step} pattern")
    p.add_argument("--with-init", action="store_true",
                   help="with --run of a fine-tuning workdir: also track the checkpoint it started from, as step 0")  # fmt: skip
    p.add_argument("--scores-cache", help="where per-step scores are cached (default: <out>.cache beside --out)")
    roles.add_data_arguments(p)
    roles.add_test_arguments(p)
    roles.add_output_arguments(p, "track_out", FIGURES)
    a = p.parse_args(argv)
    return TrackConfig(
        roles=roles.config_from_args(a, ckpt=a.run or ""),
        steps=parse_steps(a.steps),
        scores_cache=a.scores_cache,
        series=tuple(a.ckpt or ()),
        with_init=a.with_init,
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    run(config)
    if config.roles.html:
        roles.write_html(config.roles.out)


if __name__ == "__main__":
    cli.run(main)
