"""The changepoint of each committed run's held-out curves (docs/tracking.md, "Onsets with intervals").

    python docs/emergence_changepoints.py

Reads docs/emergence/<run>/metrics.jsonl and prints, per run and curve, the rule's changepoint, its
90% interval (1000 wild-bootstrap replicates, seed 0) and every segment of the fit.
"""

from __future__ import annotations

from pathlib import Path

from analysis.heads import onset

RUNS = Path(__file__).resolve().parent / "emergence"


def main() -> None:
    print("| run | curve | evaluations | changepoint | 90% interval | segments (first step: slope per e-fold) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run in sorted(p for p in RUNS.iterdir() if (p / "metrics.jsonl").is_file()):
        heldout = onset.read_heldout(run)
        if heldout is None:
            continue
        for curve, falling in ((onset.LOSS_CURVE, True), (onset.ACCURACY_CURVE, False)):
            values = heldout[curve].dropna()
            row = onset.curve_row(curve, "", values.index.to_numpy(), values.to_numpy(), falling, 1000, 0)
            print(f"| {run.name} | {curve} | {row['points']} | {row['changepoint_step']} | "
                  f"{row['changepoint_low']}–{row['changepoint_high']} | {row['fit']} |")  # fmt: skip


if __name__ == "__main__":
    main()
