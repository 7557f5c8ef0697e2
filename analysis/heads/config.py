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

from analysis.common.flags import (  # noqa: F401 — ONE_READING: the heads CLIs import it from here
    ATTENTION_SOURCES,
    ONE_READING,
    add_device_arguments,
    add_figure_arguments,
    add_length_arguments,
    add_nonfinite_argument,
    add_out_arguments,
    check_device_count,
)
from analysis.common.settings import check_types
from bertjax import cli
from bertjax.errors import UserError
from sieves.builders import DEFAULT_ROLES, get_role

log = logging.getLogger(__name__)

BLOCK_SCORES = ("paper", "entropy")
SYNTACTIC_AVERAGES = ("rows", "arcs")
BLOCK_FIRST_SEPS = ("a", "b")
# The choices of the flags that argparse checks on the command line; the Python API (analysis.api)
# builds a RolesConfig without argparse, so __post_init__ checks them too.
CHOICES = {
    "split": ("train", "dev", "validation", "test"),
    "test": ("t", "z", "bootstrap"),
    "correction": ("none", "holm", "bh"),
    "parser": ("spacy", "conllu"),
    "attention": ATTENTION_SOURCES,
}

# The figure kinds `plot_all` draws per task, in drawing order (heaviest first, which balances the
# workers' shares); `--figures` names a subset.
ROLES_FIGURES = (
    "mean_heatmaps", "p_heatmaps", "score_distributions", "role_grid", "coarse_overlap", "local_vs_syntactic",
)  # fmt: skip
# What `analysis.roles` draws unless `--figures` says otherwise: the figure a user looks at first
# (which role each head holds). Drawing all six cost more than the analysis itself on a small
# model (BENCHMARKS.md row 2); `--figures all` draws every paper figure.
DEFAULT_ROLES_FIGURES = "role_grid"
# The figure kinds of `analysis.track` (per task) and `analysis.finetune_effect`, for `--figures`.
TRACK_FIGURES = ("role_fractions", "emergence", "mean_beta", "onset")
EFFECT_FIGURES = ("beta_change", "attention_similarity")
# The file `analysis.report` (and `--html`) writes into a run's directory.
REPORT = "report.html"
# analysis.track: an onset needs the role held at this many consecutive analysed steps
# (analysis.heads.onset), and the families --correction may take (--correction-scope).
PERSISTENCE = 2
CORRECTION_SCOPES = ("step", "series")


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
    # Resamples of the bootstrap-t test (--test bootstrap) and of track's onset intervals, and
    # their seed: the same seed gives the same resamples, so a re-run reproduces every bound.
    bootstrap: int = 1000
    bootstrap_seed: int = 0
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
    block_first_sep: str = "a"
    # Where the forward passes run (docs/scale.md): the first `devices` local devices (None: all),
    # and whether this process is one of a multi-host job (`--distributed`).
    devices: int | None = None
    distributed: bool = False
    allow_nonfinite: bool = False  # analyse weights holding NaN or ±Inf, with a warning
    # What β reads (`--attention`, docs/attention-norms.md): the weights, the norm-weighted
    # attention (Kobayashi et al. 2020), or both from one forward pass.
    attention: str = "weights"

    def __post_init__(self) -> None:
        check_types(self)
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                raise UserError(f"--{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.block_score not in BLOCK_SCORES:
            raise UserError(f"--block-score must be one of {', '.join(BLOCK_SCORES)}, got {self.block_score!r}")
        if self.block_first_sep not in BLOCK_FIRST_SEPS:
            raise UserError(
                f"--block-first-sep must be one of {', '.join(BLOCK_FIRST_SEPS)}, got {self.block_first_sep!r}"
            )
        if self.syntactic_average not in SYNTACTIC_AVERAGES:
            raise UserError(
                f"--syntactic-average must be one of {', '.join(SYNTACTIC_AVERAGES)}, got {self.syntactic_average!r}"
            )
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
            try:
                finite = math.isfinite(float(self.tau))
            except ValueError:
                finite = False
            if not finite:
                raise UserError(f"--tau must be a finite number or 'auto', got {self.tau!r}")
            if float(self.tau) < 0:  # every head would pass: β = n·α is never negative
                raise UserError(f"--tau must be ≥ 0 (β, n times the attention, is never negative), got {self.tau}")
        if not self.roles:
            raise UserError("--roles: name at least one role (leave roles out for all of them)")
        for role in self.roles:
            get_role(role)
        if len(set(self.roles)) < len(self.roles):
            raise UserError(f"--roles names a role twice: {','.join(self.roles)}")
        if self.parser == "conllu" and not self.conllu:
            raise UserError("--parser conllu needs --conllu FILE (a CoNLL-U file of gold trees)")


def config_tasks(config: RolesConfig) -> list[str]:
    from analysis.common.examples import CONLLU_TASK, resolve_tasks  # jax: not at the parsers' import

    return [CONLLU_TASK] if config.parser == "conllu" else resolve_tasks(config.task)


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose the sequences and how they are scored (shared by the analyses that
    score checkpoints: roles, track, finetune_effect)."""
    p.add_argument(
        "--task",
        default="all",
        help="qnli, qqp, mrpc, sst2, text:FILE (one example per line), a comma-separated list, or all",
    )
    p.add_argument("--glue-dir", help="local GLUE directory (glue_data/<TASK>/<split>.tsv); default: the hub")
    p.add_argument("--split", default="dev", choices=CHOICES["split"], help="the split of each task's examples")
    p.add_argument("--n", type=int, default=1000, help="first N examples of each task (file order)")
    add_length_arguments(p)
    p.add_argument("--roles", help="comma-separated roles (default: all fine-grained roles)")
    p.add_argument("--window", type=int, default=2, help="local window k")
    p.add_argument("--no-special-rows", action="store_true", help="do not score [CLS]/[SEP] rows for positional roles")
    p.add_argument("--parser", choices=CHOICES["parser"], default="spacy",
                   help="where the dependency trees come from: spaCy's parse, or the gold trees of --conllu")  # fmt: skip
    p.add_argument("--spacy-model", help="spaCy pipeline name (default en_core_web_sm)")
    p.add_argument("--conllu", help="CoNLL-U file of gold trees (with --parser conllu)")
    p.add_argument("--cache-dir", default=RolesConfig.cache_dir, help="where parses are cached")
    add_device_arguments(p)
    add_nonfinite_argument(p)


def add_test_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the hypothesis tests."""
    p.add_argument("--tau", default="3", help="threshold τ, or 'auto' (smallest integer above the grand mean)")
    p.add_argument("--alpha", type=float, default=0.05, help="level of each one-sided test")
    p.add_argument("--test", choices=CHOICES["test"], default="t",
                   help="t: one-sided t-test (ddof 1); z: normal tail; bootstrap: bootstrap-t, for skewed β")  # fmt: skip
    p.add_argument("--correction", choices=CHOICES["correction"], default="none",
                   help="multiple-comparison correction across all the run's tests: none, Holm, Benjamini-Hochberg")  # fmt: skip
    p.add_argument("--bootstrap", type=int, default=RolesConfig.bootstrap, metavar="B",
                   help="resamples of --test bootstrap and of track's onset intervals (track: 0 = no intervals)")  # fmt: skip
    p.add_argument("--bootstrap-seed", type=int, default=RolesConfig.bootstrap_seed,
                   help="seed of those resamples")  # fmt: skip


def add_output_arguments(
    p: argparse.ArgumentParser, default_out: str, figure_kinds: Sequence[str], default_figures: str = "all"
) -> None:
    add_out_arguments(p, default_out)
    add_figure_arguments(p, figure_kinds, default_figures)
    p.add_argument("--html", action="store_true", help="also write report.html (python -m analysis.report) into --out")


def add_variant_arguments(p: argparse.ArgumentParser) -> None:
    """The authors' variants of the definitions (docs/fidelity.md); only `analysis.roles` offers
    them, as track and finetune_effect score with the published definitions."""
    p.add_argument("--block-score", choices=BLOCK_SCORES, default="paper",
                   help="paper: mean β over the rows; entropy: each row's β times its attention entropy, "
                        "as the authors' block_score notebook")  # fmt: skip
    p.add_argument("--block-first-sep", choices=BLOCK_FIRST_SEPS, default="a",
                   help="segment whose tokens the first [SEP] row of block is scored against: a (its token "
                        "type) or b (the authors' block_score notebook, which pairs it with --block-score entropy)")  # fmt: skip
    p.add_argument("--syntactic-average", choices=SYNTACTIC_AVERAGES, default="rows",
                   help="rows: mean β over the wordpiece rows of the relation roles; arcs: mean over arcs "
                        "(each dependent word once), as the authors' syntactic notebook")  # fmt: skip


def config_from_args(a: argparse.Namespace, **fields) -> RolesConfig:
    """A RolesConfig from the flags above that `a` has (the others keep their defaults); `fields`
    set the rest and take precedence."""
    given = vars(a)
    # Flags whose argparse dest is the RolesConfig field's name.
    same = ("task", "glue_dir", "split", "n", "max_length", "batch_size", "window", "tau", "alpha", "test",
            "correction", "bootstrap", "bootstrap_seed", "parser", "spacy_model", "conllu", "cache_dir", "out", "overwrite", "figures",
            "figure_format", "html", "block_score", "block_first_sep", "syntactic_average", "devices",
            "distributed", "allow_nonfinite", "attention")  # fmt: skip
    settings = {name: given[name] for name in same if name in given}
    if "roles" in given:
        settings["roles"] = tuple(a.roles.split(",")) if a.roles else DEFAULT_ROLES
    if "no_special_rows" in given:
        settings["special_rows"] = not a.no_special_rows
    return RolesConfig(**(settings | fields))
