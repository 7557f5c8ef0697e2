"""The settings of `python -m analysis.clark` (`ClarkConfig`, each declared once with its flag) and
their choices, apart from the modules that implement them (which import JAX), so that its parser is
built without them."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from analysis.common.flags import (
    ONE_READING,
    attention_setting,
    batch_size_setting,
    ckpt_setting,
    figure_format_setting,
    glue_dir_setting,
    max_length_setting,
    nonfinite_setting,
    out_setting,
    overwrite_setting,
    precision_setting,
    step_setting,
)
from bertjax.errors import UserError
from bertjax.settings import check, internal, setting
from sieves.depattn import BASELINE_OFFSETS

ANALYSES = ("surface", "cluster", "gradients", "depheads", "probes", "coref")

# `--out`'s default; a call given no `out` writes nothing, and this names its settings' `out`.
DEFAULT_OUT = "clark_out"

WORD_TEXTS = ("original", "joined")

# pairs: token type 0 for [CLS], segment A and its [SEP], 1 for segment B and the last [SEP];
# zeros: 0 everywhere, as the authors' `extract_attention.py` feeds BERT.
SEGMENT_IDS = ("pairs", "zeros")

# `--coref-target` (analysis.attention.coref) and `--surface-weighting` (analysis.attention.surface).
COREF_TARGETS = ("head", "sum", "first")
# Which occurrences of a candidate count (analysis.attention.coref): every mention, or the marked one.
COREF_MENTIONS = ("all", "marked")
SURFACE_WEIGHTINGS = ("tokens", "sequences")
# What each analysis reads when neither its own count nor --n is given (the paper's sizes, where
# it has them; EWT and GAP: every sentence and row).
SURFACE_N = 1000
PROBE_TRAIN_N = 2000


def with_analyses_named(config: ClarkConfig) -> ClarkConfig:
    """`config` knowing whether `--analyses` named the analyses: only named ones make a missing MLM
    head or GAP an error; all of them (the default) skip it (the row's `resolve`)."""
    return dataclasses.replace(config, analyses_explicit=config.analyses != ANALYSES)


def parse_analyses(text: str) -> tuple[str, ...]:
    """`--analyses`: `all` or a comma-separated subset of ANALYSES."""
    return ANALYSES if text.strip() == "all" else tuple(x.strip() for x in text.split(",") if x.strip())


@dataclasses.dataclass(frozen=True)
class ClarkConfig:
    """Everything that decides the numbers of a run; saved in run.json."""

    ckpt: str = ckpt_setting()
    out: str = out_setting(DEFAULT_OUT)
    step: int | None = step_setting()
    analyses: tuple[str, ...] = setting(ANALYSES, parse=parse_analyses, shown="all",
                                        help=f"comma-separated subset of {','.join(ANALYSES)}, or all")  # fmt: skip
    data_dir: str = setting("../shared/data", help="staged data (ud_english_ewt/, wikitext/, gap/)")
    inputs: str = setting("wikitext", flag="--task", aliases=("--inputs",),
                          help="surface/cluster/gradient inputs: wikitext or a GLUE task (qnli, qqp, mrpc, sst2); "
                               "--inputs: the old spelling")  # fmt: skip
    glue_dir: str | None = glue_dir_setting()
    split: str = setting("dev", help="GLUE split for --task TASK")
    n: int | None = setting(None, help=f"bounds every analysis's examples: the first N surface inputs (cluster and "
                                        "gradients take the first of them), EWT dev and test sentences each, EWT "
                                        "train sentences for the probes, GAP development and test rows each; an "
                                        "analysis's own count (--ewt-n, --probe-train-n, --gap-n), given, is used "
                                        f"instead (default: {SURFACE_N} surface inputs, the others' own defaults)")  # fmt: skip
    max_length: int = max_length_setting()
    batch_size: int = batch_size_setting()
    cluster_n: int = setting(300, help="sequences averaged for the JS distances")
    gradient_n: int = setting(256, help="masked sequences for the gradients")
    ewt_n: int | None = setting(None, help="first N sentences of EWT dev and test (default all)")
    first_piece: bool = setting(False, help="attention from a word = its first piece's")
    min_count: int = setting(100, help="test arcs for a relation to be summarised")
    probe_train_n: int | None = setting(None, help=f"first N EWT train sentences for the probes (default {PROBE_TRAIN_N}, "
                                                   "at most --n)")  # fmt: skip
    probe_epochs: int = setting(10, help="epochs of each probe's training")
    probe_learning_rate: float = setting(5e-3, help="the probes' Adam learning rate")
    seed: int = setting(0, help="seed of the gradients' masking and the probes' initialisation")
    # The authors' variants (docs/fidelity.md); the defaults are the paper's definitions.
    surface_weighting: str = setting("tokens", choices=SURFACE_WEIGHTINGS,
                                     help="tokens: every row counts once; sequences: every sequence counts once "
                                          "(the authors' notebook)")  # fmt: skip
    baseline_offsets: str = setting("paper", choices=tuple(BASELINE_OFFSETS),
                                    help="paper: ±1…3, unclipped; authors: −3…+2, clipped into the sentence "
                                         "(the authors' notebook)")  # fmt: skip
    all_relations_include_root: bool = setting(False, help="count root arcs in the 'all' row of the dependency heads (the authors' notebook)")  # fmt: skip
    word_text: str = setting("original", choices=WORD_TEXTS,
                             help="EWT text the model reads: original (the sentence's # text) or joined "
                                  '(" ".join(words), the authors\' code)')  # fmt: skip
    segment_ids: str = setting("pairs", choices=SEGMENT_IDS,
                               help="token type ids the model reads: pairs (0 for A, 1 for B) or zeros (the authors' "
                                    "extract_attention.py)")  # fmt: skip
    gap_n: int | None = setting(None, help="first N rows of GAP development and test (default all)")
    coref_target: str = setting("head", choices=COREF_TARGETS,
                                help="attention to a GAP name: head (its last word's pieces), sum (all its pieces) or "
                                     "first (its first piece)")  # fmt: skip
    coref_mentions: str = setting("all", choices=COREF_MENTIONS,
                                  help="which mentions of a GAP candidate count: all (every occurrence of its name, "
                                       "Clark et al.'s 'any of the antecedent's mentions') or marked (the occurrence "
                                       "GAP marks)")  # fmt: skip
    overwrite: bool = overwrite_setting()
    figure_format: tuple[str, ...] = figure_format_setting()
    # Only an explicit choice makes a missing MLM head or GAP an error (the default skips them).
    analyses_explicit: bool = internal(False, "whether --analyses named the analyses (not all)")
    allow_nonfinite: bool = nonfinite_setting()
    # What the surface and cluster analyses read (`--attention`, docs/attention-norms.md).
    attention: str = attention_setting(ONE_READING)
    precision: str = precision_setting()

    def __post_init__(self) -> None:
        check(self)
        if not self.analyses:
            raise UserError(f"--analyses: name at least one analysis (choose from {', '.join(ANALYSES)})")
        for name in self.analyses:
            if name not in ANALYSES:
                raise UserError(f"--analyses: unknown analysis {name!r}; choose from {', '.join(ANALYSES)}")
        for flag in ("gap_n", "ewt_n", "n", "probe_train_n"):
            if getattr(self, flag) is not None and getattr(self, flag) < 1:
                raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(self, flag)}")
        for flag in ("batch_size", "probe_epochs", "max_length", "cluster_n", "gradient_n"):
            if getattr(self, flag) < 1:
                raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(self, flag)}")
        for flag in ("seed", "min_count"):  # numpy's generators take no negative seed (a traceback in the probes)
            if getattr(self, flag) < 0:
                raise UserError(f"--{flag.replace('_', '-')} must be at least 0, got {getattr(self, flag)}")
        if not (math.isfinite(self.probe_learning_rate) and self.probe_learning_rate > 0):
            raise UserError(f"--probe-learning-rate must be a finite number > 0, got {self.probe_learning_rate}")
        if self.inputs != "wikitext":
            from bertjax import glue  # numpy: not at the parser's import

            glue.resolve_tasks(self.inputs)

    @property
    def surface_n(self) -> int:
        """The surface inputs read (`--n`, bounding the cluster's and the gradients' too)."""
        return SURFACE_N if self.n is None else self.n

    @property
    def ewt_limit(self) -> int | None:
        """EWT dev and test sentences read, each (None: all)."""
        return self.n if self.ewt_n is None else self.ewt_n

    @property
    def gap_limit(self) -> int | None:
        """GAP development and test rows read, each (None: all)."""
        return self.n if self.gap_n is None else self.gap_n

    @property
    def probe_train_limit(self) -> int:
        """EWT train sentences the probes train on."""
        if self.probe_train_n is not None:
            return self.probe_train_n
        return PROBE_TRAIN_N if self.n is None else min(PROBE_TRAIN_N, self.n)

    @property
    def ewt_dir(self) -> Path:
        return Path(self.data_dir).expanduser() / "ud_english_ewt"

    @property
    def gap_dir(self) -> Path:
        return Path(self.data_dir).expanduser() / "gap"

    @property
    def wikitext_file(self) -> Path:
        return Path(self.data_dir).expanduser() / "wikitext" / "wikitext-2-raw" / "wiki.valid.raw"
