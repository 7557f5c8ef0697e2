"""Head roles along a series of checkpoints (`python -m analysis.track`).

The sequences are prepared once and scored by each checkpoint; each step's per-sequence scores are
cached on disk under a key of every setting that changes them and of the checkpoint's identity, so
a re-run scores only new checkpoints and re-tests the cached ones. Writes `track.csv`, `onset.csv`,
the figures per task and `run.json`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from analysis.attention import sas as sas_lib
from analysis.common import changepoint
from analysis.common import figures as common_figures
from analysis.common import heldout as heldout_io
from analysis.common.examples import Inputs, check_sources, fit_max_length, prepare_inputs
from analysis.common.figures import FigureCache, figure_formats
from analysis.common.flags import select_figures, select_formats
from analysis.common.forward import Devices, at_precision
from analysis.heads import events, intervals, onset, robustness, tracking_figures
from analysis.heads import figures as heads_figures
from analysis.heads.config import SEEDS_CSV, TRACK_CSV, RolesConfig, TrackConfig, config_tasks, parse_steps  # noqa: F401 — the names callers import from here
from analysis.heads.config import TRACK_FIGURES as FIGURES
from analysis.heads.figures import about_line
from analysis.heads.report import EXAMPLES_JSON, readable_checkpoint, step_examples
from analysis.heads.scoring import (
    TaskScores,
    gather_scores,
    make_scorer,
    reference_length,
    score_sequences,
    test_roles,
)
from analysis.heads.series import Member, check_series, member_identity, run_members, series_members
from analysis.heads.summary import DEFAULT_COARSE
from analysis.heads.tracking_figures import format_fractions, plot_emergence, plot_mean_beta, plot_role_fractions
from bertjax import distributed, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import fetch_weights, from_pretrained, load_tokenizer, remove_downloads, tokenizer_digest
from bertjax.progress import tqdm
from sieves import depattn, stats
from sieves.align import encode_batch
from sieves.parse import read_conllu

# What `.bertjax-output` says of a track's `--out` (`runinfo.atomic_out`).
TRACK_OUTPUT = "track output"
SAS_CSV = "sas.csv"
SAS_MARGIN_CSV = "sas_margin.csv"

# Bump when the cached arrays or the way they are computed change: old entries are then ignored.
SCORES_FORMAT = 1
SAS_FORMAT = 3  # 2: an entry stores what it holds ("about"), checked as a scores entry is; 3: per-sentence counts


log = logging.getLogger(__name__)


def settings_key(config: RolesConfig, data_files: dict, tokenizer: str, parser) -> dict:
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
        "tokenizer": tokenizer,  # `tokenizer_digest`: its files' hash
        # Keyed only off its default, so that the weights' entries cached before the flag still serve.
        **({"attention": config.attention} if config.attention != "weights" else {}),
        **precision_key(config),
        **({"score": config.score} if config.score != "beta" else {}),
    }


def sas_settings_key(config: TrackConfig, data_file: dict, tokenizer: str) -> dict:
    """Every setting that changes a step's SAS counts."""
    rc = config.roles
    return {
        "format": SAS_FORMAT,
        "jax": jax.__version__,
        "conllu": data_file,
        "n": config.sas_n,
        "max_length": rc.max_length,
        "batch_size": rc.batch_size,
        "tokenizer": tokenizer,
        **precision_key(rc),
    }


def precision_key(config: RolesConfig) -> dict:
    """`--precision` in a cache key, only off its default, so that the CPU's entries cached before
    the flag (float32 products, as now) still serve. A cache filled on a GPU before the flag holds
    TF32 scores under the float32 key: docs/precision.md says to start a new one."""
    return {"precision": config.precision} if config.precision != "float32" else {}


def cache_path(cache_dir: Path, settings: dict, identity: dict, kind: str = "step") -> Path:
    digest = hashlib.sha256(json.dumps([settings, identity], sort_keys=True).encode()).hexdigest()
    return cache_dir / f"{kind}-{identity['step']:09d}-{digest[:16]}.npz"


# What `.bertjax-output` says of a scores cache: a track adds entries to no other directory, and
# an output's --overwrite (`runinfo.atomic_out`) does not replace one.
SCORES_CACHE = "track scores cache"
# Every file a scores cache holds, an unmarked one of an earlier bertjax included: the step and SAS
# entries, the figure cache's files (`FigureCache`), and the temporaries and write checks a killed
# run left (`runinfo.atomic_file`'s `.<name>.<random>.tmp`, a marker's too).
_CACHE_FILE = re.compile(r"(step|sas)-\d{9}-[0-9a-f]{16}\.npz|[0-9a-f]{64}\.(png|svg|pdf)|\..+\.tmp|\.write-check-.+")


def prepare_cache(cache_dir: Path, out: Path) -> None:
    """Creates the scores cache, or stops before any scoring when it cannot serve: inside --out,
    which every run replaces whole, it would be deleted each time; a directory that is not a
    scores cache (`.bertjax-output` says so) is refused, so that a mistyped --scores-cache is not
    filled. An unmarked directory whose every file is a cache's (one an earlier bertjax wrote) is
    marked and used."""
    if cache_dir == out or out in cache_dir.parents:
        raise UserError(
            f"--scores-cache {cache_dir}: inside --out {out}, which each run replaces; put the cache elsewhere"
        )
    if cache_dir.exists() and not cache_dir.is_dir():
        raise UserError(f"--scores-cache {cache_dir} exists and is not a directory")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--scores-cache {cache_dir}: cannot create it ({e.strerror})") from None
    try:
        _mark_cache(cache_dir)
    except OSError as e:
        raise UserError(f"--scores-cache {cache_dir}: cannot write there ({e.strerror})") from None
    try:  # checked now, not after the scoring: entries are written as each step is scored
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=cache_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"--scores-cache {cache_dir}: cannot write there ({e.strerror})") from None


