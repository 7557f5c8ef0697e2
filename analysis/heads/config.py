"""The settings of a heads-hypothesis run (`RolesConfig`) and the flags that set them, shared by
`analysis.roles`, `analysis.track`, `analysis.finetune_effect` and the report (which re-reads a
run's settings from its run.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from analysis.common.flags import (
    ATTENTION_SOURCES,
    ONE_READING,
    add_no_figures,
    attention_help,
    attention_setting,
    batch_size_setting,
    check_device_count,
    ckpt_setting,
    devices_setting,
    distributed_setting,
    figure_format_setting,
    figures_help,
    glue_dir_setting,
    max_length_setting,
    nonfinite_setting,
    out_setting,
    overwrite_setting,
    precision_setting,
    step_setting,
)
from bertjax import cli
from bertjax.errors import UserError
from bertjax.settings import Section, add_config_flags, add_flags, check, check_sections, default_of, internal, setting
from sieves.builders import DEFAULT_ROLES, get_role
from sieves.choices import CORRECTIONS, TESTS, Correction, Test

# A track's table and an across-seed summary's: what marks an earlier output of each, which a run
# replaces without --overwrite (here, for the CLI's checks before its heavy imports).
TRACK_CSV = "track.csv"
SEEDS_CSV = "seeds_onsets.csv"

log = logging.getLogger(__name__)

# The figure kinds `plot_all` draws per task, in drawing order (heaviest first, which balances the
# workers' shares); `--figures` names a subset.
ROLES_FIGURES = (
    "mean_heatmaps", "p_heatmaps", "score_distributions", "role_grid", "coarse_overlap", "local_vs_syntactic",
)  # fmt: skip
# What `analysis.roles` draws unless `--figures` says otherwise: the figure a user looks at first
# (which role each head holds). Drawing all six cost more than the analysis itself on a small
# model (BENCHMARKS.md row 2); `--figures all` draws every paper figure.
DEFAULT_ROLES_FIGURES = ("role_grid",)
# The figure kinds of `analysis.track` (per task) and `analysis.finetune_effect`, for `--figures`.
TRACK_FIGURES = ("role_fractions", "emergence", "mean_beta", "onset")
EFFECT_FIGURES = ("beta_change", "attention_similarity")
# The file `analysis.report` (and `--html`) writes into a run's directory.
REPORT = "report.html"
# analysis.track: an onset needs the role held at this many consecutive analysed steps
# (analysis.heads.onset), and the families --correction may take (--correction-scope).
PERSISTENCE = 2
CORRECTION_SCOPES = ("step", "series")


def _roles(text: str) -> tuple[str, ...]:
    return tuple(text.split(",")) if text else DEFAULT_ROLES


@dataclasses.dataclass(frozen=True)
class RolesConfig:
    """Everything that decides the numbers of a run; saved in run.json. Each field is declared
    once, with its flag (`bertjax.settings`), and in one of the sections below: analysis.roles
    takes every section's flags, track and finetune_effect those of `TRACK_SECTIONS` and
    `EFFECT_SECTIONS`, the API the same keywords."""

    ckpt: str = ckpt_setting()
    # "all" stays a word of the list (as asked, and as run.json records it): `resolve_tasks` says
    # which tasks it means, in the one place that knows them.
    task: tuple[str, ...] = setting(("all",), help="qnli, qqp, mrpc, sst2, text:FILE (one example per line), a comma-separated list, or all")  # fmt: skip
    step: int | None = step_setting()
    glue_dir: str | None = glue_dir_setting()
    split: str = setting(
        "dev", choices=("train", "dev", "validation", "test"), help="the split of each task's examples"
    )
    n: int = setting(1000, help="first N examples of each task (file order)")
    max_length: int = max_length_setting()
    batch_size: int = batch_size_setting()
    roles: tuple[str, ...] = setting(DEFAULT_ROLES, parse=_roles, shown="all fine-grained roles",
                                     help="comma-separated roles")  # fmt: skip
    window: int = setting(2, help="local window k")
    special_rows: bool = setting(True, help="do not score [CLS]/[SEP] rows for positional roles")
    # A number, or the word "auto" (the paper's rule, read from the scores): parsed once here.
    tau: float | Literal["auto"] = setting(3.0, shown="3", help="threshold τ, or 'auto' (smallest integer above the grand mean)")  # fmt: skip
    alpha: float = setting(0.05, help="level of each one-sided test")
    test: Test = setting("t", choices=TESTS,
                        help="t: one-sided t-test (ddof 1); z: normal tail; bootstrap: bootstrap-t, for skewed β")  # fmt: skip
    correction: Correction = setting("none", choices=CORRECTIONS,
                              help="multiple-comparison correction across all the run's tests: none, Holm, Benjamini-Hochberg")  # fmt: skip
    # Resamples of the bootstrap-t test (--test bootstrap) and of track's onset intervals, and
    # their seed: the same seed gives the same resamples, so a re-run reproduces every bound.
    bootstrap: int = setting(1000, metavar="B",
                             help="resamples of --test bootstrap and of track's onset intervals (track: 0 = no intervals)")  # fmt: skip
    bootstrap_seed: int = setting(0, help="seed of those resamples")
    parser: str = setting("spacy", choices=("spacy", "conllu"),
                          help="where the dependency trees come from: spaCy's parse, or the gold trees of --conllu")  # fmt: skip
    spacy_model: str | None = setting(None, help="spaCy pipeline name (default en_core_web_sm)")
    conllu: str | None = setting(None, help="CoNLL-U file of gold trees (with --parser conllu)")
    cache_dir: str = setting(str(cli.CACHE_ROOT), help="where parses are cached")
    out: str = out_setting("roles_out")
    overwrite: bool = overwrite_setting()
    # `--figures` and `--figure-format` as given; each analysis checks them against its own kinds.
    figures: tuple[str, ...] = setting(DEFAULT_ROLES_FIGURES, help=figures_help(ROLES_FIGURES))
    figure_format: tuple[str, ...] = figure_format_setting()
    html: bool = setting(False, help="also write report.html (python -m analysis.report) into --out")
    # The authors' variants (docs/fidelity.md); the defaults are the paper's definitions.
    block_score: str = setting("paper", choices=("paper", "entropy"),
                               help="paper: mean β over the rows; entropy: each row's β times its attention entropy, "
                                    "as the authors' block_score notebook")  # fmt: skip
    syntactic_average: str = setting("rows", choices=("rows", "arcs"),
                                     help="rows: mean β over the wordpiece rows of the relation roles; arcs: mean over "
                                          "arcs (each dependent word once), as the authors' syntactic notebook")  # fmt: skip
    block_first_sep: str = setting("a", choices=("a", "b"),
                                   help="segment whose tokens the first [SEP] row of block is scored against: a (its "
                                        "token type) or b (the authors' block_score notebook, which pairs it with "
                                        "--block-score entropy)")  # fmt: skip
    # Where the forward passes run (docs/scale.md): the first `devices` local devices (None: all),
    # and whether this process is one of a multi-host job (`--distributed`).
    devices: int | None = devices_setting()
    distributed: bool = distributed_setting()
    allow_nonfinite: bool = nonfinite_setting()
    # What β reads (`--attention`, docs/attention-norms.md): the weights, the norm-weighted
    # attention (Kobayashi et al. 2020), or both from one forward pass.
    attention: str = attention_setting(ATTENTION_SOURCES)
    # β's chance level |S(t)| / n falls as n grows, so a positional head's β grows with the
    # sequence length; `share` keeps τ's reading at length 128 for every length (docs/roles.md).
    score: str = setting("beta", choices=("beta", "share"),
                         help="beta: the sieve bias score β, the share of t's attention on its sieve over the "
                              "uniform share |S(t)|/n (the paper's); share: that share over |S(t)|/128, a chance "
                              "level that does not grow with the sequence length (equal to β at 128 tokens), for "
                              "comparing tasks of different lengths")  # fmt: skip
    # The model's matrix products (docs/precision.md): true float32 on every device by default.
    precision: str = precision_setting()

    def __post_init__(self) -> None:
        check(self)
        if self.n < 1:
            raise UserError(f"--n must be at least 1, got {self.n}")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {self.batch_size}")
        check_device_count(self.devices)
        if self.window < 1:
            raise UserError(f"--window must be at least 1, got {self.window}")
        if self.bootstrap < 0 or (self.test == "bootstrap" and self.bootstrap < 100):
            raise UserError(f"--bootstrap must be an integer ≥ 0 (≥ 100 with --test bootstrap), got {self.bootstrap}")
        if self.bootstrap_seed < 0:
            raise UserError(f"--bootstrap-seed must be an integer ≥ 0, got {self.bootstrap_seed}")
        if not 0.0 < self.alpha < 1.0:
            raise UserError(f"--alpha must be in (0, 1), got {self.alpha}")
        if self.tau != "auto":
            if not math.isfinite(self.tau):
                raise UserError(f"--tau must be a finite number or 'auto', got {self.tau!r}")
            if self.tau < 0:  # every head would pass: β = n·α is never negative
                raise UserError(f"--tau must be ≥ 0 (β, n times the attention, is never negative), got {self.tau:g}")
        if not self.roles:
            raise UserError("--roles: name at least one role (leave roles out for all of them)")
        for role in self.roles:
            get_role(role)
        if len(set(self.roles)) < len(self.roles):
            raise UserError(f"--roles names a role twice: {','.join(self.roles)}")
        if self.parser == "conllu" and not self.conllu:
            raise UserError("--parser conllu needs --conllu FILE (a CoNLL-U file of gold trees)")


# RolesConfig's settings by what takes them; a field in no section fails the check below at import.
# One checkpoint: track and finetune_effect name theirs by flags of their own (--run/--ckpt, --pre/--post).
CHECKPOINT = Section(RolesConfig, "checkpoint", ("ckpt",))
# The step of the one checkpoint and the authors' variants of the scores: track and finetune_effect
# score with the published definitions, each checkpoint of a series at its own step.
STEP_AND_VARIANTS = Section(RolesConfig, "step and scoring variants",
                            ("step", "block_score", "block_first_sep", "syntactic_average"))  # fmt: skip
# finetune_effect compares β means; it runs no hypothesis test.
HYPOTHESIS_TESTS = Section(RolesConfig, "hypothesis tests",
                           ("tau", "alpha", "test", "correction", "bootstrap", "bootstrap_seed"))  # fmt: skip
EVERY_HEADS_TOOL = Section(RolesConfig, "every heads tool", (
    "task", "glue_dir", "split", "n", "max_length", "batch_size", "roles", "window", "special_rows", "parser",
    "spacy_model", "conllu", "cache_dir", "out", "overwrite", "figures", "figure_format", "html", "devices",
    "distributed", "allow_nonfinite", "attention", "score", "precision",
))  # fmt: skip
# What each heads tool takes (bertjax.settings.add_flags' `sections`).
ROLES_SECTIONS = (CHECKPOINT, STEP_AND_VARIANTS, HYPOTHESIS_TESTS, EVERY_HEADS_TOOL)
TRACK_SECTIONS = (HYPOTHESIS_TESTS, EVERY_HEADS_TOOL)
EFFECT_SECTIONS = (EVERY_HEADS_TOOL,)
check_sections(RolesConfig, ROLES_SECTIONS)


def parse_steps(text: str | None) -> tuple[int, ...] | None:
    """`--steps`: comma-separated integers."""
    if text is None:
        return None
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UserError(f"--steps must be comma-separated integers, got {text!r}") from None


def _shard(text: str) -> tuple[int, int]:
    from bertjax.distributed import parse_shard  # jax: not at the parsers' import

    return parse_shard(text)


@dataclasses.dataclass(frozen=True)
class TrackConfig:
    """`roles.ckpt` is the run's workdir (`--run`), empty for a `--ckpt` series; `series` the
    `--ckpt` texts as given; `steps` the run's steps to analyse (None: every checkpoint) or the
    values of a `{step}` pattern; `shard` (I, N) makes this job one of N that share the scores
    cache (None: the normal run)."""

    roles: RolesConfig
    steps: tuple[int, ...] | None = setting(None, parse=parse_steps,
                                            help="comma-separated steps of --run (default: every checkpoint) or of a {step} pattern")  # fmt: skip
    scores_cache: str | None = setting(
        None, help="where per-step scores are cached (default: <out>.cache beside --out)"
    )
    series: tuple[str, ...] = internal((), "the --ckpt flags, each SOURCE[@LABEL] as given")
    with_init: bool = setting(False, help="with --run of a fine-tuning workdir: also track the checkpoint it started from, as step 0")  # fmt: skip
    # (I, N) from `--shard I/N`: score only this job's members into the cache, write no outputs.
    shard: tuple[int, int] | None = setting(None, parse=_shard, metavar="I/N",
                                            help="job I of N (0-based) sharing the scores cache: score every N-th "
                                                 "checkpoint from the I-th into the cache and write nothing into "
                                                 "--out; then run once without --shard for the outputs")  # fmt: skip
    # `--sas FILE`: also the SAS (analysis.attention.sas) of each step on the first `sas_n` trees.
    sas: str | None = setting(None, metavar="CONLLU",
                              help="also the syntactic attention structure (Chen et al. 2023) of each step on this "
                                   "CoNLL-U file's gold trees (e.g. UD English-EWT dev): sas.csv, sas_margin.csv "
                                   "(against the offsets, held out) and the onset figure")  # fmt: skip
    sas_n: int = setting(1000, help="with --sas: the first N trees of the file")
    # An onset needs the role held at this many consecutive analysed steps (analysis.heads.onset).
    persistence: int = setting(PERSISTENCE, metavar="K",
                               help="an onset needs the role held at K consecutive analysed steps (1: the last ones alone)")  # fmt: skip
    # The family of --correction: the tests of one step (as analysis.roles) or of the whole series.
    correction_scope: str = setting("step", choices=CORRECTION_SCOPES,
                                    help="the family of --correction: the tests of each step, or of the whole series")  # fmt: skip
    # Delete the weights each hub checkpoint's download added to the hub cache once its scores
    # are cached.
    remove_downloads: bool = setting(False,
                                     help="delete the weights each hub checkpoint's download added to the hub cache "
                                          "once its scores are cached (a re-run with other scoring settings downloads "
                                          "them again): docs/series.md")  # fmt: skip

    def __post_init__(self) -> None:
        check(self)
        if self.sas_n < 1:
            raise UserError(f"--sas-n must be at least 1, got {self.sas_n}")
        if self.persistence < 1:
            raise UserError(f"--persistence must be an integer ≥ 1, got {self.persistence}")
        if self.shard is not None and not 0 <= self.shard[0] < self.shard[1]:  # a config's [I, N] skips --shard's parse
            raise UserError(
                f"shard {list(self.shard)}: give [I, N] with 0 ≤ I < N (as --shard I/N), e.g. [0, 4] … [3, 4]"
            )
        if self.roles.attention not in ONE_READING:
            raise UserError(
                f"--attention must be one of {', '.join(ONE_READING)} in analysis.track, got {self.roles.attention!r}"
            )

    # The output settings, as the runner (`analysis.tools.execute`) reads them of every tool's.
    out = property(lambda self: self.roles.out)
    overwrite = property(lambda self: self.roles.overwrite)
    distributed = property(lambda self: self.roles.distributed)
    figure_format = property(lambda self: self.roles.figure_format)

    @property
    def cache_dir(self) -> Path:
        if self.scores_cache is not None:
            return Path(self.scores_cache).expanduser().resolve()
        out = Path(self.roles.out).expanduser().resolve()
        return out.parent / f"{out.name}.cache"


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """`python -m analysis.report RUN_DIR`'s settings."""

    run_dir: str = setting(flag="RUN_DIR", help="an output directory of analysis.roles, analysis.track or analysis.finetune_effect")  # fmt: skip
    examples: int = setting(4, help="example sequences whose attention is shown per task (0: none)")
    out: str | None = setting(None, help=f"the HTML file to write (default RUN_DIR/{REPORT}); a new file, or a report")
    overwrite: bool = setting(False, help="replace an earlier report at --out")
    coref: str | None = setting(None, metavar="DIR",
                                help="an analysis.clark output with coref_heads.csv: the head cards show its GAP "
                                     "coreference accuracy (default: RUN_DIR's own coref_heads.csv, if any)")  # fmt: skip

    def __post_init__(self) -> None:
        check(self)
        if self.examples < 0:
            raise UserError(f"--examples must be at least 0, got {self.examples}")

    @property
    def path(self) -> Path:
        return Path(self.out).expanduser() if self.out else Path(self.run_dir).expanduser() / REPORT


