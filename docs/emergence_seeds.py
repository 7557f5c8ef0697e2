"""Every table and number of docs/emergence.md's seeds section, from the committed runs alone.

    python docs/emergence_seeds.py            # prints the section's tables (markdown)
    python docs/emergence_seeds.py --write    # also writes seeds_onsets.csv and the figures

Reads docs/emergence/seeds/<run>/ (metrics.jsonl, run.json, track/: track.csv.gz, onset.csv,
curve_onsets.csv, sas.csv, run.json), written by `bash benchmarks/emergence_seeds.sh run` on a GPU
(the pre-LN set on a CPU, its seeds one after another).
tests/test_docs_emergence.py checks that the page holds exactly what this prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from analysis.heads import onset, seeds

SEEDS = Path(__file__).resolve().parent / "emergence" / "seeds"
RECIPES = {
    "MLM only": ["mlm-s0", "mlm-s1", "mlm-s2"],
    "MLM + NSP": ["nsp-s0", "nsp-s1"],
    "MLM only, pre-LN": ["preln-s0", "preln-s1"],
}
# Each recipe's file stem: <key>_seeds_onsets.csv, <key>_mrpc_seeds.png.
RECIPE_KEYS = {"MLM only": "mlm", "MLM + NSP": "nsp", "MLM only, pre-LN": "preln"}
ROLES = ["local", "prev", "next", "cls", "nsubj", "dobj", "syntactic"]
TASKS = ["mrpc", "sst2", "qnli"]


def _step(value) -> str:
    return "–" if pd.isna(value) else str(int(value))


def _interval(row, prefix: str) -> str:
    return f"{_step(row[f'{prefix}_step'])} [{_step(row[f'{prefix}_low'])}–{_step(row[f'{prefix}_high'])}]"


def training_segments(name: str) -> list[dict]:
    """The run.json of each stretch of a run's training, in order: a run stopped by its time limit
    and resumed keeps the stopped stretch's as `run-<step>.json` (the resumed one rewrites run.json)."""
    directory = SEEDS / name
    stopped = sorted(directory.glob("run-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [json.loads(p.read_text()) for p in [*stopped, directory / "run.json"]]


def training_seconds(name: str) -> float:
    return sum(r["timings_s"]["total_s"] for r in training_segments(name))


def device(name: str) -> str:
    """What trained the run: the accelerator's name, or "CPU"."""
    kinds = {r["devices"]["kind"] for r in training_segments(name)}
    assert len(kinds) == 1, f"{name} trained on {kinds}"
    (kind,) = kinds
    return "CPU" if kind == "cpu" else kind


def _cached(track_info: dict) -> str:
    """A track that read some steps' scores from its cache (a tracking stopped and run again) took
    less time than a whole one: said next to its time."""
    cached = len(track_info["cached_steps"])
    return f" ({cached} of {len(track_info['steps'])} steps from the cache)" if cached else ""


def runs_table() -> str:
    lines = ["| run | held-out loss changepoint [90%] | accuracy changepoint | SAS changepoint, its slope per e-fold | SAS vs loss | "
             "loss at 8000 | SAS at 8000 (best offset) | tests | device | training, track wall time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for names in RECIPES.values():
        for name in names:
            curves = pd.read_csv(SEEDS / name / "track" / onset.CURVE_ONSETS_CSV).set_index("curve")
            sas = pd.read_csv(SEEDS / name / "track" / "sas.csv")
            last = sas[(sas["relation"] == "all") & (sas["step"] == sas["step"].max())].iloc[0]
            heldout = onset.read_heldout(SEEDS / name)
            info = json.loads((SEEDS / name / "track" / "run.json").read_text())
            lines.append(
                f"| {name} | {_interval(curves.loc[onset.LOSS_CURVE], 'changepoint')} | "
                f"{_interval(curves.loc[onset.ACCURACY_CURVE], 'changepoint')} | "
                f"{_interval(curves.loc[onset.SAS_CURVE], 'changepoint')}, "
                f"{curves.loc[onset.SAS_CURVE, 'slope_per_efold']:+.3f} | {curves.loc[onset.SAS_CURVE, 'vs_loss']} | "
                f"{heldout[onset.LOSS_CURVE].iloc[-1]:.3f} | {last['uas']:.3f} ({last['baseline_uas']:.3f}) | "
                f"{info['tests']['count']} | {device(name)} | {training_seconds(name):.0f} s, "
                f"{info['timings_s']['total']:.0f} s{_cached(info)} |"
            )
    return "\n".join(lines)


def summaries() -> dict[str, pd.DataFrame]:
    return {recipe: seeds.summarize({n: SEEDS / n / "track" for n in names})[0] for recipe, names in RECIPES.items()}


def onsets_table(tables: dict[str, pd.DataFrame]) -> str:
    """Per task and role: the earliest onset's median [range] over seeds and, per seed, where its
    interval lies against that seed's loss changepoint interval (b/o/a: before, overlapping, after)."""
    head = "| task | role | " + " | ".join(f"{r}: earliest onset, median [range] | {r}: b / o / a" for r in RECIPES)
    lines = [head + " |", "| --- | --- |" + " --- | --- |" * len(RECIPES)]
    for task in TASKS:
        for role in ROLES:
            cells = []
            for recipe in RECIPES:
                table = tables[recipe]
                row = table[(table["seed"] == "all") & (table["task"] == task) & (table["role"] == role)].iloc[0]
                with_onset = int(row["seeds_with_onset"])
                text = "none" if not with_onset else (
                    f"{_step(row['earliest_onset_median'])} [{_step(row['earliest_onset_min'])}–"
                    f"{_step(row['earliest_onset_max'])}]")  # fmt: skip
                if with_onset < row["seeds"]:
                    text += f" ({with_onset} of {int(row['seeds'])} seeds)"
                cells += [
                    text,
                    f"{int(row['before_loss'])} / {int(row['overlapping_loss'])} / {int(row['after_loss'])}",
                ]
            lines.append(f"| {task} | {role} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(tables: dict[str, pd.DataFrame]) -> None:
    for recipe, names in RECIPES.items():
        key = RECIPE_KEYS[recipe]
        tables[recipe].to_csv(SEEDS / f"{key}_seeds_onsets.csv", index=False)
        tracks = {n: seeds.read_track(SEEDS / n / "track")[0] for n in names}
        seeds.plot_seeds(tracks, "mrpc", SEEDS, f"{key}_mrpc_seeds")


def main(argv: list[str]) -> None:
    tables = summaries()
    print(runs_table())
    print()
    print(onsets_table(tables))
    if "--write" in argv:
        write(tables)


if __name__ == "__main__":
    main(sys.argv[1:])
