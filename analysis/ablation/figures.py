"""Figures of the Kovaleva et al. and Michel et al. analyses: pattern shares, feature attention,
disabling and masking heat maps, pruning curves.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import CenteredNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from analysis.ablation.evaluation import ONE_POINT
from analysis.ablation.features import FEATURES
from analysis.ablation.patterns import PATTERN_COLOURS, PATTERNS
from analysis.common.figures import save_figure


def plot_pattern_shares(shares: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Kovaleva's Figure 2: per task, the % of head × example maps in each pattern class."""
    tasks = list(pd.unique(shares["task"]))
    fig = Figure(figsize=(2.0 + 1.3 * len(tasks), 4.4), layout="constrained")
    ax = fig.add_subplot()
    bottom = np.zeros(len(tasks))
    for pattern, colour in zip(PATTERNS, PATTERN_COLOURS, strict=True):
        # NaN (block on single sentences) stacks as nothing.
        share = 100 * np.nan_to_num(
            shares[shares["pattern"] == pattern].set_index("task").loc[tasks, "share"].to_numpy()
        )
        bars = ax.bar(tasks, share, bottom=bottom, color=colour, label=pattern, width=0.6)
        texts = [f"{x:.0f}%" if x >= 4 else "" for x in share]
        ax.bar_label(bars, labels=texts, label_type="center", fontsize=7, color="white")
        bottom += share
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of maps (heads × examples)")
    ax.set_title("attention pattern classes", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, out_dir, "pattern_shares")


def plot_features(means: dict[str, dict[str, np.ndarray]], task: str, out_dir: Path) -> list[Path]:
    """One row per feature: the mean score of every head per checkpoint, and their difference."""
    labels = list(means)
    features = [f for f in FEATURES if all(f in means[c] for c in labels)]
    columns = labels + (["difference"] if len(labels) == 2 else [])
    n_layers, n_heads = next(iter(means[labels[0]].values())).shape
    size = (1.0 + len(columns) * (0.6 + 0.22 * n_heads), 0.6 + len(features) * (0.5 + 0.22 * n_layers))
    fig = Figure(figsize=size, layout="constrained")
    grid = fig.subplots(len(features), len(columns), squeeze=False)
    for r, feature in enumerate(features):
        values = [means[c][feature] for c in labels]
        top = max(float(np.max(x)) for x in values)
        for c, column in enumerate(columns):
            ax = grid[r, c]
            if column == "difference":
                diff = values[0] - values[1]
                norm = CenteredNorm(0.0, max(float(np.abs(diff).max()), 1e-9))
                image = ax.imshow(diff, cmap=colormaps["RdBu"], norm=norm)
            else:
                image = ax.imshow(values[c], cmap=colormaps["viridis"], vmin=0.0, vmax=top)
            fig.colorbar(image, ax=ax, shrink=0.8)
            ax.set_xticks(range(n_heads))
            ax.set_yticks(range(n_layers))
            ax.tick_params(labelsize=5, length=1)
            ax.set_title(f"{feature}: {column}", fontsize=7)
        grid[r, 0].set_ylabel("layer", fontsize=7)
    for ax in grid[-1]:
        ax.set_xlabel("head", fontsize=7)
    fig.suptitle(
        f"{task}: attention paid to each feature (max over occurrences, over n; mean over sequences)", fontsize=9
    )
    return save_figure(fig, out_dir, f"{task}_features")


def head_grid(table: pd.DataFrame, column: str, n_layers: int, n_heads: int) -> np.ndarray:
    grid = np.full((n_layers, n_heads), np.nan)
    grid[table["layer"].to_numpy(), table["head"].to_numpy()] = table[column].to_numpy()
    return grid


def significance_marks(
    table: pd.DataFrame, metric: str, n_layers: int, n_heads: int, alpha: float
) -> tuple[np.ndarray | None, str]:
    """The cells to box on `metric`'s change map and the title's note: the McNemar test is of
    accuracy, so only accuracy's map is marked."""
    if metric != "accuracy":
        return None, ""
    marked = head_grid(table, "significant_holm", n_layers, n_heads) == 1
    return marked, f"; boxed: McNemar Holm p < {alpha:g}"


def plot_disabling(
    baseline: dict[str, float], heads: pd.DataFrame, layers: pd.DataFrame, metric_names, task: str, split: str,
    out_dir: Path, alpha: float = 0.05,
) -> list[Path]:  # fmt: skip
    """Per metric: the metric with each head disabled, its change, and the change per layer."""
    n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    paths: list[Path] = []
    for metric in metric_names:
        base = f"baseline {metric} {baseline[metric]:.4f}"
        marked, note = significance_marks(heads, metric, n_layers, n_heads, alpha)
        paths += head_heatmap(
            head_grid(heads, metric, n_layers, n_heads), f"{task}: {split} {metric} with one head disabled ({base})",
            metric, out_dir, f"{task}_disable_heads_{metric}",
        )  # fmt: skip
        paths += head_heatmap(
            head_grid(heads, f"{metric}_change", n_layers, n_heads),
            f"{task}: change in {split} {metric} when one head is disabled\n({base}{note})",
            f"{metric} − baseline", out_dir, f"{task}_disable_heads_{metric}_change", diverging=True, marked=marked,
        )  # fmt: skip
        paths += head_heatmap(
            layers[f"{metric}_change"].to_numpy()[:, None],
            f"{task}: layer disabled\n({base})", f"{metric} − baseline", out_dir,
            f"{task}_disable_layers_{metric}_change", diverging=True, columns=None,
        )  # fmt: skip
    return paths