def _mark_cache(cache_dir: Path) -> None:
    """Marks `cache_dir` as a scores cache, or refuses it. No lock: runs starting together on one
    new cache each find nothing but a cache's files (the marker another wrote, or its temporary)
    and write the same marker, each whole under a name of its own and renamed into place, as the
    entries are (`save_npz`)."""
    marker = cache_dir / runinfo.OUTPUT_MARKER
    if marker.is_symlink() or marker.exists():
        kind = _marker_kind(marker)
        if kind != SCORES_CACHE:
            what = f"another kind of output ({kind})" if kind else f"a {runinfo.OUTPUT_MARKER} that cannot be read"
            raise UserError(f"--scores-cache {cache_dir} holds {what}, not a scores cache; choose another directory")
        return
    if (foreign := _foreign_file(cache_dir)) is not None:
        raise UserError(
            f"--scores-cache {cache_dir} is not a scores cache: it holds {foreign.relative_to(cache_dir)} and no "
            f"{runinfo.OUTPUT_MARKER} marking it as one; give a new or empty directory, or an earlier track's cache"
        )
    with runinfo.atomic_file(marker, overwrite=True) as f:
        f.write(SCORES_CACHE + "\n")


def _marker_kind(marker: Path) -> str | None:
    """What a `.bertjax-output` says, or None when it is not a readable regular file."""
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        return marker.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _foreign_file(directory: Path) -> Path | None:
    """The first path under `directory` that no scores cache holds, or None. Subdirectories are
    the figure cache and an across-seed run's caches (`run_seeds`): one marked as a scores cache is
    taken as it is, any other is looked into."""
    for path in sorted(directory.iterdir()):
        if path.name == runinfo.OUTPUT_MARKER and _marker_kind(path) == SCORES_CACHE:
            continue  # written meanwhile by a run starting on the same new cache
        if path.is_symlink():
            return path
        if path.is_dir():
            if _marker_kind(path / runinfo.OUTPUT_MARKER) == SCORES_CACHE:
                continue
            if (found := _foreign_file(path)) is not None:
                return found
        elif not _CACHE_FILE.fullmatch(path.name) or (path.exists() and not path.is_file()):
            return path  # (a temporary gone since the listing: renamed or removed by its run)
    return None


def save_scores(path: Path, results: dict[str, TaskScores], settings: dict, identity: dict,
                examples: dict | None = None) -> None:  # fmt: skip
    """`examples`: the step's example attention for the report (`step_examples`), kept beside its
    scores so that a step read from the cache has it too."""
    arrays = {}
    for task, result in results.items():
        for role, scores in result.scores.items():
            arrays[f"{task}/{role}"] = scores
            arrays[f"{task}/{role}/index"] = result.indices[role]
    about = {
        "tasks": {
            t: {"n_sequences": r.n_sequences, "absent": r.absent, "roles": list(r.scores)} for t, r in results.items()
        },
        "settings": settings,
        "checkpoint": identity,
    }
    arrays["about"] = np.array(json.dumps(about))
    if examples is not None:
        arrays["examples"] = np.array(json.dumps(examples))
    save_npz(path, arrays)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # A temporary of its own (a random name), so that two runs scoring the same step, also on a
    # cache shared between hosts, never write one file.
    try:
        with runinfo.atomic_file(path, binary=True, overwrite=True) as f:
            np.savez(f, allow_pickle=False, **arrays)  # numbers and JSON text: np.load reads it unpickled
    except OSError as e:
        # The cache is often on another disk than --out: a full one is named, not --out.
        if (reason := runinfo.no_space(e)) is None:
            raise
        raise UserError(f"no space left writing the scores cache entry {path} ({reason}); make room there") from None


def load_scores(path: Path) -> dict[str, TaskScores]:
    with np.load(path) as stored:
        about = json.loads(str(stored["about"]))
        return {
            task: TaskScores(
                scores={r: stored[f"{task}/{r}"] for r in info["roles"]},
                indices={r: stored[f"{task}/{r}/index"] for r in info["roles"]},
                absent=info["absent"],
                n_sequences=info["n_sequences"],
            )
            for task, info in about["tasks"].items()
        }


def load_examples(path: Path) -> dict | None:
    """The example attention a cache entry holds, or None (an entry written before it was recorded,
    or an unreadable one, which `read_cached` has reported)."""
    try:
        with np.load(path) as stored:
            return json.loads(str(stored["examples"])) if "examples" in stored.files else None
    except (OSError, EOFError, ValueError, zipfile.BadZipFile):
        return None


def load_sas(path: Path):
    with np.load(path) as stored:
        layers, heads = (int(x) for x in stored["shape"])
        return sas_lib.counts_from_arrays(stored, layers, heads)


def save_sas(path: Path, counts, settings: dict, identity: dict) -> None:
    about = {"settings": settings, "checkpoint": identity}
    arrays = {**sas_lib.counts_to_arrays(counts), "shape": np.array(counts.shape[1:])}
    save_npz(path, arrays | {"about": np.array(json.dumps(about, default=str))})


