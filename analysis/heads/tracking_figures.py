"""The tables and figures of a tracked series: the share of heads holding each role per step
(overall and by layer third), which heads hold which role when, and each role's mean β against τ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from analysis.common.figures import (
    Margins,
    log_scale,
    panel_grid,
    save_figure,
    step_axis,
)
from analysis.heads.figures import NO_DATA, NOT_HELD, all_positive, role_colours, titled
from analysis.heads.summary import layer_groups, ordered_roles

# Bump when the cached arrays or the way they are computed change: old entries are then ignored.
SCORES_FORMAT = 1


# Curves of different roles can coincide (prev and next on a symmetric model): each role gets its
# own hollow marker and dash pattern, so one drawn over another still shows.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "p", "h", "*")
DASHES = ("-", "--", "-.", ":")


def line_styles(names: list[str]) -> dict[str, dict]:
    """Per role, the keyword arguments of its curve: colour, a marker and a dash pattern."""
    colours = role_colours(names)
    return {
        role: {"color": colours[role], "marker": MARKERS[i % len(MARKERS)], "linestyle": DASHES[i % len(DASHES)],
               "markersize": 4, "markerfacecolor": "none", "linewidth": 1.2}
        for i, role in enumerate(names)
    }  # fmt: skip


def held_fractions(track: pd.DataFrame, task: str) -> pd.DataFrame:
    """Fraction of heads holding each role at each step, overall and per layer group.

    Rows (step, group) with group "all" and the names of `layer_groups`; columns are roles. The
    denominator is every head of the group (a head with no test does not hold the role).
    """
    rows = track[track["task"] == task]
    n_layers = int(rows["layer"].max()) + 1
    held = rows.assign(assigned=rows["assigned"].astype(bool))
    frames = [held.assign(group="all")]
    if n_layers > 1:
        frames += [held[held["layer"].isin(layers)].assign(group=name) for name, layers in layer_groups(n_layers)]
    stacked = pd.concat(frames)
    fractions = stacked.groupby(["step", "group", "role"], sort=False)["assigned"].mean().unstack("role")
    return fractions[ordered_roles(fractions.columns)]


def format_fractions(track: pd.DataFrame) -> str:
    lines = []
    for task in pd.unique(track["task"]):
        overall = held_fractions(track, task).xs("all", level="group")
        lines.append(f"{task}: % of heads holding each role, by step")
        lines.append((100 * overall).round(1).to_string())
    return "\n".join(lines)


def plot_role_fractions(track: pd.DataFrame, task: str, out_dir: Path, stem: str, *, about: str = "") -> list[Path]:
    """Fraction of heads holding each role against step: all layers, then each layer group."""
    fractions = held_fractions(track, task)
    groups = list(dict.fromkeys(fractions.index.get_level_values("group")))
    styles = line_styles(list(fractions.columns))
    fig = Figure(figsize=(3.6 * len(groups) + 1.6, 3.6), layout="constrained")
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    n_layers = int(track.loc[track["task"] == task, "layer"].max()) + 1
    spans = {"all": np.arange(n_layers), **dict(layer_groups(n_layers))}
    for ax, group in zip(axes, groups, strict=True):
        part = fractions.xs(group, level="group")
        steps = part.index.to_numpy()
        for role in part.columns:
            ax.plot(steps, part[role], label=role, **styles[role])
        step_axis(ax, steps)
        layers = spans[group]
        ax.set_title(
            f"{group} (layers {layers[0]}–{layers[-1]})" if len(layers) > 1 else f"{group} (layer {layers[0]})",
            fontsize=9,
        )
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("fraction of heads holding the role")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(titled(f"{task}: heads holding each role during training", about))
    return save_figure(fig, out_dir, stem)


def plot_emergence(track: pd.DataFrame, task: str, out_dir: Path, stem: str, *, about: str = "") -> list[Path]:
    """Per role, heads (rows, layer-major) × steps (columns): coloured where the head holds it."""
    rows = track[track["task"] == task]
    names = ordered_roles(rows["role"])
    steps = np.sort(pd.unique(rows["step"]))
    n_layers, n_heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    grid = pd.MultiIndex.from_product([range(n_layers), range(n_heads)], names=["layer", "head"])
    colours = role_colours(names)
    fig, axes = panel_grid(
        len(names),
        (max(0.9, 0.22 * len(steps)), max(0.9, 0.035 * n_layers * n_heads)),
        titled(f"{task}: which heads hold each role at each step", about)
        + "\n(rows: heads by layer; light grey: not held; dark grey: untested)",
        xlabel="step",
        # Room for step numbers written upright.
        margins=Margins(bottom=0.8),
    )
    for ax, role in zip(axes, names, strict=True):
        part = rows[rows["role"] == role].set_index(["layer", "head", "step"])
        # A NaN p-value (n < 2, zero variance) is untested, which must not read as "not held".
        held = part["assigned"].astype(float).where(part["p_value"].notna())
        cells = held.unstack("step").reindex(index=grid, columns=steps).to_numpy()
        ax.pcolormesh(
            np.arange(len(steps) + 1) - 0.5,
            np.arange(n_layers * n_heads + 1) - 0.5,
            np.ma.masked_invalid(cells),
            cmap=ListedColormap([NOT_HELD, colours[role]]).with_extremes(bad=NO_DATA),
            vmin=0,
            vmax=1,
        )
        for boundary in range(1, n_layers):
            ax.axhline(boundary * n_heads - 0.5, color="white", linewidth=0.8)
        ax.tick_params(labelsize=6, length=2)
        ax.tick_params(axis="x", labelrotation=90)
        ax.set_title(role, fontsize=9)
    axes[0].set_ylim(n_layers * n_heads - 0.5, -0.5)
    axes[0].set_yticks(np.arange(n_layers) * n_heads + (n_heads - 1) / 2, [f"L{layer}" for layer in range(n_layers)])
    axes[0].set_xticks(range(len(steps)), [str(s) for s in steps])
    return save_figure(fig, out_dir, stem)


def plot_mean_beta(
    track: pd.DataFrame, task: str, taus: dict[int, float], out_dir: Path, stem: str, *, about: str = ""
) -> list[Path]:
    """Mean β over all heads for each role against step, with τ dashed."""
    rows = track[track["task"] == task]
    means = rows.groupby(["step", "role"])["mean"].mean().unstack("role")
    means = means[ordered_roles(means.columns)]
    steps = means.index.to_numpy()
    styles = line_styles(list(means.columns))
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for role in means.columns:
        ax.plot(steps, means[role], label=role, **styles[role])
    ax.plot(steps, [taus[s] for s in steps], color="black", linestyle="--", linewidth=1, label="τ")
    step_axis(ax, steps)
    values = means.to_numpy(dtype=float)
    if all_positive(values[np.isfinite(values)]):
        log_scale(ax, "y")
    ax.set_ylabel("mean β over heads")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.set_title(titled(f"{task}: mean sieve bias score per role during training", about))
    return save_figure(fig, out_dir, stem)
