"""The settings that several analysis tools share (docs/cli.md's table), declared once here with
their help (`bertjax.settings.setting`), and the choices they take; each tool's config dataclass
takes its field from these.

Only argparse and bertjax's light modules are imported here: each entry point builds its parser
from this module before it imports any analysis, so `--help` and a mistyped flag answer at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bertjax.errors import UserError
from bertjax.glue import GLUE_DIR_HELP
from bertjax.precision import MATMUL_PRECISIONS
from bertjax.settings import comma_list, setting

# PNG by default: SVG writing costs as much again as PNG (every mesh cell and glyph a path), and
# most runs' figures are looked at, not edited. Vector formats on request.
FIGURE_FORMATS = ("png", "svg", "pdf")
DEFAULT_FORMATS = ("png",)


def _choice(flag: str, asked: Sequence[str], choices: Sequence[str], words: Sequence[str]) -> tuple[str, ...]:
    unknown = [a for a in asked if a not in choices]
    if unknown or not asked:
        what = f"unknown value {unknown[0]!r}" if unknown else "names nothing"
        give = f"{', '.join(words)} or a comma-separated list" if words else "a comma-separated list"
        raise UserError(f"{flag}: {what}; give {give} of {', '.join(choices)}")
    return tuple(c for c in choices if c in asked)


def select_figures(spec: Sequence[str], kinds: Sequence[str]) -> tuple[str, ...]:
    """The kinds `--figures` (a list, as the settings hold it) asks for, in `kinds`' order: `all`,
    `none` or kinds. "all" stays a word in the settings, not the kinds it means: the heads tools
    share the setting and each draws its own kinds."""
    if isinstance(spec, str):  # its letters would be read as kinds
        raise TypeError(f"--figures is a list of kinds as the settings hold it, not the text {spec!r}")
    if tuple(spec) == ("all",):
        return tuple(kinds)
    if tuple(spec) == ("none",):
        return ()
    return _choice("--figures", spec, kinds, ["all", "none"])


def select_formats(spec: Sequence[str]) -> tuple[str, ...]:
    """The formats `--figure-format SPEC` asks for, in FIGURE_FORMATS order."""
    if isinstance(spec, str):  # its letters would be read as formats
        raise TypeError(f"--figure-format is a list of formats as the settings hold it, not the text {spec!r}")
    return _choice("--figure-format", spec, FIGURE_FORMATS, [])


# What an analysis reads as a head's attention (docs/attention-norms.md): the weights α, Kobayashi et
# al.'s norm-weighted attention α_ij‖f_h(x_j)‖ with rows renormalised, or both from one forward pass.
ATTENTION_SOURCES = ("weights", "norms", "both")
# The sources of the analyses that read one of them per run (all but analysis.roles): the readings
# of `bertjax.readings.ATTENTION_READINGS`, spelled here too so that no parser imports JAX (a test
# keeps the two equal).
ONE_READING = ("weights", "norms")


def attention_readings(source: str) -> tuple[str, ...]:
    """The readings `--attention source` scores, the one of the main outputs first."""
    if source not in ATTENTION_SOURCES:
        raise UserError(f"--attention must be one of {', '.join(ATTENTION_SOURCES)}, got {source!r}")
    return ("weights", "norms") if source == "both" else (source,)


def check_device_count(devices: int | None) -> None:
    """`--devices` as a config gives it: None (all local devices) or at least 1; whether this
    process has that many is checked when the mesh is built."""
    if devices is not None and devices < 1:
        raise UserError(f"--devices must be at least 1, got {devices}")


def refuse_early(config: Any, writes_out: bool = True, replaces: str | None = None) -> None:
    """The mistakes that need no model, refused by a CLI before it imports JAX, flax and
    transformers (13-26 s on a laptop): a `--out` that is a file or not empty without `--overwrite`
    (where the command writes one; a `--out` holding the file `replaces`, the mark of the tool's
    own earlier output, is replaced without it), an unknown GLUE `--task`, a `--glue-dir` without
    the task's split, a `--step` the run never saved, an unknown `--figure-format`. The run checks
    each again where it acts on it. `config` is any analysis' settings; the fields of these flags have the same names in every
    tool, and those it has are read."""
    from pathlib import Path

    from bertjax import glue, runinfo, steps
    from sieves.parse import TEXT_PREFIX

    if getattr(config, "figure_format", None) is not None:
        select_formats(config.figure_format)

    if writes_out:
        own = replaces is not None and (Path(config.out).expanduser() / replaces).is_file()
        runinfo.check_out(config.out, config.overwrite or own)
    task, glue_dir = getattr(config, "task", None), getattr(config, "glue_dir", None)
    if task is not None and getattr(config, "parser", None) != "conllu":
        parts = (task,) if isinstance(task, str) else task  # analysis.prune takes one task, the others a list
        tasks = [t for part in parts if not part.startswith(TEXT_PREFIX) for t in glue.resolve_tasks(part)]
        if glue_dir is not None:
            for name in tasks:
                glue.glue_files(name, config.split, Path(glue_dir))
    step, ckpt = getattr(config, "step", None), Path(getattr(config, "ckpt", "") or "").expanduser()
    if step is not None and ckpt.is_dir() and (steps.step_of(ckpt) is not None or steps.checkpoint_dir(ckpt)):
        steps.resolve_step(ckpt, step)


# -- the shared settings, declared once: each tool's config takes its field from these -----------
# (docs/cli.md's table; the default where tools differ is the tool's, given as an argument).

CKPT_HELP = "HF-format directory, bertjax run workdir, or hub id"


def ckpt_setting() -> Any:
    return setting(help=CKPT_HELP)


def step_setting() -> Any:
    return setting(None, help="checkpoint step of a bertjax run (default: latest)")


def glue_dir_setting() -> Any:
    return setting(None, help=GLUE_DIR_HELP)


def max_length_setting() -> Any:
    return setting(128, help="tokens per sequence, [CLS] and [SEP] included: longer inputs are truncated")


def batch_size_setting() -> Any:
    return setting(32, help="sequences per forward pass")


def out_setting(default: str) -> Any:
    return setting(default, help="output directory (written whole at the end of the run)")


def overwrite_setting() -> Any:
    return setting(False, help="replace a non-empty --out")


def figures_help(kinds: Sequence[str]) -> str:
    return f"all, none, or a comma-separated subset of {','.join(kinds)}"


def figure_format_setting() -> Any:
    return setting(DEFAULT_FORMATS, help=f"comma-separated subset of {','.join(FIGURE_FORMATS)}")


def devices_setting() -> Any:
    return setting(None, help="use the first N local devices, data parallel (default: all of them)")


def distributed_setting() -> Any:
    return setting(False, help="one process of a multi-host job (jax.distributed.initialize(): SLURM, TPU VMs, "
                               "Kubernetes): each scores its share of the sequences, process 0 writes --out")  # fmt: skip


def nonfinite_setting() -> Any:
    return setting(False, help="analyse a checkpoint whose weights hold NaN or ±Inf (with a warning) instead of refusing it")  # fmt: skip


def precision_setting() -> Any:
    return setting("float32", choices=tuple(MATMUL_PRECISIONS),
                   help="the model's matrix products: float32 (true float32 on every device), tf32 or bfloat16 "
                        "(bfloat16 operands, float32 sums): faster on GPUs, the same as float32 on a CPU "
                        "(docs/precision.md)")  # fmt: skip


def attention_help(sources: Sequence[str]) -> str:
    return ("weights: the attention weights α; norms: α_ij·‖f_h(x_j)‖ with rows renormalised "
            "(Kobayashi et al. 2020, docs/attention-norms.md)"
            + ("; both: each reading from one forward pass" if "both" in sources else ""))  # fmt: skip


def attention_setting(sources: Sequence[str]) -> Any:
    return setting("weights", choices=sources, help=attention_help(sources))


def add_no_figures(p: argparse.ArgumentParser, default: Sequence[str]) -> None:
    """`--no-figures`, the short form of `--figures none`."""
    p.add_argument("--no-figures", dest="figures", action="store_const", const=("none",), default=default,
                   help="the same as --figures none")  # fmt: skip


def add_figure_arguments(p: argparse.ArgumentParser, kinds: Sequence[str], default: Sequence[str] = ("all",)) -> None:
    """`--figures`, `--no-figures` and `--figure-format` for a command without a settings
    dataclass (a benchmark that draws a tool's figures), spelled and explained as the tools', and
    parsed into lists as theirs are."""
    p.add_argument("--figures", default=",".join(default), type=comma_list, help=figures_help(kinds))
    add_no_figures(p, default)
    p.add_argument("--figure-format", default=",".join(DEFAULT_FORMATS), type=comma_list,
                   help=f"comma-separated subset of {','.join(FIGURE_FORMATS)}")  # fmt: skip
