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

from analysis.tools import Command
from bertjax import cli

_command = Command("ablate", __doc__)
build_parser, parse_args, run = _command.build_parser, _command.parse_args, _command.run


def main(argv: list[str] | None = None) -> object:
    return run(parse_args(argv))


if __name__ == "__main__":
    cli.run(main)
