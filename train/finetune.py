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
from pathlib import Path
from typing import Any

from bertjax import cli
from bertjax.glue import TASKS
from train import config as train_config
from train.config import FinetuneConfig


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser("train.finetune", __doc__)
    parser.add_argument("--task", required=True, help=f"one of {', '.join(TASKS)}")
    parser.add_argument(
        "--ckpt", "--init", dest="init", required=True, action=cli.DeprecatedAliases,
        help="checkpoint to start from: a bertjax run workdir or a HF-format directory (--init: the old spelling)",
    )  # fmt: skip
    parser.add_argument("--workdir", required=True, help="run directory: checkpoints, logs, eval.json")
    parser.add_argument("--glue-dir", help="local GLUE directory (<TASK>/train.tsv, dev.tsv); default: the hub")
    parser.add_argument(
        "--seeds",
        type=int,
        help="run this many seeds (train.seed, +1, ...) and report mean ± std (default: the config's seeds, 1)",
    )
    parser.add_argument(
        "--config", help="YAML file (default configs/finetune/<task>.yaml); e.g. configs/finetune/adamw.yaml"
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. optimizer.learning_rate=1e-4")
    parser.epilog = train_config.keys_help(FinetuneConfig, note=", as the defaults a config file starts from")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_intermixed_args(argv)  # flags may follow the overrides
    from bertjax import settings as config_lib
    from bertjax.glue import glue_files
    from train.config import CONFIG_DIR, EVAL_SPLITS, task_spec

    task_spec(args.task)  # before looking for its config file
    config = config_lib.load_config(FinetuneConfig, args.config or CONFIG_DIR / f"{args.task}.yaml", args.overrides)
    # The flags are set after the overrides, not as overrides, so that paths keep their exact text.
    config.task, config.init = args.task, args.init
    if args.glue_dir is not None:
        config.data.glue_dir = args.glue_dir
    if args.seeds is not None:
        config.seeds = args.seeds
    if config.data.glue_dir is not None:  # before the heavy imports (the run reads the files later)
        # A split that is no evaluation split is the settings' check's to refuse, with its own line.
        for split in ("train", *[config.data.eval_split] * (config.data.eval_split in EVAL_SPLITS)):
            glue_files(config.task, split, Path(config.data.glue_dir))
    from train.finetuning import describe

    result = run(config, Path(args.workdir))
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
