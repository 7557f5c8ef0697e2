"""`python -m train.pretrain --config configs/pretrain/tiny.yaml --workdir DIR [key=value ...]`

Pre-trains BERT (MLM + NSP) with LAMB. Phase 1 runs `train.steps` at `data.max_seq_length`; an
optional phase 2 (BERT's recipe: a short phase at T = 512) continues from phase 1's last params with
its own data, batch size and learning-rate schedule, in the same workdir and step count. Re-running
the same command resumes from the latest checkpoint.

The command line only: the work is `train.pretraining`'s, imported once the flags are parsed, so
that `--help` and a mistyped flag answer without loading JAX; `--help` lists every config key
(`train.config`). The library's names (`run`, `PretrainConfig`, ...) are reachable from this module too.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from bertjax import cli
from bertjax.settings import setting
from train import config as train_config
from train.config import PretrainConfig, overrides_setting, print_config_setting


@dataclasses.dataclass(frozen=True)
class PretrainFlags:
    """The command's own flags; the run's settings are the config's keys (`PretrainConfig`)."""

    config: str = setting(help="YAML file, e.g. configs/pretrain/tiny.yaml")
    workdir: str = setting(help="run directory: checkpoints, logs, data")
    prepare_only: bool = setting(False, help="prepare the shards (and held-out shards) into --workdir and stop")
    print_config: bool = print_config_setting()
    overrides: tuple[str, ...] = overrides_setting("train.steps=200")


def build_parser() -> argparse.ArgumentParser:
    return train_config.command_parser("train.pretrain", __doc__, PretrainFlags, PretrainConfig)


def main(argv: list[str] | None = None) -> None:
    flags = train_config.parse_command(build_parser(), PretrainFlags, argv)
    from bertjax import settings as config_lib

    config = config_lib.load_config(PretrainConfig, flags.config, flags.overrides)
    train_config.print_config_if_asked(flags.print_config, config)
    run(config, Path(flags.workdir), flags.prepare_only)
    import jax

    from train.checkpoints import saved_line

    if not flags.prepare_only and jax.process_index() == 0:
        print(saved_line(Path(flags.workdir)))


def run(config: PretrainConfig, workdir: Path, prepare_only: bool = False) -> dict[str, Any]:
    from train import pretraining

    return pretraining.run(config, workdir, prepare_only)


def __getattr__(name: str) -> Any:
    """The library's other names (`model_config`, `prepared_data`, `Phase2Config`, ...), for code
    that imports them from the command's module."""
    if name.startswith("__"):
        raise AttributeError(name)
    if hasattr(train_config, name):
        return getattr(train_config, name)
    from train import pretraining

    return getattr(pretraining, name)


if __name__ == "__main__":
    cli.run(main)
