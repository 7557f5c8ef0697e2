"""Dependency heads (Clark et al. 2019, §4.2) as `analysis.clark` reports them: the head and the
offset baseline of each relation and direction chosen on dev and reported on test.

The counts themselves (which arcs each head finds in each direction, and each offset) are
`sieves.depattn.DependencyCounts`, shared with SAS and the probes inside pre-training; its
docstring and docs/fidelity.md give the definitions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sieves.depattn import ALL_RELATIONS, DIRECTIONS, DependencyCounts

TABLE_COLUMNS = (
    "relation", "layer", "head", "direction", "dev_accuracy", "test_accuracy",
    "baseline_offset", "baseline_accuracy", "count",
)  # fmt: skip


def dependency_table(dev: DependencyCounts, test: DependencyCounts) -> pd.DataFrame:
    """One row per (relation, direction) seen in both splits: the head best on dev, its dev and
    test accuracy, the offset best on dev and its test accuracy, and the test arc count."""
    rows = []
    for relation in sorted(set(dev.count) & set(test.count), key=lambda r: (r == ALL_RELATIONS, r)):
        dev_accuracy = dev.accuracy(relation)
        test_accuracy = test.accuracy(relation)
        offset = int(np.argmax(dev.offset_found[relation]))
        baseline = test.offset_found[relation][offset] / test.count[relation]
        for d, direction in enumerate(DIRECTIONS):
            layer, head = np.unravel_index(np.argmax(dev_accuracy[d]), dev_accuracy[d].shape)
            rows.append(
                {
                    "relation": relation,
                    "layer": int(layer),
                    "head": int(head),
                    "direction": direction,
                    "dev_accuracy": float(dev_accuracy[d, layer, head]),
                    "test_accuracy": float(test_accuracy[d, layer, head]),
                    "baseline_offset": dev.offsets[offset],
                    "baseline_accuracy": float(baseline),
                    "count": test.count[relation],
                }
            )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def best_per_relation(table: pd.DataFrame) -> pd.DataFrame:
    """Per relation, the direction whose head is best on dev (the paper's one number per relation)."""
    chosen = table.loc[table.groupby("relation", sort=False)["dev_accuracy"].idxmax()]
    return chosen.reset_index(drop=True)


def format_summary(table: pd.DataFrame, min_count: int) -> str:
    """The paper's Table 1 layout: relation, best head (layer-head, 0-based), test accuracy and the
    offset baseline; relations with fewer than `min_count` test arcs are left out."""
    best = best_per_relation(table)
    best = best[(best["count"] >= min_count) | (best["relation"] == ALL_RELATIONS)]
    lines = [
        f"dependency heads (head and offset chosen on dev; accuracy on test; relations with ≥ {min_count} test arcs)",
        f"{'relation':<14}{'head':>8}  {'direction':<10}{'test acc':>9}{'baseline':>10}  {'offset':>6}{'arcs':>7}",
    ]
    for row in best.itertuples():
        mark = "  *" if row.test_accuracy > row.baseline_accuracy else ""
        lines.append(
            f"{row.relation:<14}{f'{row.layer}-{row.head}':>8}  {row.direction:<10}{100 * row.test_accuracy:>8.1f}%"
            f"{100 * row.baseline_accuracy:>9.1f}%  {row.baseline_offset:>+6d}{row.count:>7d}{mark}"
        )
    lines.append("* the head beats the best fixed-offset baseline on test")
    return "\n".join(lines)
