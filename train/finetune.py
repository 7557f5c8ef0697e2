"""`python -m train.finetune --task mrpc --ckpt CKPT --workdir DIR [--glue-dir DIR] [key=value ...]`

Fine-tunes BERT with a classifier on the pooled output on a GLUE task (QNLI, QQP, MRPC, SST-2),
starting from a bertjax pre-training run or a HF-format directory (`train.finetuning` says what
the run keeps and writes). Re-running the same command resumes.

The command line only: the work is `train.finetuning`'s, imported once the flags are parsed, so
that `--help` and a mistyped flag answer without loading JAX; `--help` lists every config key
(`train.config`). The library's names (`run`, `FinetuneConfig`, ...) are reachable from this module too.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from bertjax import cli
from bertjax.glue import GLUE_DIR_HELP, TASKS
from bertjax.settings import setting
from train import config as train_config
from train.config import FinetuneConfig, overrides_setting, print_config_setting


@dataclasses.dataclass(frozen=True)
class FinetuneFlags:
    """The command's own flags, each of which sets a key of the config (`FinetuneConfig`) after its
    file and overrides, so that paths keep their exact text; `--glue-dir` and `--seeds` only where
    given."""

    task: str = setting(help=f"one of {', '.join(TASKS)}")
    ckpt: str = setting(aliases=("--init",), help="checkpoint to start from: a bertjax run workdir or a HF-format directory (--init: the old spelling)")  # fmt: skip
    workdir: str = setting(help="run directory: checkpoints, logs, eval.json")
    glue_dir: str | None = setting(None, help=GLUE_DIR_HELP)
    seeds: int | None = setting(None, help="run this many seeds (train.seed, +1, ...) and report mean ± std", shown="the config's seeds, 1")  # fmt: skip
    config: str | None = setting(None, help="YAML file (default configs/finetune/<task>.yaml); e.g. configs/finetune/adamw.yaml")  # fmt: skip
    print_config: bool = print_config_setting()
    overrides: tuple[str, ...] = overrides_setting("optimizer.learning_rate=1e-4")


def build_parser() -> argparse.ArgumentParser:
    return train_config.command_parser(
        "train.finetune", __doc__, FinetuneFlags, FinetuneConfig, note=", as the defaults a config file starts from"
    )


def main(argv: list[str] | None = None) -> None:
    flags = train_config.parse_command(build_parser(), FinetuneFlags, argv, intermixed=True)
    from bertjax import settings as config_lib
    from bertjax.glue import glue_files
    from train.config import CONFIG_DIR, EVAL_SPLITS, task_spec

    task_spec(flags.task)  # before looking for its config file
    config = config_lib.load_config(FinetuneConfig, flags.config or CONFIG_DIR / f"{flags.task}.yaml", flags.overrides)
    data = config.data if flags.glue_dir is None else dataclasses.replace(config.data, glue_dir=flags.glue_dir)
    seeds = config.seeds if flags.seeds is None else flags.seeds
    config = dataclasses.replace(config, task=flags.task, init=flags.ckpt, data=data, seeds=seeds)
    train_config.print_config_if_asked(flags.print_config, config)
    if config.data.glue_dir is not None:  # before the heavy imports (the run reads the files later)
        # A split that is no evaluation split is the settings' check's to refuse, with its own line.
        for split in ("train", *[config.data.eval_split] * (config.data.eval_split in EVAL_SPLITS)):
            glue_files(config.task, split, Path(config.data.glue_dir))
    from train.finetuning import describe

    result = run(config, Path(flags.workdir))
    if result is not None:
        print(describe(result))


def run(config: FinetuneConfig, workdir: Path) -> dict[str, Any] | None:
    from train import finetuning

    return finetuning.run(config, workdir)


def __getattr__(name: str) -> Any:
    """The library's other names (`FinetuneConfig`, `describe`, ...), for code that imports them
    from the command's module."""
    if name.startswith("__"):
        raise AttributeError(name)
    if hasattr(train_config, name):
        return getattr(train_config, name)
    from train import finetuning

    return getattr(finetuning, name)


if __name__ == "__main__":
    cli.run(main)
