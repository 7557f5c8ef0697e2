"""`python -m analysis.finetune_effect --pre CKPT --post CKPT[:TASK] ...`: what fine-tuning does to the heads.

Two comparisons of a pre-trained checkpoint with each fine-tuned one, on the same sequences:

- Pande et al. 2021, Fig. 6: the change (post − pre) in mean sieve bias score per coarse role
  (local, syntactic, block, delimiter, and the delimiter split into [CLS] and [SEP]) in the
  initial, middle and final third of the layers;
- Kovaleva et al. 2019: per head, the cosine similarity between the pre and post attention maps,
  each flattened over the real × real tokens of an example, averaged over the examples.

Outputs (written into a temporary sibling of `--out` and renamed when complete): `beta_change.csv`,
`head_means.csv`, `attention_similarity.csv`, the figures `beta_change` and
`attention_similarity` (PNG and SVG), and `run.json`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from analysis.common.examples import resolve_tasks
from analysis.heads.config import add_data_arguments, add_output_arguments, config_from_args
from analysis.heads.finetuning import FIGURES, EffectConfig, Post, run
from analysis.heads.pipeline import write_html
from bertjax import cli, glue
from bertjax.errors import UserError


def parse_post(spec: str, default_tasks: str) -> tuple[str, tuple[str, ...]]:
    """`CKPT` (tasks from --task) or `CKPT:TASK[,TASK]` when the suffix names tasks; a suffix that
    names none must belong to an existing path."""
    path, sep, suffix = spec.rpartition(":")
    if sep and path:
        try:
            return path, tuple(resolve_tasks(suffix))
        except UserError:
            if not Path(spec).expanduser().exists():
                raise UserError(
                    f"--post {spec}: {suffix!r} after the last ':' is not a task (choose from {', '.join(glue.TASKS)}, "
                    f"all, or a comma-separated list) and {spec} is not an existing path"
                ) from None
    return spec, tuple(resolve_tasks(default_tasks))


def post_labels(paths: Sequence[str]) -> list[str]:
    """The run's directory name (a step folder gets `<run>@<step>`), numbered when repeated."""
    names = []
    for text in paths:
        path = Path(text).expanduser().resolve()
        is_step = path.name.isdigit() and path.parent.name == "checkpoints"
        names.append(f"{path.parent.parent.name}@{path.name}" if is_step else path.name)
    return [f"{n}#{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def parse_args(argv: list[str] | None) -> EffectConfig:
    p = argparse.ArgumentParser(prog="python -m analysis.finetune_effect", description=__doc__.split("\n\n")[0])
    cli.add_verbose_argument(p)
    p.add_argument("--pre", required=True, help="the pre-trained checkpoint (HF directory, run workdir or step folder)")
    p.add_argument("--post", required=True, action="append",
                   help="a fine-tuned checkpoint, optionally :TASK (default: the --task tasks); repeatable")  # fmt: skip
    add_data_arguments(p)
    add_output_arguments(p, "finetune_effect_out", FIGURES)
    a = p.parse_args(argv)
    if a.parser == "conllu" or a.conllu:
        # The comparison runs per GLUE task of each --post; gold trees would need a task of their own.
        raise UserError("--parser conllu / --conllu: finetune_effect compares on GLUE tasks parsed by spaCy only; "
                        "run analysis.roles --parser conllu on each checkpoint instead")  # fmt: skip
    specs = [parse_post(spec, a.task) for spec in a.post]
    labels = post_labels([path for path, _ in specs])
    posts = tuple(Post(path, tasks, label) for (path, tasks), label in zip(specs, labels, strict=True))
    data = config_from_args(a, ckpt=a.pre, task=",".join(dict.fromkeys(t for p in posts for t in p.tasks)))
    return EffectConfig(data=data, posts=posts)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    run(config)
    if config.data.html:
        write_html(config.data.out)


if __name__ == "__main__":
    cli.run(main)
