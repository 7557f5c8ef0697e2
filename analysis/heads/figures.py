"""Figures of the heads-hypothesis analysis (Pande et al. 2021, Figs. 3–5), one function each.

Every figure is a bare `matplotlib.figure.Figure`, never pyplot state, so plotting is thread-safe
and leaks no open figures. Each function saves `<stem>.<format>` in the formats of the
`figure_formats` in force (PNG unless a CLI's `--figure-format` asks for SVG or PDF too) and returns
the paths. The CLIs choose which figures to draw with `--figures all|none|KIND,...`
(each tool's `figures` setting, `analysis.heads.config`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colorbar import Colorbar
from matplotlib.colors import BoundaryNorm, Colormap, ListedColormap, LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from analysis.common.figures import FigurePool, Margins, log_scale, panel_grid, pool_size, save_figure
from analysis.heads.config import ROLES_FIGURES
from analysis.heads.summary import (
    DEFAULT_COARSE,
    Correlation,
    coarse_held_table,
    head_table,
    held_table,
    local_syntactic_spearman,
    task_rows,
)

NOT_HELD = "#eeeeee"
NO_DATA = "#bdbdbd"
# Hue families follow the coarse roles (blues local, purple block, reds delimiter, greens
# syntactic), so a role grid reads by family before it reads by fine role; within a family the
# lightness (and for nsubj the hue, teal) sets each role apart: a coarse role and the fine roles
# beside it in a cell (syntactic and nsubj, cls and sep) are at least 35 CIELAB ΔE apart.
ROLE_COLOURS: Mapping[str, str] = MappingProxyType(
    {
        "local": "#08519c", "prev": "#4292c6", "next": "#9ecae1",
        "block": "#6a51a3",
        "cls": "#67000d", "sep": "#fb6a4a", "delimiter": "#fcbba1",
        "nsubj": "#35978f", "dobj": "#41ab5d", "amod": "#a6d96a", "advmod": "#d9ef8b",
        "syntactic": "#00441b",
    }
)  # fmt: skip
# Roles a user adds get colours from a palette outside the families above.
EXTRA_COLOURS: tuple[str, ...] = (
    "#e6ab02", "#a6761d", "#e7298a", "#666666", "#1b9e77", "#d95f02", "#17becf", "#bcbd22",
)  # fmt: skip
# Panels a row in the heat-map grids.
HEATMAP_COLUMNS = 4
# −log10 p above this is one colour: p-values of 1e-300 would otherwise wash out the α threshold.
NEG_LOG10_P_CAP = 10.0
# The mean-β heat maps' colours span these percentiles of the positive means: one outlying head
# (a [CLS] sink's β of 40 among values of 0.5–3) stretched the scale until the rest was one colour.
# Values beyond are drawn in the end colours, and the colour bar's arrows say so.
COLOUR_PERCENTILES = (1.0, 99.0)


def about_line(model: str, n: int, tau: float | str) -> str:
    """The line under a figure's title saying what it is of: the model, N and τ (a number, or a
    word such as "per step")."""
    return (
        f"{model} · N = {n} sequences · τ = {tau:g}"
        if isinstance(tau, float | int)
        else f"{model} · N = {n} sequences · τ {tau}"
    )


def titled(title: str, about: str) -> str:
    return f"{title}\n{about}" if about else title


def role_colours(names: Sequence[str]) -> dict[str, str]:
    """A colour per role: fixed for the known roles, cycled from `EXTRA_COLOURS` for the rest."""
    extra = itertools.cycle(EXTRA_COLOURS)
    return {r: ROLE_COLOURS[r] if r in ROLE_COLOURS else next(extra) for r in names}


def coarse_combinations(coarse_held: pd.DataFrame) -> dict[tuple[str, ...], int]:
    """How many heads hold exactly each combination of coarse roles (one head counts once).

    Keys are tuples of role names in column order, `()` for heads with no coarse role, which is
    always present even at zero. Ordered by count (most first), then by size, then column order.
    """
    names = list(coarse_held.columns)
    counts = Counter(tuple(n for n, h in zip(names, row, strict=True) if h) for row in coarse_held.to_numpy())
    counts.setdefault((), 0)
    return dict(
        sorted(
            counts.items(),
            key=lambda kv: (-kv[1], len(kv[0]), [names.index(n) for n in kv[0]]),
        )
    )


def _grid(table: pd.DataFrame, role: str) -> np.ndarray:
    """One role's column of a (layer, head) table as an [L, H] array."""
    return table[role].to_numpy(dtype=float).reshape(table.index.levshape)


