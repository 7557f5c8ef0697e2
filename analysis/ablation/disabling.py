"""Kovaleva et al. §4.6 and Michel et al. §3.1–3.2 as tables: the metrics with each head (or
layer) disabled or masked, against the unablated model, with exact McNemar tests, Holm-adjusted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.ablation.evaluation import (
    MaskedEvaluator,
    Scored,
    add_holm,
    compare,
    full_mask,
    no_disable,
)
from bertjax.progress import tqdm


def disable_sweep(
    evaluator: MaskedEvaluator, desc: str = "disable", alpha: float = 0.05, baseline: Scored | None = None
) -> tuple[dict[str, float], pd.DataFrame, pd.DataFrame]:
    """Baseline metrics, then one row per disabled head and one per disabled layer.

    Each row holds every metric, its change from the baseline (`<metric>_change`) and the McNemar
    test of accuracy against the baseline (`ablation.compare`), Holm-adjusted over the L·H head rows
    and, separately, over the L layer rows. `baseline` saves its pass when the caller has it.
    """
    n_layers, n_heads = evaluator.n_layers, evaluator.n_heads
    if baseline is None:
        baseline = evaluator.score()
    head_rows, layer_rows = [], []
    with tqdm(total=n_layers * n_heads + n_layers, desc=desc, unit="mask") as progress:
        for layer in range(n_layers):
            for head in range(n_heads):
                disable = no_disable(n_layers, n_heads)
                disable[layer, head] = True
                head_rows.append({"layer": layer, "head": head, **compare(evaluator.score(disable=disable), baseline)})
                progress.update()
        for layer in range(n_layers):
            disable = no_disable(n_layers, n_heads)
            disable[layer] = True
            layer_rows.append({"layer": layer, **compare(evaluator.score(disable=disable), baseline)})
            progress.update()
    return baseline.metrics, add_holm(pd.DataFrame(head_rows), alpha), add_holm(pd.DataFrame(layer_rows), alpha)


def mask_one_head(evaluator: MaskedEvaluator, baseline: Scored, alpha: float, desc: str = "mask") -> pd.DataFrame:
    """Michel's Table 1: one row per head, the metrics with that head alone masked (ξ_h = 0), their
    changes and the McNemar test against the baseline, Holm-adjusted over the L·H rows."""
    shape = (evaluator.n_layers, evaluator.n_heads)
    rows = []
    for layer, head in tqdm(list(np.ndindex(shape)), desc=desc, unit="mask"):
        mask = full_mask(*shape)
        mask[layer, head] = 0.0
        rows.append({"layer": layer, "head": head, **compare(evaluator.score(head_mask=mask), baseline)})
    return add_holm(pd.DataFrame(rows), alpha)


def best_head_only(
    evaluator: MaskedEvaluator, baseline: Scored, metric: str, alpha: float, desc: str = "keep one head"
) -> pd.DataFrame:
    """Michel's Table 2: for each layer, every head is tried as the only one left unmasked in it (the
    other layers intact); the row is the head with the highest `metric` (ties: the lowest index),
    with its metrics, changes and McNemar test, Holm-adjusted over the L rows.

    The head is chosen on the same examples it is scored on, and the test does not account for that
    choice among H heads."""
    shape = (evaluator.n_layers, evaluator.n_heads)
    rows = []
    with tqdm(total=shape[0] * shape[1], desc=desc, unit="mask") as progress:
        for layer in range(shape[0]):
            kept = []
            for head in range(shape[1]):
                mask = full_mask(*shape)
                mask[layer] = 0.0
                mask[layer, head] = 1.0
                kept.append(evaluator.score(head_mask=mask))
                progress.update()
            best = max(range(shape[1]), key=lambda h: kept[h].metrics[metric])
            rows.append({"layer": layer, "head": best, **compare(kept[best], baseline)})
    return add_holm(pd.DataFrame(rows), alpha)