def plot_mask_one_head(
    baseline: dict[str, float], heads: pd.DataFrame, metric_names, task: str, split: str, out_dir: Path, alpha: float
) -> list[Path]:
    """Per metric: the L × H map of its change when one head is masked (Michel's Table 1)."""
    n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    paths: list[Path] = []
    for metric in metric_names:
        marked, note = significance_marks(heads, metric, n_layers, n_heads, alpha)
        paths += head_heatmap(
            head_grid(heads, f"{metric}_change", n_layers, n_heads),
            f"{task}: change in {split} {metric} when one head is masked\n(baseline {baseline[metric]:.4f}{note})",
            f"{metric} − baseline", out_dir, f"{task}_mask_one_head_{metric}_change", diverging=True, marked=marked,
        )  # fmt: skip
    return paths


def head_heatmap(
    values: np.ndarray,
    title: str,
    label: str,
    out_dir: Path,
    stem: str,
    diverging: bool = False,
    annotate: bool = True,
    columns: str | None = "head",
    marked: np.ndarray | None = None,
) -> list[Path]:
    """One L × H heatmap (layer rows, head columns), optionally centred on 0 with a diverging map.

    `columns=None` is for a single column of per-layer values: no column axis is drawn. Cells
    where `marked` (bool, the shape of `values`) is true get a black box."""
    values = np.asarray(values, float)
    n_layers, n_heads = values.shape
    fig = Figure(figsize=(1.6 + 0.55 * n_heads, 1.2 + 0.45 * n_layers), layout="constrained")
    ax = fig.add_subplot()
    finite = values[np.isfinite(values)]
    if diverging:
        norm = CenteredNorm(0.0, max(np.abs(finite).max(initial=0.0), 1e-9))
        mesh = ax.imshow(values, cmap=colormaps["RdBu"], norm=norm)
    else:
        mesh = ax.imshow(values, cmap=colormaps["viridis"])
    if annotate:
        # Changes of a few tenths of a point would all read 0.00 with two decimals.
        digits = 3 if finite.size and np.abs(finite).max() < 0.1 else 2
        for (layer, head), value in np.ndenumerate(values):
            # Dark text on light cells, light text on dark ones. A norm maps a scalar to a scalar
            # (matplotlib's stubs say ArrayLike for any input).
            shade = cast(float, mesh.norm(value))
            light = abs(shade - 0.5) < 0.3 if diverging else shade > 0.6
            ax.text(head, layer, f"{value:.{digits}f}", ha="center", va="center", fontsize=6,
                    color="black" if light else "white")  # fmt: skip
    if marked is not None:
        for layer, head in zip(*np.nonzero(marked), strict=True):
            ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.6))
    ax.set_xticks(range(n_heads) if columns else [])
    ax.set_yticks(range(n_layers))
    ax.set_xlabel(columns or "")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(mesh, ax=ax, label=label, shrink=0.9)
    return save_figure(fig, out_dir, stem)


def plot_pruning(
    curve: pd.DataFrame, random_runs: pd.DataFrame, metric: str, task: str, split: str, out_dir: Path
) -> list[Path]:
    """Metric against the % of heads pruned: importance order, and the random orders' mean and range."""
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    styles = {
        "importance": ("#08519c", "o", "importance order"),
        "random": ("#a50f15", "s", "random order (mean of seeds)"),
    }
    for order, (colour, marker, label) in styles.items():
        rows = curve[curve["order"] == order]
        if len(rows):
            ax.plot(100 * rows["fraction_pruned"], rows["metric"], color=colour, marker=marker, label=label)
    if len(random_runs):
        spread = random_runs.groupby("fraction_pruned")["metric"].agg(["min", "max"])
        ax.fill_between(100 * spread.index, spread["min"], spread["max"], color="#a50f15", alpha=0.15,
                        label=f"random: range over {random_runs['seed'].nunique()} seeds")  # fmt: skip
    baseline = curve.loc[curve["heads_pruned"] == 0, "metric"].iloc[0]
    ax.axhline(baseline - ONE_POINT, color="grey", linestyle=":", label="unpruned − 1 point")
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel(f"{split} {metric}")
    ax.set_title(f"{task}: pruning heads by importance vs at random")
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, f"{task}_pruning")
