"""The settings of `python -m analysis.ablate` (`KovalevaConfig`) and `analysis.prune`
(`MichelConfig`), each declared once with its flag, and their choices, apart from the modules that
implement them (which import JAX), so that their parsers are built without them."""

from __future__ import annotations

import dataclasses

from analysis.common.flags import (
    batch_size_setting,
    check_device_count,
    devices_setting,
    figure_format_setting,
    glue_dir_setting,
    max_length_setting,
    nonfinite_setting,
    out_setting,
    overwrite_setting,
    precision_setting,
    step_setting,
)
from bertjax import cli, glue
from bertjax.errors import UserError
from bertjax.settings import check, setting

CLASSIFIER_HELP = "fine-tuned classifier: bertjax run workdir, HF directory or hub id"

# The GLUE splits with labels, which the metrics need (`--split`, `--importance-split`).
SPLITS = ("train", "dev", "validation")

# `analysis.ablate --analyses`.
ANALYSES = ("patterns", "features", "disable", "mask")


@dataclasses.dataclass(frozen=True)
class KovalevaConfig:
    """Everything that decides the numbers of a run; saved in run.json."""

    ckpt: str = setting(help=CLASSIFIER_HELP)
    task: tuple[str, ...] = setting(("mrpc",), help="qnli, qqp, mrpc, sst2, a comma-separated list, or all")
    step: int | None = step_setting()
    glue_dir: str | None = glue_dir_setting()
    split: str = setting("dev", choices=SPLITS, help="the split of each task's examples (labelled)")
    n: int | None = setting(None, help="first N examples of the split (default: all)")
    max_length: int = max_length_setting()
    batch_size: int = batch_size_setting()
    analyses: tuple[str, ...] = setting(ANALYSES, help=f"comma-separated subset of {','.join(ANALYSES)}")
    alpha: float = setting(0.05, help="disable, mask: level of the Holm McNemar tests")
    compare_ckpt: str | None = setting(None, help="features: a second checkpoint to compare with (the pre-trained model)")  # fmt: skip
    compare_step: int | None = setting(None, help="checkpoint step of --compare-ckpt's run")
    spacy_model: str | None = setting(None, help="spaCy pipeline for the features (default en_core_web_sm)")
    cache_dir: str = setting(str(cli.CACHE_ROOT), help="where parses are cached")
    out: str = out_setting("ablate_out")
    overwrite: bool = overwrite_setting()
    figure_format: tuple[str, ...] = figure_format_setting()
    devices: int | None = devices_setting()
    allow_nonfinite: bool = nonfinite_setting()
    precision: str = precision_setting()

    def __post_init__(self) -> None:
        check(self)
        check_device_count(self.devices)
        for flag, value in (("--n", self.n), ("--batch-size", self.batch_size)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1, got {value}")
        if not 0.0 < self.alpha < 1.0:
            raise UserError(f"--alpha must be in (0, 1), got {self.alpha}")
        unknown = [a for a in self.analyses if a not in ANALYSES]
        if unknown or not self.analyses:
            raise UserError(
                f"--analyses: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ANALYSES)}"
            )


@dataclasses.dataclass(frozen=True)
class MichelConfig:
    """Everything that decides the numbers of a run; saved in run.json.

    `importance_n` None means `n`: the importance set is the metric's examples unless told
    otherwise (on another split, its first `n`)."""

    ckpt: str = setting(help=CLASSIFIER_HELP)
    task: str = setting("mrpc", choices=tuple(glue.TASKS), help="the GLUE task the classifier was fine-tuned on")
    step: int | None = step_setting()
    glue_dir: str | None = glue_dir_setting()
    split: str = setting("dev", choices=SPLITS, help="split of the metric")
    n: int | None = setting(None, help="first N examples of --split (default: all)")
    importance_split: str = setting(
        "dev", choices=SPLITS, help="split of the examples importance is estimated on (whatever --split is)"
    )
    importance_n: int | None = setting(None, help="first N examples of --importance-split (default: --n)")
    max_length: int = max_length_setting()
    batch_size: int = batch_size_setting()
    metric: str | None = setting(None, help="metric of the pruning curve (default: the task's first, accuracy)")
    prune_step: float = setting(0.1, help="fraction of all heads pruned per step (0.05 for a finer curve)")
    reestimate: bool = setting(False, help="re-estimate importance under the mask after each step")
    random_seeds: int = setting(3, help="random pruning orders to average")
    out: str = out_setting("prune_out")
    overwrite: bool = overwrite_setting()
    figure_format: tuple[str, ...] = figure_format_setting()
    devices: int | None = devices_setting()
    allow_nonfinite: bool = nonfinite_setting()
    precision: str = precision_setting()

    def __post_init__(self) -> None:
        check(self)
        check_device_count(self.devices)
        spec = glue.task_spec(self.task)
        if self.metric is not None and self.metric not in spec.metrics:
            raise UserError(f"--metric {self.metric!r}: task {self.task} reports {', '.join(spec.metrics)}")
        if not 0.0 < self.prune_step <= 0.5:
            raise UserError(f"--prune-step must be in (0, 0.5], got {self.prune_step}")
        if self.random_seeds < 0:
            raise UserError(f"--random-seeds must be ≥ 0, got {self.random_seeds}")
        for flag, value in (("--n", self.n), ("--importance-n", self.importance_n), ("--batch-size", self.batch_size)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1, got {value}")
        if self.importance_n is None:
            object.__setattr__(self, "importance_n", self.n)

    @property
    def metric_name(self) -> str:
        return self.metric or glue.task_spec(self.task).metrics[0]