def read_cached(path: Path, load=load_scores, expected: dict | None = None):
    """The cache entry at `path` read by `load`, or None when there is none, it cannot be read
    whole (torn, overwritten, holding pickled objects) or it is not what its name says (another
    step's, other settings' or another checkpoint's scores, copied or renamed there: `expected`
    {"settings", "checkpoint"} against what the entry stored): that one is reported and scored
    again, which replaces it. (SAS entries are checked alike.)"""
    if not path.is_file():
        return None
    try:
        if expected is not None:
            with np.load(path) as stored:
                about = json.loads(str(stored["about"]))
            # As save_scores stored them: through JSON (tuples become lists).
            as_stored = json.loads(json.dumps(expected, default=str))
            for key, value in as_stored.items():
                if about.get(key) != value:
                    log.warning(
                        "scores cache entry %s holds scores of other %s than its name says; its step is scored again",
                        path, "settings" if key == "settings" else "checkpoint (step or files)",
                    )  # fmt: skip
                    return None
        return load(path)
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as e:
        log.warning(
            "scores cache entry %s cannot be read (%s: %s); its step is scored again", path, type(e).__name__, e
        )
        return None


Say = Callable[[str], None]


def quiet(line: str) -> None:
    """The `say` of a caller that wants no progress lines (the API: its result shows itself)."""


@dataclasses.dataclass(eq=False)
class TrackRun:
    """A track run held in memory: the tables (`track` is track.csv; `onsets`, `curves`, `sas`,
    `sas_margin`: onset.csv, curve_onsets.csv, sas.csv, sas_margin.csv), what the figures read
    beside them (held-out metrics, τ per step, each task's N), `info` (run.json's provenance and
    settings, without the cache's files, the figures and the environment, which the writer adds)
    and the timings so far.

    The per-sequence scores live in the scores cache (`cache`: where each step's entry was read or
    written) or, for a run given no cache (an API call without `out`), in memory (`held`), as the
    SAS counts do (`sas_counts`); the writer then stores them in the cache beside the output it
    writes, as the CLI's run would have."""

    config: TrackConfig
    members: list[Member]
    track: pd.DataFrame
    onsets: pd.DataFrame
    curves: pd.DataFrame
    events: pd.DataFrame
    curve_events: pd.DataFrame
    lead_lag: pd.DataFrame
    # What lead_lag's intervals come from (`events.group_earliest`, the reference curve's events),
    # stored beside it; None without a reference curve.
    lead_lag_behind: tuple | None
    robustness: pd.DataFrame
    sas: pd.DataFrame | None
    sas_margin: pd.DataFrame | None
    heldout: pd.DataFrame | None
    taus: dict[int, float]
    n_examples: dict[str, int]
    keys: CacheKeys
    cache: Path | None
    held: dict[int, dict[str, TaskScores]] | None
    sas_counts: dict
    info: dict
    timings: dict[str, float]
    # Each step's example attention (`step_examples`; None for a cache entry written before it was
    # recorded), written to EXAMPLES_JSON for the report's step slider.
    examples: dict[int, dict | None] = dataclasses.field(default_factory=dict)

    def scores(self, step: int) -> dict[str, TaskScores]:
        """The per-sequence scores of `step`, from memory or from the cache."""
        return step_scores(self.held, self.keys, self.cache, step)

    def text(self) -> str:
        """What the CLI prints at the end of a run: the shares of heads, the tests made, the onsets,
        the SAS by step and the curves' changepoints."""
        lines = [
            format_fractions(self.track),
            tests_line(self.info["tests"]),
            onset.format_onsets(self.track, self.onsets),
        ]
        if self.sas is not None:
            lines.append(
                "SAS (best head's UAS, all words) by step: "
                + ", ".join(f"{s}: {v:.3f}" for s, v in sas_curve(self.sas).items())
            )
            lines.append(margin_line(self.sas_margin))
        found = self.curves[self.curves["changepoint_step"].notna()]
        steps = len(self.taus)
        if found.empty:  # a table of <NA> says less than this line (a short or flat series)
            lines.append(
                f"curve changepoints: none of the {len(self.curves)} curves has one in this series ({steps} checkpoints)"
            )
        else:
            lines.append(f"curve changepoints (steps, 90% intervals; the {len(self.curves) - len(found)} curves without one are in "
                         f"{onset.CURVE_ONSETS_CSV}):")  # fmt: skip
            lines.append(found.drop(columns="fit").to_string(index=False))
        if not self.lead_lag.empty:
            lines.append(f"event times against the {onset.REFERENCE_CURVE} ({events.LEAD_LAG_CSV}; each role group's "
                         "earliest head, the difference's 90% interval; events of every head in "
                         f"{events.EVENTS_CSV}):")  # fmt: skip
            lines.append(self.lead_lag.drop(columns=["curve", "joint"]).to_string(index=False))
        if not self.robustness.empty:
            lines.append(f"robustness ({robustness.ROBUSTNESS_CSV}: τ {', '.join(f'{t:g}' for t in robustness.TAUS)}, "
                         "both held-out curves, changepoint caps "
                         f"{robustness.CAPS[0]}–{robustness.CAPS[-1]}, scores "
                         f"{', '.join(pd.unique(self.robustness['score']))}):")  # fmt: skip
            lines += robustness.summary_lines(self.robustness)
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CacheKeys:
    """What names a step's cache entries: the settings that change its scores (and its SAS
    counts, with --sas) and each step's checkpoint identity."""

    settings: dict
    identities: dict[int, dict]
    sas_settings: dict | None = None

    def path(self, cache_dir: Path, step: int) -> Path:
        return cache_path(cache_dir, self.settings, self.identities[step])

    def sas_path(self, cache_dir: Path, step: int) -> Path:
        assert self.sas_settings is not None  # only a run with --sas has SAS entries
        return cache_path(cache_dir, self.sas_settings, self.identities[step], "sas")

    def expected(self, step: int, sas: bool = False) -> dict:
        return {"settings": self.sas_settings if sas else self.settings, "checkpoint": self.identities[step]}