def all_positive(values: np.ndarray) -> bool:
    return bool(values.size) and bool((values > 0).all())


def role_grid_codes(held: np.ndarray) -> np.ndarray:
    """bool [L, H, R] → int [L, H·R]: head h's R slices are columns h·R … h·R + R − 1 (the head's
    own index, as the heat maps and the report place it), holding 1 + the role's index if held, else 0."""
    n_layers, _, n_roles = held.shape
    return np.where(held, np.arange(1, n_roles + 1), 0).reshape(n_layers, -1)


def plot_role_grid(roles: pd.DataFrame, task: str, out_dir: Path, stem: str, *, about: str = "") -> list[Path]:
    """Paper Fig. 5: layers × heads, each cell sliced into the task's fine roles, coloured if held.
    The x axis is the head's index."""
    held = held_table(roles, task)
    names = list(held.columns)
    n_layers, n_heads = held.index.levshape
    codes = role_grid_codes(held.to_numpy().reshape(n_layers, n_heads, len(names)))
    colours = role_colours(names)
    cmap = ListedColormap([NOT_HELD] + [colours[r] for r in names])

    # Tall enough for the legend too (one entry per role plus "not held").
    height = max(1.0 + 0.45 * n_layers, 1.0 + 0.26 * (len(names) + 1))
    fig = Figure(figsize=(2.4 + 0.75 * n_heads, height), layout="constrained")
    ax = fig.add_subplot()
    # A vector mesh, not imshow, so the SVG keeps sharp slice edges at any zoom.
    ax.pcolormesh(
        np.linspace(-0.5, n_heads - 0.5, codes.shape[1] + 1),
        np.arange(n_layers + 1) - 0.5,
        codes,
        cmap=cmap,
        norm=Normalize(-0.5, len(names) + 0.5),
    )
    # White gutters: without them the slices of neighbouring cells run together.
    ax.vlines(np.arange(n_heads - 1) + 0.5, -0.5, n_layers - 0.5, colors="white", linewidth=3)
    ax.hlines(np.arange(n_layers - 1) + 0.5, -0.5, n_heads - 0.5, colors="white", linewidth=5)
    ax.set_xlim(-0.5, n_heads - 0.5)
    ax.set_ylim(n_layers - 0.5, -0.5)
    ax.set_yticks(range(n_layers))
    ax.set_xticks(range(n_heads))
    ax.tick_params(length=0, labelsize=8)
    ax.spines[:].set_visible(False)
    ax.set_ylabel("layer")
    ax.set_xlabel("head")
    handles = [Patch(facecolor=colours[r], label=r) for r in names]
    handles.append(Patch(facecolor=NOT_HELD, edgecolor="#999999", label="not held"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, title="role")
    fig.suptitle(titled(f"{task}: roles held by each head", about))
    return save_figure(fig, out_dir, stem)


def plot_coarse_overlap(
    roles: pd.DataFrame,
    task: str,
    out_dir: Path,
    stem: str,
    *,
    coarse: Mapping[str, str] = DEFAULT_COARSE,
    about: str = "",
) -> list[Path]:
    """Paper Fig. 4 as an UpSet plot: heads per exact combination of coarse roles.

    Top: one bar per combination (`none` included); below it the dot matrix naming the
    combination; left: how many heads hold each coarse role at all.
    """
    by_coarse = coarse_held_table(held_table(roles, task), coarse)
    names = list(by_coarse.columns)
    combos = coarse_combinations(by_coarse)
    colours = role_colours(names)
    x = np.arange(len(combos))
    y = np.arange(len(names))

    fig = Figure(figsize=(3.5 + 0.45 * len(combos), 2.8 + 0.35 * len(names)), layout="constrained")
    grid = fig.add_gridspec(
        2,
        2,
        width_ratios=(1.2, max(3.0, 0.4 * len(combos))),
        height_ratios=(3.0, 0.2 + 0.3 * len(names)),
    )
    ax_bars = fig.add_subplot(grid[0, 1])
    ax_dots = fig.add_subplot(grid[1, 1], sharex=ax_bars)
    ax_sizes = fig.add_subplot(grid[1, 0], sharey=ax_dots)

    bars = ax_bars.bar(x, list(combos.values()), width=0.6, color="#404040")
    ax_bars.bar_label(bars, fontsize=8, padding=2)
    ax_bars.set_ylabel("heads with exactly\nthese coarse roles")
    ax_bars.tick_params(axis="x", bottom=False, labelbottom=False)
    ax_bars.spines[["top", "right"]].set_visible(False)
    ax_bars.margins(y=0.12)
    ax_bars.yaxis.set_major_locator(MaxNLocator(integer=True))

    for i, combo in enumerate(combos):
        members = [names.index(c) for c in combo]
        ax_dots.scatter(np.full(len(names), i), y, s=45, color=NOT_HELD, edgecolor="#bbbbbb", zorder=1)
        if members:
            ax_dots.vlines(i, min(members), max(members), color="#202020", linewidth=2, zorder=2)
            ax_dots.scatter(np.full(len(members), i), members, s=45, color="#202020", zorder=3)
    ax_dots.set_xticks(x, ["none" if not combo else "" for combo in combos], fontsize=8)
    ax_dots.set_yticks(y, names)
    ax_dots.set_ylim(len(names) - 0.5, -0.5)
    ax_dots.tick_params(length=0)
    ax_dots.spines[:].set_visible(False)

    sizes = by_coarse.sum().to_numpy()
    ax_sizes.barh(y, sizes, height=0.6, color=[colours[n] for n in names])
    ax_sizes.invert_xaxis()
    # bar_label puts its text inside the bar on an inverted axis, so place the counts by hand.
    for row, size in zip(y, sizes, strict=True):
        ax_sizes.annotate(
            str(size), (size, row), xytext=(-3, 0), textcoords="offset points",
            ha="right", va="center", fontsize=8,
        )  # fmt: skip
    # The panel is narrow: three ticks at most, or "80706050…" runs together.
    ax_sizes.xaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
    ax_sizes.tick_params(axis="x", labelsize=8)
    ax_sizes.margins(x=0.25)
    ax_sizes.tick_params(axis="y", left=False, labelleft=False)
    ax_sizes.spines[["top", "left", "right"]].set_visible(False)
    ax_sizes.set_xlabel("heads holding\nthe role", fontsize=8)
    fig.suptitle(titled(f"{task}: overlap of coarse roles over {len(by_coarse)} heads", about))
    return save_figure(fig, out_dir, stem)


def _sequence_score_panel(ax: Axes, pooled: Mapping[str, np.ndarray], colours: Mapping[str, str], tau: float) -> None:
    """Per-sequence β pooled over heads, one step histogram per role, each summing to 1."""
    ax.set_title("(c) per-sequence β, pooled over heads")
    if not pooled:
        ax.text(0.5, 0.5, "no per-sequence scores", transform=ax.transAxes, ha="center")
        return
    everything = np.concatenate(list(pooled.values()))
    positive = everything[everything > 0]
    # A head that all but ignores a sieve scores ~1e-15 on some sequences; starting the axis at the
    # 0.1th percentile keeps the bulk readable, and the rarer, smaller scores join the lowest bin.
    low = np.quantile(positive, 0.001) if positive.size else 0.0
    log = positive.size > 0 and low < everything.max()
    edges = np.geomspace(low, everything.max(), 41) if log else np.histogram_bin_edges(everything, bins=40)
    for role, values in pooled.items():
        # Zeros cannot sit on a log axis; they (and scores below the axis) join the lowest bin.
        shown = np.clip(values, edges[0], None) if log else values
        ax.hist(
            shown,
            # matplotlib takes any array of edges; its stubs name only Sequence[float].
            bins=edges,  # type: ignore[arg-type]
            weights=np.full(values.size, 1.0 / values.size),
            histtype="step",
            color=colours[role],
            label=role,
        )
    ax.axvline(tau, color="black", linestyle="--", label=f"τ = {tau:g}")
    # The grand mean is what `--tau auto` rounds up, so show where it falls.
    grand_mean = everything.mean()
    ax.axvline(grand_mean, color="black", linestyle=":", label=f"grand mean {grand_mean:.2f}")
    if log:
        log_scale(ax, "x")
    ax.set_xlabel("sieve bias score β of one sequence")
    ax.set_ylabel("fraction of (sequence, head) scores")
    ax.legend(fontsize=7, ncols=2)


def plot_score_distributions(
    roles: pd.DataFrame,
    scores: Mapping[tuple[str, str], np.ndarray],
    task: str,
    tau: float,
    alpha: float,
    out_dir: Path,
    stem: str,
    *,
    about: str = "",
) -> list[Path]:
    """Paper Fig. 3: (a) ECDF of per-head mean β by role with τ; (b) raw p-values with α.

    A third panel (c) shows the per-sequence scores behind the means, pooled over heads, with τ
    and their grand mean (the `--tau auto` input).
    """
    rows = task_rows(roles, task)
    means = head_table(roles, task, "mean")
    names = list(means.columns)
    colours = role_colours(names)
    # A fixed layout: constrained layout was a third of this figure's drawing time.
    # Room above the panels' titles for the two lines of the figure's (they ran into panel (b)'s).
    fig = Figure(figsize=(16, 5.0))
    ax_cdf, ax_p, ax_seq = fig.subplots(
        1, 3, gridspec_kw={"left": 0.05, "right": 0.99, "bottom": 0.11, "top": 0.80, "wspace": 0.2}
    )

    every_mean = means.to_numpy(dtype=float)
    for role in names:
        values = means[role].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        if values.size:
            ax_cdf.ecdf(values, color=colours[role], label=role)
    ax_cdf.axvline(tau, color="black", linestyle="--", label=f"τ = {tau:g}")
    if all_positive(every_mean[np.isfinite(every_mean)]):
        log_scale(ax_cdf, "x")
    ax_cdf.set_xlabel("mean β of a head")
    ax_cdf.set_ylabel("fraction of heads")
    ax_cdf.set_title("(a) ECDF of per-head mean β")
    ax_cdf.legend(fontsize=7, ncols=2)

    p = rows["p_value"].to_numpy(dtype=float)
    tested = p[np.isfinite(p)]
    ax_p.hist(tested, bins=np.linspace(0.0, 1.0, 21), color="#606060")
    ax_p.axvline(alpha, color="#d62728", linestyle="--", label=f"α = {alpha:g}")
    ax_p.set_xlabel("raw p-value")
    ax_p.set_ylabel("tests (head × role)")
    ax_p.set_title(f"(b) raw p-values, {tested.size} tests ({p.size - tested.size} untestable)")
    ax_p.legend(fontsize=8)

    pooled = {}
    for role in names:
        if (task, role) in scores:
            values = np.asarray(scores[(task, role)], dtype=float).ravel()
            values = values[np.isfinite(values)]
            if values.size:
                pooled[role] = values
    _sequence_score_panel(ax_seq, pooled, colours, tau)
    fig.suptitle(titled(f"{task}: sieve bias scores and p-values", about))
    return save_figure(fig, out_dir, stem)


def _heatmap_grid(
    values: pd.DataFrame,
    held: pd.DataFrame,
    norm: Normalize,
    cmap: Colormap,
    extend: Literal["neither", "min", "max", "both"],
    title: str,
) -> tuple[Figure, Colorbar]:
    """One L × H panel per role on a shared norm; white dots mark the heads holding the role."""
    names = list(values.columns)
    n_layers, n_heads = values.index.levshape
    rows = math.ceil(len(names) / HEATMAP_COLUMNS)
    # Square cells; panels wide enough for a role name as title; a grid tall enough for the colour
    # bar's label.
    cell = max(0.25, 0.9 / n_heads, 1.8 / (rows * n_layers))
    fig, axes = panel_grid(
        len(names),
        (cell * n_heads, cell * n_layers),
        title,
        xlabel="head",
        ylabel="layer",
        max_cols=HEATMAP_COLUMNS,
        margins=Margins(right=1.45),
    )
    for ax, role in zip(axes, names, strict=True):
        mesh = ax.pcolormesh(
            np.arange(n_heads + 1) - 0.5,
            np.arange(n_layers + 1) - 0.5,
            np.ma.masked_invalid(_grid(values, role)),
            cmap=cmap,
            norm=norm,
        )
        layers, heads = np.nonzero(_grid(held, role))
        ax.scatter(heads, layers, s=12, facecolor="white", edgecolor="black", linewidth=0.6)
        ax.set_facecolor(NO_DATA)
        ax.set_title(role, fontsize=9, pad=3)
        ax.tick_params(labelsize=6, length=2)
    axes[0].set_xlim(-0.5, n_heads - 0.5)
    axes[0].set_ylim(n_layers - 0.5, -0.5)
    axes[0].set_xticks(range(n_heads))
    axes[0].set_yticks(range(n_layers))
    # The colour bar spans the panels' rows, 0.3 in right of the last column.
    width = fig.get_figwidth()
    top, bottom = axes[0].get_position().y1, axes[-1].get_position().y0
    cax = fig.add_axes((max(ax.get_position().x1 for ax in axes) + 0.3 / width, bottom, 0.15 / width, top - bottom))
    return fig, fig.colorbar(mesh, cax=cax, extend=extend)


def robust_log_norm(positive: np.ndarray) -> tuple[Normalize, Literal["neither", "min", "max", "both"]]:
    """A log colour norm over `COLOUR_PERCENTILES` of positive values, and the colour bar's
    `extend` for the values beyond it; a plain norm when they are all one value (or none)."""
    low, high = np.percentile(positive, COLOUR_PERCENTILES) if positive.size else (0.0, 0.0)
    if not low < high:
        return Normalize(), "neither"
    beyond = (bool(positive.min() < low), bool(positive.max() > high))
    extends: dict[tuple[bool, bool], Literal["neither", "min", "max", "both"]] = {
        (False, False): "neither",
        (True, False): "min",
        (False, True): "max",
        (True, True): "both",
    }
    return LogNorm(low, high), extends[beyond]


def plot_mean_heatmaps(
    roles: pd.DataFrame, task: str, tau: float, out_dir: Path, stem: str, *, about: str = ""
) -> list[Path]:
    """Mean β of every head, one panel per role, on one log colour scale with τ marked on it."""
    means = head_table(roles, task, "mean")
    finite = means.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    positive = finite[finite > 0]
    norm, extend = robust_log_norm(positive)
    if isinstance(norm, LogNorm):
        # β = 0 has no place on a log scale; show it as the scale's lowest colour, not as missing.
        means = means.clip(lower=positive.min())
    cmap = colormaps["viridis"].with_extremes(bad=NO_DATA)
    title = titled(f"{task}: mean sieve bias score per head", about) + "\n(dot: role held; grey: no score)"
    fig, colorbar = _heatmap_grid(means, held_table(roles, task), norm, cmap, extend, title)
    label = "mean β"
    if isinstance(norm, LogNorm):
        label += " (log scale"
        label += (
            f"; colours span the {COLOUR_PERCENTILES[0]:g}–{COLOUR_PERCENTILES[1]:g}th percentile)"
            if extend != "neither"
            else ")"
        )
        log_scale(colorbar.ax, "y")
        assert norm.vmin is not None and norm.vmax is not None  # robust_log_norm gave its LogNorm both
        if norm.vmin <= tau <= norm.vmax:
            colorbar.ax.axhline(tau, color="#d62728", linewidth=2)
            label += f"\nred line: τ = {tau:g}"
    colorbar.set_label(label, fontsize=9)
    return save_figure(fig, out_dir, stem)


def plot_p_heatmaps(
    roles: pd.DataFrame, task: str, alpha: float, out_dir: Path, stem: str, *, about: str = ""
) -> list[Path]:
    """−log10 p of every head, one panel per role, with the α threshold marked on the colour bar.

    Uses the adjusted p-values (the ones the assignment used) and says so when a correction
    changed them; they equal the raw ones otherwise.
    """
    raw = head_table(roles, task, "p_value")
    adjusted = head_table(roles, task, "p_adjusted")
    p = adjusted.where(adjusted.notna(), raw)
    corrected = not np.allclose(p.to_numpy(dtype=float), raw.to_numpy(dtype=float), equal_nan=True)
    # p can underflow to 0; the smallest float keeps its −log10 finite (≈ 323).
    score = -np.log10(p.clip(lower=np.finfo(float).tiny))
    threshold = -math.log10(alpha)
    finite = score.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    top = float(finite.max()) if finite.size else threshold
    vmax = max(2 * threshold, min(top, NEG_LOG10_P_CAP))
    which = "adjusted p" if corrected else "p"
    fig, colorbar = _heatmap_grid(
        score,
        held_table(roles, task),
        Normalize(0.0, vmax),
        colormaps["magma"].with_extremes(bad=NO_DATA),
        "max" if top > vmax else "neither",
        titled(f"{task}: −log10 {which} per head", about) + "\n(dot: role held; grey: untestable)",
    )
    colorbar.ax.axhline(threshold, color="#17becf", linewidth=2)
    colorbar.set_label(f"−log10 {which}\ncyan line: α = {alpha:g}", fontsize=9)
    return save_figure(fig, out_dir, stem)


def plot_local_vs_syntactic(
    roles: pd.DataFrame, task: str, out_dir: Path, stem: str, *, about: str = ""
) -> tuple[list[Path], Correlation | None]:
    """Mean local β against mean syntactic β per head, with Spearman's ρ and p in the title.

    Returns the paths and the correlation, or `([], None)` when the task lacks either role.
    """
    corr = local_syntactic_spearman(roles, task)
    if corr is None:
        return [], None
    means = head_table(roles, task, "mean")
    n_layers = means.index.levshape[0]
    local = means["local"].to_numpy(dtype=float)
    syntactic = means["syntactic"].to_numpy(dtype=float)

    fig = Figure(figsize=(6.0, 5.0), layout="constrained")
    ax = fig.add_subplot()
    points = ax.scatter(
        local,
        syntactic,
        c=means.index.get_level_values("layer"),
        cmap=colormaps["viridis"].resampled(n_layers),
        norm=BoundaryNorm(np.arange(n_layers + 1) - 0.5, n_layers),
        s=24,
        edgecolor="black",
        linewidth=0.3,
    )
    fig.colorbar(points, ax=ax, ticks=range(n_layers), label="layer")
    shown = np.concatenate([local, syntactic])
    if all_positive(shown[np.isfinite(shown)]):
        log_scale(ax, "x")
        log_scale(ax, "y")
    ax.set_xlabel("mean local β")
    ax.set_ylabel("mean syntactic β")
    ax.set_title(titled(f"{task}: Spearman ρ = {corr.rho:.3f}, p = {corr.p_value:.2g} ({corr.n_heads} heads)", about))
    return save_figure(fig, out_dir, stem), corr


def figure_jobs(
    roles: pd.DataFrame,
    scores: Mapping[tuple[str, str], np.ndarray],
    out_dir: Path,
    tau: float,
    alpha: float,
    coarse: Mapping[str, str] = DEFAULT_COARSE,
    kinds: Sequence[str] = ROLES_FIGURES,
    about: Mapping[str, str] | None = None,
) -> list[tuple]:
    """(function, arguments) of each figure of `kinds` for every task in `roles`, kind-major (the
    heaviest kinds first), stems prefixed with the task name; `about` gives each task's
    `about_line` under the titles."""
    jobs = []
    for kind in kinds:
        for task in pd.unique(roles["task"]):
            own = roles[roles["task"] == task]
            stem = f"{task}_{kind}"
            line = (about or {}).get(task, "")
            plots: dict[str, tuple[Callable[..., object], tuple]] = {
                "role_grid": (plot_role_grid, (own, task, out_dir, stem)),
                "coarse_overlap": (
                    functools.partial(plot_coarse_overlap, coarse=dict(coarse)),
                    (own, task, out_dir, stem),
                ),
                "score_distributions": (
                    plot_score_distributions,
                    (own, {k: v for k, v in scores.items() if k[0] == task}, task, tau, alpha, out_dir, stem),
                ),
                "mean_heatmaps": (plot_mean_heatmaps, (own, task, tau, out_dir, stem)),
                "p_heatmaps": (plot_p_heatmaps, (own, task, alpha, out_dir, stem)),
                "local_vs_syntactic": (_local_vs_syntactic_paths, (own, task, out_dir, stem)),
            }
            draw, args = plots[kind]
            jobs.append((functools.partial(draw, about=line) if line else draw, args))
    return jobs


def plot_all(
    roles: pd.DataFrame,
    scores: Mapping[tuple[str, str], np.ndarray],
    out_dir: Path,
    tau: float,
    alpha: float,
    coarse: Mapping[str, str] = DEFAULT_COARSE,
    workers: int | None = None,
    kinds: Sequence[str] = ROLES_FIGURES,
) -> list[Path]:
    """Every figure of `kinds` for every task in `roles`, stems prefixed with the task name, in the
    `figure_formats` in force, drawn by a `FigurePool` of `workers` processes (default:
    `pool_size` of the jobs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = figure_jobs(roles, scores, out_dir, tau, alpha, coarse, kinds)
    with FigurePool(pool_size(len(jobs)) if workers is None else workers) as pool:
        pool.submit(jobs)
        return pool.results()


def _local_vs_syntactic_paths(
    roles: pd.DataFrame, task: str, out_dir: Path, stem: str, *, about: str = ""
) -> list[Path]:
    return plot_local_vs_syntactic(roles, task, out_dir, stem, about=about)[0]
