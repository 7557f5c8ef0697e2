"""`python -m analysis.ablate`: Kovaleva et al. 2019, "Revealing the Dark Secrets of BERT": disabling
heads and layers, attention pattern classes and attention to linguistic features; and Michel et al.
2019 §3, masking one head at a time and keeping one head per layer.

- `patterns` (§4.1): every head's attention map on every example classified by fixed rules as
  vertical, diagonal, vertical+diagonal, block or heterogeneous (see `classify_patterns`); the share
  of each class over heads × examples per task (their Figure 2).
- `features` (§4.4): per head, the attention all tokens pay to nouns, verbs, pronouns, subjects,
  objects, negation words, [CLS] and [SEP] (see `feature_scores`), for the checkpoint and, with
  `--compare-ckpt`, for a second one (the pre-trained model).
- `disable` (§4.6): the metrics with each single head disabled (uniform attention over the real
  tokens), and with each whole layer disabled, against the baseline; CSVs and heatmaps.
- `mask` (Michel §3.1–3.2): the metrics with one head masked (ξ_h = 0), for every head (their
  Table 1), and per layer with only its best head kept (their Table 2).

`disable` and `mask` compare each ablation with the unablated model by the exact McNemar test of
per-example accuracy, Holm-adjusted over the rows of each table.

Attention is streamed batch by batch: only per-map summaries leave the device.

Outputs are written into a temporary sibling of `--out` and renamed at the end.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from analysis.ablation.options import ANALYSES, SPLITS
from analysis.common.flags import add_device_arguments, add_length_arguments, add_nonfinite_argument, add_out_arguments
from bertjax import cli

if TYPE_CHECKING:
    from analysis.ablation.kovaleva import KovalevaConfig


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("analysis.ablate", __doc__)
    p.add_argument("--ckpt", required=True, help="fine-tuned classifier: bertjax run workdir, HF directory or hub id")
    p.add_argument("--step", type=int, help="checkpoint step of a bertjax run (default: latest)")
    p.add_argument("--task", default="mrpc", help="qnli, qqp, mrpc, sst2, a comma-separated list, or all")
    p.add_argument("--glue-dir", help="local GLUE directory (glue_data/<TASK>/<split>.tsv); default: the hub")
    p.add_argument("--split", default="dev", choices=SPLITS, help="the split of each task's examples (labelled)")
    p.add_argument("--n", type=int, help="first N examples of the split (default: all)")
    add_length_arguments(p)
    p.add_argument("--analyses", default=",".join(ANALYSES), help=f"comma-separated subset of {','.join(ANALYSES)}")
    p.add_argument("--alpha", type=float, default=0.05, help="disable, mask: level of the Holm McNemar tests")
    p.add_argument("--compare-ckpt", help="features: a second checkpoint to compare with (the pre-trained model)")
    p.add_argument("--compare-step", type=int, help="checkpoint step of --compare-ckpt's run")
    p.add_argument("--spacy-model", help="spaCy pipeline for the features (default en_core_web_sm)")
    p.add_argument("--cache-dir", default=str(cli.CACHE_ROOT), help="where parses are cached")
    add_out_arguments(p, "ablate_out")
    p.add_argument("--figure-format", default="png", help="comma-separated subset of png,svg,pdf (default: png)")
    add_device_arguments(p, distributed=False)
    add_nonfinite_argument(p)
    return p


def parse_args(argv: list[str] | None) -> KovalevaConfig:
    a = build_parser().parse_args(argv)
    from analysis.ablation.kovaleva import KovalevaConfig  # after parsing: --help and flag errors need no JAX

    return KovalevaConfig(
        ckpt=a.ckpt, task=a.task, step=a.step, glue_dir=a.glue_dir, split=a.split, n=a.n,
        max_length=a.max_length, batch_size=a.batch_size, analyses=tuple(x for x in a.analyses.split(",") if x),
        alpha=a.alpha, compare_ckpt=a.compare_ckpt, compare_step=a.compare_step, spacy_model=a.spacy_model, cache_dir=a.cache_dir,
        out=a.out, overwrite=a.overwrite, figure_format=a.figure_format, devices=a.devices,
        allow_nonfinite=a.allow_nonfinite,
    )  # fmt: skip


def run(config: KovalevaConfig) -> None:
    from analysis.api.ablation import run_ablate  # after parsing: --help and flag errors need no JAX

    result = run_ablate(config)  # computed and written
    if result.run.lines:
        print(result.run.text())
    cli.print_wrote(config.out)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