def step_scores(
    held: dict[int, dict[str, TaskScores]] | None, keys: CacheKeys, cache: Path | None, step: int
) -> dict[str, TaskScores]:
    """The per-sequence scores of `step`: `held` in memory, or (without) in the cache."""
    if held is not None:
        return held[step]
    assert cache is not None  # scores not held in memory are in the cache
    return load_scores(keys.path(cache, step))


def sas_curve(sas: pd.DataFrame) -> pd.Series:
    """The best head's UAS over all words, by step: the SAS curve the onsets relate to."""
    return sas[sas["relation"] == "all"].set_index("step")["uas"]


def margin_line(margin: pd.DataFrame) -> str:
    """Per step, whether the `all` row's best head beats the best offset held out."""
    rows = margin[margin["relation"] == depattn.ALL_RELATIONS]
    return (f"SAS against the best offset ({SAS_MARGIN_CSV}: `all`, head and offset chosen on half the trees, "
            "margin on the other half, 90% interval) by step: "
            + ", ".join(f"{r.step}: {r.margin:+.3f} [{r.low:+.3f}, {r.high:+.3f}] "
                        + ("beats" if r.beats_offsets else "does not beat") for r in rows.itertuples()))  # fmt: skip


def prepare(config: TrackConfig) -> tuple[TrackConfig, list[Member]]:
    """The checks made before anything is encoded, scored or written, the series' members, and
    `config` with its max length cut to the smallest model's positions (the sequences are encoded
    once, before any model is loaded)."""
    distributed.initialize(config.roles.distributed)
    select_figures(config.roles.figures, FIGURES)
    select_formats(config.roles.figure_format)
    if config.series:
        if config.with_init:
            raise UserError("--with-init goes with --run (a fine-tuning workdir); in a --ckpt series, list the init")
        members = series_members(config.series, config.steps)
    else:
        members = run_members(config.roles.ckpt, config.steps, config.with_init)
    positions = min(c.max_sequence_length for c in check_series(members))
    config = dataclasses.replace(config, roles=fit_max_length(config.roles, positions))
    if config.sas is not None and not Path(config.sas).expanduser().is_file():
        raise UserError(f"--sas {config.sas}: no such CoNLL-U file")
    # Before the cache folder is made: GLUE from a hub switched off fails here at once.
    check_sources(config.roles, config_tasks(config.roles))
    if config.sas is not None and jax.process_count() > 1:
        raise UserError(
            "--sas: not with --distributed (the SAS counts are not gathered across processes); run it alone"
        )
    return config, members


@at_precision("roles.precision")
def compute_members(
    config: TrackConfig, members: list[Member], cache: Path | None, started: float, say: Say
) -> TrackRun | None:
    """The stages of a track run: the inputs and cache keys, the cached steps, the new steps
    scored, the tables. None for a shard and in a process of a multi-process job other than the
    first (they score into the cache)."""
    rc = config.roles
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    steps = [m.step for m in members]
    inputs = prepare_inputs(rc, config_tasks(rc))
    sas_sentences, sas_file = [], None
    tokenizer_id = tokenizer_digest(members[0].source)
    sas_settings = None
    if config.sas is not None:
        sas_file = {"path": str(Path(config.sas).expanduser().resolve())}
        sas_sentences = read_conllu(Path(sas_file["path"]), limit=config.sas_n)
        sas_file["sha256"] = runinfo.input_sha256(Path(sas_file["path"]))
        sas_settings = sas_settings_key(config, sas_file, tokenizer_id)
    keys = CacheKeys(settings_key(rc, inputs.data_files, tokenizer_id, inputs.parser),
                     {m.step: member_identity(m) for m in members}, sas_settings)  # fmt: skip
    # A shard's members are every N-th of the series from its I-th, round-robin in step order.
    mine = steps if config.shard is None else [m.step for m in distributed.shard_members(members, *config.shard)]
    writes_outputs = config.shard is None and jax.process_index() == 0
    tester = StepTester(config, writes_outputs, timings)
    sas_counts = read_cached_steps(config, mine, keys, cache, tester, inputs.n_sequences) if cache is not None else {}
    todo = [s for s in mine if s not in tester.tested]
    sas_todo = [s for s in mine if config.sas is not None and s not in sas_counts]
    check_same_work(todo, cache)
    timings["load_data"] = time.perf_counter() - clock
    say(start_line(config, steps, mine, todo, sas_todo, cache))

    work = Work(inputs, keys, cache, tester, None if cache is not None else {}, sas_counts, todo, sas_todo, sas_file,
                sas_sentences, Devices.local(rc.devices), timings)  # fmt: skip
    if todo or sas_todo:
        score_steps(config, {m.step: m for m in members}, work)
    if config.shard is not None:
        say(f"track --shard {shard_text(config.shard)}: scored steps {todo} into {cache} in "
            f"{time.perf_counter() - started:.1f} s; wrote nothing into --out {rc.out}: once every shard has "
            "ended, the same command without --shard writes the outputs from the cache")  # fmt: skip
        return None
    if not writes_outputs:  # not process 0 of a multi-process job
        return None
    return tabulate(config, members, work)


def start_line(config: TrackConfig, steps: list[int], mine: list[int], todo: list[int], sas_todo: list[int],
               cache: Path | None) -> str:  # fmt: skip
    """The line a run says before it scores: how many checkpoints, how many from the cache."""
    if config.shard is None:
        return (
            f"track: {len(steps)} checkpoints, {len(steps) - len(todo)} from the cache {cache}, {len(todo)} to analyse"
            + (f"; SAS of {len(sas_todo)} to compute" if config.sas is not None else "")
        )
    return (
        f"track --shard {shard_text(config.shard)}: {len(mine)} of {len(steps)} checkpoints are this shard's "
        f"(steps {mine}), {len(mine) - len(todo)} from the cache {cache}, {len(todo)} to analyse"
    )