def config_tasks(config: RolesConfig) -> list[str]:
    from analysis.common.examples import CONLLU_TASK, resolve_tasks  # jax: not at the parsers' import

    return [CONLLU_TASK] if config.parser == "conllu" else resolve_tasks(config.task)


ONE_READING_SETTING = {"choices": ONE_READING, "help": attention_help(ONE_READING)}

# What each heads tool sets differently in the shared RolesConfig (bertjax.settings.add_flags): its
# CLI and its API function read these, so each default exists once. The fields' own defaults are
# analysis.roles' (it changes none); track and finetune_effect, with few figure kinds, draw them all.
ROLES_TOOL: dict[str, dict] = {}
_EVERY_FIGURE = {"default": ("all",)}
TRACK_TOOL = {"out": {"default": "track_out"}, "figures": {**_EVERY_FIGURE, "help": figures_help(TRACK_FIGURES)},
              "attention": ONE_READING_SETTING}  # fmt: skip
EFFECT_TOOL = {"out": {"default": "finetune_effect_out"},
               "figures": {**_EVERY_FIGURE, "help": figures_help(EFFECT_FIGURES)}, "attention": ONE_READING_SETTING}  # fmt: skip


def add_roles_flags(p: argparse.ArgumentParser, tool: dict, sections: Sequence[Section] | None = None) -> None:
    """A heads tool's flags, those of RolesConfig's `sections` (None: all), with `--no-figures` and
    `--config`/`--print-config`."""
    add_flags(p, RolesConfig, sections=sections, tool=tool)
    add_no_figures(p, default_of(RolesConfig, "figures", tool))
    add_config_flags(p)
