"""docs/tracking.md's figure of event times: a planted head's mean score and a planted held-out loss
over log-spaced steps, each from 200 sequences with a per-sequence scale shared across steps and noise of their own, their
10/50/90% points and rise start with the 90% intervals of 1000 paired resamples, and the lead/lag
of the 50% points from jointly drawn replicates.

    python docs/events_figure.py     # writes docs/events.png

Everything drawn is computed by `analysis.heads.events` on the planted data (seeded).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from analysis.heads import events
from sieves import stats

OUT = Path(__file__).resolve().parent / "events.png"
STEPS = np.unique(np.round(np.geomspace(1, 8000, 30)).astype(int))
SEQUENCES, REPLICATES = 200, 1000


def planted(rng, mean):
    scale = 1 + 0.35 * rng.standard_normal((SEQUENCES, 1))
    return mean[None, :] * scale + 4.0 * rng.standard_normal((SEQUENCES, mean.size))


def main() -> None:
    rng = np.random.default_rng(0)
    x = events.log_steps(STEPS)
    head = planted(rng, 1 + 11 / (1 + np.exp(-(x - 6.4) / 0.45)))
    loss = planted(rng, 4 + 5 / (1 + np.exp((x - 7.0) / 0.4)))
    rows = {"head": head, "held-out loss": loss}
    fig = Figure(figsize=(7.2, 4.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    found = {}
    for ax, (name, scores), falling, colour in zip(
        axes, rows.items(), (False, True), ("#1f77b4", "black"), strict=True
    ):
        weights = stats.resample_weights(SEQUENCES, REPLICATES, rng)
        means = scores.mean(axis=0)
        reps = weights @ scores / SEQUENCES
        point = events.event_positions(x, means, falling)
        rep_events = events.event_positions(x, reps, falling)
        low, high, _ = events.quantile_interval(rep_events)
        found[name] = rep_events
        ax.plot(STEPS, means, color=colour, marker="o", markersize=2.5, linewidth=1)
        level = means.min() - 0.08 * np.ptp(means) if not falling else means.max() + 0.08 * np.ptp(means)
        for i, event in enumerate(events.EVENTS):
            y = level + (i - 1.5) * 0.06 * np.ptp(means) * (-1 if falling else 1)
            ax.plot(events.to_steps([low[i], high[i]]), [y, y], color="#ff7f0e", linewidth=2.2, solid_capstyle="butt")
            ax.plot(events.to_steps(point[i]), y, marker="|", color="black", markersize=8)
            ax.annotate(event, (events.to_steps(high[i]), y), xytext=(4, -3), textcoords="offset points", fontsize=7)
        ax.set_ylabel("mean β" if name == "head" else "held-out MLM loss")
        ax.set_xscale("log")
    median, d_low, d_high = events.difference(events.to_steps(found["head"][:, 2]),
                                              events.to_steps(found["held-out loss"][:, 2]))  # fmt: skip
    relation = events.relation_of_difference(d_low, d_high)
    axes[0].set_title(
        "event times with 90% intervals (orange; | the point), planted data, 200 sequences, 1000 paired resamples\n"
        f"head's rise_50 − loss's rise_50: median {median:+.0f} steps, 90% [{d_low:+.0f}, {d_high:+.0f}]: {relation}",
        fontsize=8,
    )
    axes[-1].set_xlabel("step (log)")
    fig.savefig(OUT, dpi=130)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