class StepTester:
    """Tests each step as soon as its scores are read or computed (the tests are cheap), so its
    scores are read once and only one step's are held at a time; and, where the outputs are
    written, the onset intervals' replicates of each step (docs/tracking.md)."""

    def __init__(self, config: TrackConfig, writes_outputs: bool, timings: dict[str, float]):
        rc = config.roles
        self.config = config
        self.timings = timings
        self.tested: dict[int, tuple[pd.DataFrame, float]] = {}
        self.resampler = (
            intervals.PairedResampler(rc.bootstrap, rc.bootstrap_seed) if writes_outputs and rc.bootstrap else None
        )
        self.replicate_p: dict[int, np.ndarray] = {}
        self.replicate_means: dict[int, np.ndarray] = {}
        # With the series as the family, each step is tested uncorrected and corrected once all are in.
        self.step_config = dataclasses.replace(rc, correction="none") if config.correction_scope == "series" else rc

    def test(self, step: int, scores: dict[str, TaskScores]) -> None:
        rc = self.config.roles
        self.tested[step] = test_roles(scores, self.step_config)
        if self.resampler is not None:
            clock = time.perf_counter()
            alpha = rc.alpha if rc.correction == "none" else None
            self.replicate_p[step] = self.resampler.pvalues(scores, self.tested[step][1], rc.test, alpha)
            self.replicate_means[step] = self.resampler.means(scores)
            self.timings["intervals"] = self.timings.get("intervals", 0.0) + time.perf_counter() - clock


@dataclasses.dataclass
class Work:
    """What a track run works from and fills in: the examples, the cache keys and the cache (None:
    the scores are `held` in memory), the tester, the steps to score (`todo`) and to count SAS
    for (`sas_todo`), the SAS file, its sentences and counts, the mesh and the timings."""

    inputs: Inputs
    keys: CacheKeys
    cache: Path | None
    tester: StepTester
    held: dict[int, dict[str, TaskScores]] | None
    sas_counts: dict
    todo: list[int]
    sas_todo: list[int]
    sas_file: dict | None
    sas_sentences: list
    devices: Devices
    timings: dict[str, float]
    # The example attention of the steps scored here (`step_examples`), for the report.
    examples: dict[int, dict] = dataclasses.field(default_factory=dict)


def read_cached_steps(config: TrackConfig, mine: list[int], keys: CacheKeys, cache: Path, tester: StepTester,
                      sequences: dict[str, int]) -> dict:  # fmt: skip
    """Tests the steps whose scores the cache holds; returns the SAS counts it holds. An entry whose
    tasks or sequences are not the run's (`sequences`: each task's count; e.g. 10 of 20) is
    reported and its step scored again, as an unreadable one is."""
    for step in mine:
        path = keys.path(cache, step)
        if (cached := read_cached(path, expected=keys.expected(step))) is not None:
            if (problem := incomplete(cached, sequences)) is not None:
                log.warning("scores cache entry %s %s; its step is scored again", path, problem)
                continue
            tester.test(step, cached)
    sas_counts = {}
    for step in mine if config.sas is not None else []:
        if (counts := read_cached(keys.sas_path(cache, step), load_sas, keys.expected(step, sas=True))) is not None:
            sas_counts[step] = counts
    return sas_counts


def incomplete(cached: dict[str, TaskScores], sequences: dict[str, int]) -> str | None:
    """What a cache entry lacks against the run's tasks and their sequence counts, or None."""
    if set(cached) != set(sequences):
        return f"holds the tasks {sorted(cached)}, not the run's {sorted(sequences)}"
    for task, result in cached.items():
        if result.n_sequences != sequences[task]:
            return f"holds {result.n_sequences} of {task}'s {sequences[task]} sequences"
        for role, scores in result.scores.items():
            if scores.shape[0] != np.asarray(result.indices[role]).size:
                return f"holds {task} {role} scores that do not match their sequences"
    return None


def score_steps(config: TrackConfig, by_step: dict[int, Member], work: Work) -> None:
    """Loads each step's checkpoint once and scores the steps not cached: their scores go into the
    cache (or `work.held`, without one) and are tested; their SAS counts into the cache and
    `work.sas_counts`. In a multi-process job each process scores its share of every step's
    sequences."""
    rc = config.roles
    # Loaded only now: a re-run whose every step is cached needs no tokenizer (nor transformers).
    first = next(iter(by_step.values())).source
    tokenizer = load_tokenizer(first)
    sequences = work.inputs.encode(tokenizer, work.timings) if work.todo else {}
    sas_sequences = None
    if work.sas_todo:
        sas_sequences = encode_batch(tokenizer, [(text,) for text, _ in work.sas_sentences],
                                     [(words,) for _, words in work.sas_sentences], rc.max_length)  # fmt: skip
    for step in tqdm(
        sorted({*work.todo, *work.sas_todo}), desc="checkpoints", unit="ckpt", disable=jax.process_index() != 0
    ):
        clock = time.perf_counter()
        source = by_step[step].source
        downloaded = fetch_weights(source)
        model = from_pretrained(source, allow_nonfinite=rc.allow_nonfinite)
        if step in work.todo:
            with distributed.all_ok(f"scoring step {step}"):
                scorer = make_scorer(
                    model, devices=work.devices, readings=(rc.attention,), reference=reference_length(rc)
                )
                try:
                    results = score_sequences(scorer, sequences, rc, {})
                except UserError as e:  # a β that is not finite (`finite.check_finite`): at which checkpoint
                    raise UserError(f"step {step}: {e}") from None
            results = gather_scores(results, work.inputs.n_sequences)
            if jax.process_index() == 0:
                work.examples[step] = step_examples(model, tokenizer, sequences, rc)
            if work.held is not None:
                work.held[step] = results
            elif jax.process_index() == 0:
                assert work.cache is not None  # scores not held in memory go into the cache
                save_scores(work.keys.path(work.cache, step), results, work.keys.settings, work.keys.identities[step],
                            work.examples[step])  # fmt: skip
            work.tester.test(step, results)
        if step in work.sas_todo:
            try:
                work.sas_counts[step] = sas_lib.score_sas(
                    model, sas_sequences, rc.batch_size, rc.max_length, rc.allow_nonfinite
                )
            except UserError as e:  # a word attention that is not finite (`finite.check_finite`): at which checkpoint
                raise UserError(f"step {step}: {e}") from None
            if work.cache is not None:
                keys = work.keys
                assert keys.sas_settings is not None  # SAS is counted only with --sas
                save_sas(
                    keys.sas_path(work.cache, step), work.sas_counts[step], keys.sas_settings, keys.identities[step]
                )
        if config.remove_downloads and downloaded:
            freed = remove_downloads(downloaded)
            log.info("step %d: removed its downloaded weights from the hub cache (%.1f MB)", step, freed / 1e6)
        work.timings[f"step {step}"] = time.perf_counter() - clock


def tabulate(config: TrackConfig, members: list[Member], work: Work) -> TrackRun:
    """The track table (corrected over the series if asked), the SAS table, the onsets with their
    intervals and the curves' changepoints, and the run's provenance."""
    rc, timings, inputs = config.roles, work.timings, work.inputs
    steps = [m.step for m in members]
    tested = work.tester.tested
    clock = time.perf_counter()
    taus = {step: tested[step][1] for step in steps}
    tables = [tested[step][0].assign(step=step)[["step", *tested[step][0].columns]] for step in steps]
    track = pd.concat(tables, ignore_index=True)
    if config.correction_scope == "series":
        track["p_adjusted"] = stats.adjust_pvalues(track["p_value"].to_numpy(), rc.correction)
        track["assigned"] = stats.assign(track["p_adjusted"].to_numpy(), rc.alpha)
    tests = test_count(track, rc, config.correction_scope)
    # Held-out metrics are a bertjax pre-training workdir's; a --ckpt series has no workdir.
    heldout = None if config.series else onset.read_heldout(Path(rc.ckpt).expanduser())
    sas_table, sas_margin = None, None
    if config.sas is not None:
        sas_table = pd.concat(
            [depattn.sas_table(work.sas_counts[step]).assign(step=step) for step in steps], ignore_index=True
        )[["step", *depattn.SAS_COLUMNS]]
        sas_margin = pd.concat(
            [depattn.sas_against_offsets(work.sas_counts[step], rc.bootstrap_seed, rc.bootstrap).assign(step=step)
             for step in steps], ignore_index=True,
        )[["step", *depattn.MARGIN_COLUMNS]]  # fmt: skip
    clock_intervals = time.perf_counter()
    interval_table, count_replicates = None, None
    rows = tested[steps[0]][0][["task", "layer", "head", "role"]].reset_index(drop=True)
    if work.tester.resampler is not None:
        held_p = intervals.decide(
            [work.tester.replicate_p[s] for s in steps], rc.correction, config.correction_scope, rc.alpha
        )
        interval_table = intervals.onset_interval_table(held_p, rows, steps, config.persistence)
        count_replicates = intervals.replicate_counts(held_p, rows)
    curve = None if sas_table is None else sas_curve(sas_table)
    sequences = None if config.series else heldout_io.read_heldout_sequences(Path(rc.ckpt).expanduser())
    heldout_reps = events.heldout_replicates(heldout, sequences, rc.bootstrap, rc.bootstrap_seed)
    curves = onset.curve_onsets(track, heldout, curve, rc.bootstrap, rc.bootstrap_seed, count_replicates,
                                heldout_reps)  # fmt: skip
    onsets = onset.relate_onsets(onset.role_onsets(track, config.persistence, interval_table), curves, steps)
    head_events, curve_events, lead_lag, lead_lag_behind = timing_events(
        config, work, rows, steps, heldout, heldout_reps
    )
    scored = {rc.score: robustness.Scored(track, head_events)}
    if heldout is not None and work.tester.resampler is not None:
        # Both scores from the same attention: the other one is the run's rescaled per sequence by
        # its length, which the cache does not hold (the examples are encoded again, not parsed).
        other = "share" if rc.score == "beta" else "beta"
        first = members[0].source
        scored[other] = robustness.other_score(
            other, steps, rows, lambda step: step_scores(work.held, work.keys, work.cache, step),
            robustness.sequence_lengths(load_tokenizer(first), inputs),
            work.tester.step_config, work.tester.resampler,
        )  # fmt: skip
    robust = robustness.robustness(
        scored,
        heldout,
        heldout_reps,
        config.persistence,
        rc.alpha,
        rc.correction,
        rc.test,
        rc.bootstrap,
        rc.bootstrap_seed,
        dict(DEFAULT_COARSE),
    )
    timings["intervals"] = timings.get("intervals", 0.0) + time.perf_counter() - clock_intervals
    timings["tests"] = time.perf_counter() - clock

    parser = inputs.parser
    info = {
        "config": dataclasses.asdict(config),
        # --run's checkpoints directory, as before the series (null for a --ckpt series).
        "checkpoints": None if config.series else str(members[-1].source.path),
        "series": [m.describe() for m in members],
        "steps": steps,
        "analysed_steps": work.todo,
        "cached_steps": [s for s in steps if s not in work.todo],
        "scores_cache": None,  # the writer's: where the entries are once written
        "tau": {str(s): t for s, t in taus.items()},
        "tests": tests,
        "onsets": {
            "persistence": config.persistence,
            "replicates": rc.bootstrap,
            "seed": rc.bootstrap_seed,
            "interval": list(changepoint.INTERVAL),
            "reference_curve": onset.REFERENCE_CURVE,
            "replicate_test": "z" if rc.test == "z" else "t",
        },
        "parser": None if parser is None else {"name": parser.name, "version": parser.version},
        "mesh": work.devices.record(),
        "processes": jax.process_count(),
        "data_files": inputs.data_files,
        "heldout_metrics": None if heldout is None else heldout.reset_index().to_dict("records"),
        "sas": None
        if config.sas is None
        else {
            "conllu": work.sas_file,
            "sentences": len(work.sas_sentences),
            "computed_steps": work.sas_todo,
            "cache": None,
        },
    }
    recorded: dict[int, dict | None] = dict(work.examples)
    if work.cache is not None:
        recorded = {s: recorded[s] if s in recorded else load_examples(work.keys.path(work.cache, s)) for s in steps}
    return TrackRun(config, members, track, onsets, curves, events.events_table(head_events), curve_events, lead_lag, lead_lag_behind, robust,
                    sas_table, sas_margin, heldout, taus, inputs.n_sequences, work.keys,
                    work.cache, work.held, work.sas_counts, info, timings, recorded)  # fmt: skip


def timing_events(config: TrackConfig, work: Work, rows: pd.DataFrame, steps: list[int],
                  heldout: pd.DataFrame | None, heldout_reps: dict[str, np.ndarray]) -> tuple:  # fmt: skip
    """The threshold-free event times (`analysis.heads.events`): every head's and role's, the held-out
    curves' over the analysed steps' window (resampling the held-out sequences when the run
    recorded them, drawn jointly with the analysis sequences: replicate b of each), and each
    role group's earliest event against the reference curve's: (the heads' `Trajectories`, the
    curves' events table, lead_lag.csv's table, what its intervals are computed from or None)."""
    tested = work.tester.tested
    means = np.stack([tested[s][0]["mean"].to_numpy(np.float64) for s in steps])
    replicates = None
    if work.tester.resampler is not None:
        replicates = np.stack([work.tester.replicate_means[s] for s in steps], axis=1)
    heads = events.trajectories(rows, steps, means, replicates)
    curves = events.heldout_curves(heldout, heldout_reps, steps)
    held_last = tested[steps[-1]][0]["assigned"].fillna(False).astype(bool).to_numpy()
    members = held_last & (heads.status != "no_rise")
    reference = curves.get(onset.REFERENCE_CURVE)
    lead_lag, behind = pd.DataFrame(columns=events.LEAD_LAG_COLUMNS), None
    if reference is not None:
        behind = (events.group_earliest(heads, members, dict(DEFAULT_COARSE)), events.curve_steps(reference))
        lead_lag = events.lead_lag(*behind, onset.REFERENCE_CURVE)
    curve_table = (pd.concat([events.events_table(found) for found in curves.values()], ignore_index=True)
                   if curves else pd.DataFrame(columns=["curve", *events.EVENT_COLUMNS[4:]]))  # fmt: skip
    return heads, curve_table, lead_lag, behind


def write(result: TrackRun, directory: Path, cache: Path) -> dict:
    """The one writer of a track run (the CLI's and the API's, through `analysis.tools.execute`,
    which writes run.json): the tables and the figures `result.config` asks for (kept in `cache`'s
    figure cache) into `directory`; scores held in memory are stored in the scores cache `cache`
    first, as a CLI run stores them. Returns what run.json records: the run's settings, the cache
    entries, the figures drawn and the run's own timings."""
    config = result.config
    steps = list(result.taus)
    if result.held is not None:
        for step in steps:
            save_scores(result.keys.path(cache, step), result.held[step], result.keys.settings,
                        result.keys.identities[step], result.examples.get(step))  # fmt: skip
        for step in steps if config.sas is not None else []:
            assert result.keys.sas_settings is not None  # a run with --sas has them
            save_sas(result.keys.sas_path(cache, step), result.sas_counts[step], result.keys.sas_settings,
                     result.keys.identities[step])  # fmt: skip
    result.track.to_csv(directory / TRACK_CSV, index=False)
    if result.sas is not None:
        result.sas.to_csv(directory / SAS_CSV, index=False)
    if result.sas_margin is not None:  # computed with the SAS
        result.sas_margin.to_csv(directory / SAS_MARGIN_CSV, index=False)
    result.onsets.to_csv(directory / onset.ONSET_CSV, index=False)
    result.curves.to_csv(directory / onset.CURVE_ONSETS_CSV, index=False)
    result.events.to_csv(directory / events.EVENTS_CSV, index=False)
    result.curve_events.to_csv(directory / events.CURVE_EVENTS_CSV, index=False)
    result.lead_lag.to_csv(directory / events.LEAD_LAG_CSV, index=False)
    if result.lead_lag_behind is not None:
        events.save_lead_lag_replicates(directory / events.LEAD_LAG_REPLICATES, *result.lead_lag_behind)
    result.robustness.to_csv(directory / robustness.ROBUSTNESS_CSV, index=False)
    recorded = {str(s): result.examples[s] for s in steps if result.examples.get(s) is not None}
    if recorded:
        (directory / EXAMPLES_JSON).write_text(json.dumps(recorded))

    clock = time.perf_counter()
    figures = draw_figures(result, directory, cache / "figures")
    info = result.info | {
        "config": dataclasses.asdict(config),  # its place kept: the run's, or a saved copy's `out`
        "scores_cache": {str(s): str(result.keys.path(cache, s)) for s in steps},
        "figures": [p.name for p in figures],
        "timings_s": result.timings | {"figures": time.perf_counter() - clock},
    }
    if config.sas is not None:
        info["sas"] = info["sas"] | {"cache": {str(s): str(result.keys.sas_path(cache, s)) for s in steps}}
    return info


def draw_figures(result: TrackRun, directory: Path, figure_cache: Path) -> list[Path]:
    """The figures `result.config` asks for, per task, into `directory`; a figure whose table, τ
    and held-out metrics are those of an earlier run's is copied from `figure_cache`."""
    config, rc, track = result.config, result.config.roles, result.track
    members = result.members
    draw: dict[str, Callable[..., list[Path]]] = {
        "role_fractions": plot_role_fractions,
        "emergence": plot_emergence,
        "mean_beta": functools.partial(plot_mean_beta, taus=result.taus),
        "onset": functools.partial(
            onset.plot_onset, heldout=result.heldout, sas=result.sas, curves=result.curves, onsets=result.onsets
        ),
    }
    # The line under the titles: the series, each task's N and τ (one value, or one per step).
    series_name = (
        f"{readable_checkpoint(members[0].given)} … {readable_checkpoint(members[-1].given)}"
        if config.series
        else readable_checkpoint(rc.ckpt)
    )
    tau_values = set(result.taus.values())
    tau = next(iter(tau_values)) if len(tau_values) == 1 else "per step (run.json)"
    about = {task: about_line(series_name, result.n_examples[task], tau) for task in pd.unique(track["task"])}
    cache = FigureCache(figure_cache, [tracking_figures, onset, heads_figures, common_figures])
    shared = json.dumps({str(s): t for s, t in result.taus.items()}).encode() + b"".join(
        b"" if table is None else table.to_csv().encode()
        for table in (result.heldout, result.sas, result.curves, result.onsets)
    )
    figures = []
    with figure_formats(select_formats(rc.figure_format)):
        for kind in select_figures(rc.figures, FIGURES):
            for task in pd.unique(track["task"]):
                stem = f"{task}_{kind}"
                line = about[task]
                content = track[track["task"] == task].to_csv(index=False).encode() + shared + line.encode()
                draw_one = functools.partial(
                    draw[kind], track, task, out_dir=directory, stem=stem, **({"about": line} if line else {})
                )
                figures += cache.figure(stem, content, draw_one, directory)
    return figures


def test_count(track: pd.DataFrame, config: RolesConfig, scope: str) -> dict:
    """How many tests the series made, and what that means without a correction."""
    count = int(track["p_value"].notna().sum())
    return {
        "count": count,
        "per_step": int(track.groupby("step")["p_value"].count().max()) if count else 0,
        "alpha": config.alpha,
        "correction": config.correction,
        "scope": scope,
        # Under H0 everywhere, the expected number of false assignments without a correction.
        "expected_false_uncorrected": config.alpha * count,
    }


def tests_line(tests: dict) -> str:
    if tests["correction"] == "none":
        return (
            f"tests: {tests['count']} over the series ({tests['per_step']} a step), uncorrected: α × tests = "
            f"{tests['expected_false_uncorrected']:.1f} chance assignments to expect at worst (every mean at τ); "
            "--correction holm|bh --correction-scope series corrects over the series"
        )
    return f"tests: {tests['count']} over the series ({tests['per_step']} a step), {tests['correction']}-corrected per {tests['scope']}"


def check_same_work(todo: list[int], cache_dir: Path | None) -> None:
    """In a multi-process job every process must score the same steps (they gather each step's
    scores together): it would not if the scores cache were not one directory they all see."""
    if jax.process_count() == 1:
        return
    digest = int.from_bytes(hashlib.sha256(json.dumps(todo).encode()).digest()[:7], "big")
    if len(set(distributed.gather_rows(np.array([digest])).tolist())) > 1:
        raise UserError(
            f"--scores-cache {cache_dir}: the processes of this job see different cached steps; "
            "put the cache on a filesystem every process shares"
        )


def shard_text(shard: tuple[int, int]) -> str:
    return f"{shard[0]}/{shard[1]}"


# What marks an across-seed output (`run_seeds`): `--overwrite` replaces only another of these.
SEEDS_OUTPUT = "across-seed track output"


def seeds_text(table: pd.DataFrame, runs: int) -> str:
    """The across-seed lines: per task and role, the earliest onset and the heads at the last step."""
    lines = [f"across {runs} seeds (earliest onset: median [min, max]; heads at the last step: median [min, max]):"]
    for row in table[table["seed"] == "all"].itertuples():
        lines.append(f"  {row.task} {row.role}: onset {_median_range(row.earliest_onset_median, row.earliest_onset_min, row.earliest_onset_max)} "
                     f"in {row.seeds_with_onset:.0f} of {row.seeds:.0f} seeds; heads at last step {row.heads_at_last_step_median:g} "
                     f"[{row.heads_at_last_step_min:g}, {row.heads_at_last_step_max:g}]")  # fmt: skip
    return "\n".join(lines)


def _median_range(median, low, high) -> str:
    return "none" if pd.isna(median) else f"{median:g} [{low:g}, {high:g}]"
