"""The causal known answer: steering head roles during pre-training of the synthetic language, three
seeds, unsteered against prev and next suppressed and against [CLS] suppressed.

    .venv/bin/python docs/emergence_steering.py run      # trains and tracks what is missing (resumable)
    .venv/bin/python docs/emergence_steering.py table    # the page's table from the committed summary
    .venv/bin/python docs/emergence_steering.py run --size issue   # the issue's size (below)
    .venv/bin/python docs/emergence_steering.py plateau            # its unsteered run at lower learning rates

The recipe is docs/emergence.md's family member w64-4x4 (`configs/pretrain/synthetic.yaml`, the
language of 64 words, 4 layers × 4 heads, hidden 64, T = 32, batch 32, 1000 steps), with checkpoints
every 50 steps from 300 to 950 beside the recipe's log-spaced ones. The issue asked for hidden 128,
T = 64 and ~1400 steps (the emergence notes' size): measured here at 1.2 s a step on the shared 2
cores, nine runs of it would take over six hours, so this page runs the family's 4 × 4 size instead.
Per seed (`train.seed` 0, 1, 2; one language, one prepared data set and one held-out set for every
run, so that held-out sequences pair across runs):
- `plain`: unsteered;
- `positional`: `intervene=[{role: prev}, {role: next}]` (suppress, weight 1, every head, every step);
- `cls`: `intervene=[{role: cls}]`, the control.
Each run is tracked on 100 held-out sentence pairs at τ = 3 (`--roles prev,next,local,cls,sep,delimiter`)
over the steps from 251 on: the events' reference window starts on the loss's plateau, after its first
(unigram) descent, which the recipe's committed run ends by step 251 (held-out loss 5.47 at step 1,
3.78 at 63, 3.42 at 251, then the drop between 400 and 700).

The rule, fixed before any run (2026-11-28), and not changed after. The known answer **holds** when in
every seed:
- P1: the `positional` run ends with at most 1 positional head (prev, next or local assigned at the last
  step);
- P2: the `positional` run's final held-out MLM loss is higher than the `plain` run's: the 5–95%
  interval of the difference, from resampling the held-out sequences (paired: the same sequences and
  masks in both runs), lies above 0;
- C1: the `cls` run ends with at least 2 positional heads (they still form);
- C2: the `cls` run's loss drop is not delayed: the 5–95% interval of its held-out loss's 50% point
  (`curve_events.csv`, rise_50) does not lie entirely after the `plain` run's.
Reported beside the verdict: every run's loss changepoint and 10/50% points with their intervals, its
earliest positional (`local` group) head's 50% point (`lead_lag.csv`), its final loss and its heads.

The issue's size (`--size issue`), added 2026-11-28 once a step of it measured 0.4 s on these
cores (against the 1.2 s above, from an earlier session): the same language, rule and conditions at the
emergence notes' measurement, 4 layers × 4 heads, hidden 128, T = 64, batch 64, 1400 steps,
checkpoints every 50 steps from 200 to 1350. Its window starts at step 200, fixed before any run of
this size from what was known then: the notes' run has positional heads from step ~380 and 18.5% MLM
accuracy at step 400, and a step here sees four times the tokens of a w64-4x4 step, whose unigram
descent ended by step 251; so 200 is past the first descent and leaves four evaluations before the
notes' first positional head. Seeds run one after the other (plain, positional, cls), each seed's
rows committed when its three runs are done, so a session that ends mid-way keeps the seeds it
finished; the table reports the seeds run, and a seed missing is written as missing, not as held.
Beside each run's files this size commits its final held-out per-sequence sums (`heldout-sequences/`),
so that the paired difference can be recomputed from committed files.

`plateau`, written after seed 0 of the issue's size had run and before what follows was run: at
this size none of seed 0's three runs left the unigram plateau (held-out MLM accuracy 0.105 from
step 18 to 1400), so the experiment could not ask its question there. The recipe's learning rate,
2e-3, was set for hidden 64; `plateau` trains seed 0's unsteered run again at 1e-3 and at 5e-4,
everything else the issue size's (the same prepared data, no tracking), and commits each one's
`metrics.jsonl` under `lr-<rate>/`. The reading, fixed here: a rate **leaves the plateau** when its
held-out MLM accuracy at step 1400 exceeds its accuracy at step 200 by at least 0.05. It picks no
recipe by itself: a rate that leaves it would be the next issue-size experiment's, written on the
page before that experiment runs.

`--size issue-lr1e-3`, written after `plateau`'s 1e-3 run had reached step 1000 and before any run
of this set: the issue's size at learning rate 1e-3, everything else as `--size issue` (the same
window from step 200, checkpoints, conditions, seeds in order and rule P1, P2, C1, C2). 1e-3 is the
rate nearest the recipe's that left the plateau (its held-out MLM accuracy 0.105 at step 50, 0.176
at 200, 0.212 at 400, 0.665 at 600, 0.776 at 1000); 200 is still in its slow phase, after the first
descent (step 50) and before the drop (400 to 650). The `issue` set at 2e-3 was stopped after seed
1's unsteered run, which stayed on the plateau like seed 0's (`s1-plain/`, committed; not in the
summary, which holds whole seeds only).

`real` (written 2026-11-28, before any steered run of the set had trained; its unsteered seed 0 had,
on this CPU, as the seeds set's `mlm-s0`, whose first 100 steps the current code reproduces bit for
bit): reads issue 49's real-text set, `BERTJAX_SEEDS_SET=steering bash benchmarks/emergence_seeds.sh
run OUT` (the emergence recipe, MLM only, 8000 steps, seeds 0 and 1; unsteered, prev and next
suppressed on every head, [CLS] suppressed; every run scored on one held-out set and tracked on
MRPC, SST-2 and QNLI dev from step 1000, on the loss's plateau, as fixed with the set). `--from`
collects the set's tarballs (a device call's OUT) or run folders (a CPU's work folder) into
`docs/emergence/steering-real/`; the summary and the table come from the committed files alone.
Per seed and steered condition, the **drop shift**: the held-out MLM loss's 50% point over the
window, steered less unsteered, with the 5–95% interval over the 1000 resamples of the held-out
sequences, replicate b of both runs drawn with the same weights. The reading, fixed here: in a seed
the drop moves **later** when the interval lies above 0, **earlier** when below, and no shift is
detected otherwise; the page counts the seeds each way per condition, and states a direction for a
condition only when every seed run shows it. A seed's three runs train on one kind of device (the
table says which). Reported beside it: the final held-out loss against the unsteered run (paired, as
P2), the heads assigned prev, next or local on any task at step 8000, the loss changepoint, and
MRPC's earliest positional head's 50% point.
`real_role_attention`, added after the set had been read and descriptive only: each steered role's
β̄ (its bias) every run has left at step 8000 on MRPC.

The issue sizes' tables show each steered run's drop shift (as `real`'s, below) where the set's
lead/lag replicates are committed (kept from the `issue-lr1e-3` set on; added to its table after its
three seeds had run): reported beside the rule's checks, not one of them.

Outputs: `runs/emergence-steering[-SIZE]/` (not committed) and `docs/emergence/steering[-SIZE]/`
(committed; no suffix for w64-4x4): `summary.csv`, and per
run its track's `track.csv.gz`, `events.csv`, `curve_events.csv`, `curve_onsets.csv`,
`lead_lag.csv`, `run.json`, and the training's `metrics.jsonl` (the issue sizes also
`lead_lag_replicates.npz` and the final held-out per-sequence sums).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import emergence_family as family

from analysis.common.heldout import SEQUENCES_DIR
from analysis.heads import events

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = family.Member(64, 4, 4, 0)
SEEDS = (0, 1, 2)
INTERVENTIONS = {
    "plain": None,
    "positional": "[{role: prev, mode: suppress}, {role: next, mode: suppress}]",
    "cls": "[{role: cls, mode: suppress}]",
}
RESAMPLES = 1000
TRACK_FILES = ("events.csv", "curve_events.csv", "curve_onsets.csv", "lead_lag.csv", "run.json")


@dataclass(frozen=True)
class Size:
    """One model and schedule the experiment runs at, with where its files go."""

    name: str
    work: Path
    committed: Path
    steps: int
    from_step: int
    checkpoints: tuple[int, ...]
    seq_length: int
    overrides: tuple[str, ...]  # beyond the family's recipe and its layers and heads


ISSUE_SIZE = ("model.hidden_size=128", "model.max_position_embeddings=64", "data.max_seq_length=64",
              "train.global_batch_size=64")  # fmt: skip
SIZES = {
    "w64-4x4": Size(
        "w64-4x4", ROOT / "runs" / "emergence-steering", ROOT / "docs" / "emergence" / "steering",
        steps=1000, from_step=251, checkpoints=tuple(range(300, 1000, 50)), seq_length=32, overrides=(),
    ),
    "issue": Size(
        "issue", ROOT / "runs" / "emergence-steering-issue", ROOT / "docs" / "emergence" / "steering-issue",
        steps=1400, from_step=200, checkpoints=tuple(range(200, 1400, 50)), seq_length=64,
        overrides=ISSUE_SIZE,
    ),
    "issue-lr1e-3": Size(
        "issue-lr1e-3", ROOT / "runs" / "emergence-steering-issue-lr1e-3",
        ROOT / "docs" / "emergence" / "steering-issue-lr1e-3",
        steps=1400, from_step=200, checkpoints=tuple(range(200, 1400, 50)), seq_length=64,
        overrides=(*ISSUE_SIZE, "optimizer.learning_rate=1e-3"),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Run:
    seed: int
    condition: str

    @property
    def name(self) -> str:
        return f"s{self.seed}-{self.condition}"


RUNS = [Run(seed, condition) for seed in SEEDS for condition in INTERVENTIONS]


def recipe(size: Size, seed: int) -> list[str]:
    """The overrides of the family's recipe that make `size`'s model and data, for `seed`."""
    language = size.work / "language"
    return [
        f"data.corpora.0.path={language / 'train.txt'}",
        f"heldout.corpora.0.path={language / 'heldout.txt'}",
        f"data.vocab_size={family.VOCAB_SIZE[LANGUAGE.words]}",
        f"train.steps={size.steps}",
        f"train.seed={seed}",
        f"model.num_hidden_layers={LANGUAGE.layers}",
        f"model.num_attention_heads={LANGUAGE.heads}",
        *size.overrides,
    ]


def run_one(size: Size, run: Run) -> None:
    from analysis import track
    from bertjax import cli
    from train import pretrain, synthetic

    language = size.work / "language"
    if not (language / "pairs.txt").exists():
        synthetic.write(language, words=LANGUAGE.words, successors=2, tokens=300_000, seed=LANGUAGE.seed)
    root = size.work / run.name
    workdir, tracked = root / "run", root / "track"
    first = size.work / RUNS[0].name / "run"
    data, heldout = f"data-T{size.seq_length}", f"heldout-T{size.seq_length}"
    overrides = [*recipe(size, run.seed), f"checkpoint.steps=[{','.join(map(str, size.checkpoints))}]"]
    if run != RUNS[0]:
        # One prepared data set and one held-out set for every run: the held-out sequences pair.
        overrides.append(f"data_dir={first / data}")
        if not workdir.exists():
            workdir.mkdir(parents=True)
            shutil.copytree(first / heldout, workdir / heldout)
    if INTERVENTIONS[run.condition]:
        overrides.append(f"intervene={INTERVENTIONS[run.condition]}")
    if not (tracked / "events.csv").exists():
        cli.run(pretrain.main, ["--config", str(family.CONFIG), "--workdir", str(workdir), *overrides])
        steps = sorted({size.from_step, *size.checkpoints, size.steps})
        cli.run(track.main, ["--run", str(workdir), "--task", f"text:{language / 'pairs.txt'}", "--n", "100",
                             "--tau", str(family.TAU), "--roles", family.ROLES, "--steps", ",".join(map(str, steps)),
                             "--no-figures", "--out", str(tracked)])  # fmt: skip


PLATEAU_RATES = ("1e-3", "5e-4")
PLATEAU_MARGIN = 0.05


def run_plateau(size: Size) -> None:
    """Seed 0's unsteered run at each of `PLATEAU_RATES`, trained only; its metrics committed."""
    from bertjax import cli
    from train import pretrain

    first = size.work / RUNS[0].name / "run"
    for rate in PLATEAU_RATES:
        workdir = size.work / f"lr-{rate}"
        if not workdir.exists():
            workdir.mkdir(parents=True)
            shutil.copytree(first / f"heldout-T{size.seq_length}", workdir / f"heldout-T{size.seq_length}")
        overrides = [
            *recipe(size, 0),
            f"data_dir={first / f'data-T{size.seq_length}'}",
            f"optimizer.learning_rate={rate}",
            "checkpoint.steps=[]",
        ]
        metrics = workdir / "metrics.jsonl"
        if not metrics.exists() or size.steps not in family.heldout_curve(metrics, "heldout_mlm_loss"):
            cli.run(pretrain.main, ["--config", str(family.CONFIG), "--workdir", str(workdir), *overrides])
        out = size.committed / f"lr-{rate}"
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(workdir / "metrics.jsonl", out / "metrics.jsonl")


def plateau_table(size: Size) -> str:
    """Held-out MLM accuracy of seed 0's unsteered run by learning rate, the recipe's first."""
    runs = {"2e-3 (the recipe)": size.committed / "s0-plain", **{r: size.committed / f"lr-{r}" for r in PLATEAU_RATES}}
    steps = (200, 400, 800, size.steps)
    lines = [
        "| learning rate | " + " | ".join(f"accuracy at {s}" for s in steps) + " | loss at 1400 | leaves the plateau |",
        "| --- | " + " | ".join("---" for _ in steps) + " | --- | --- |",
    ]
    for name, folder in runs.items():
        accuracy = family.heldout_curve(folder / "metrics.jsonl", "heldout_mlm_accuracy")
        loss = family.heldout_curve(folder / "metrics.jsonl", "heldout_mlm_loss")[size.steps]
        leaves = accuracy[size.steps] - accuracy[200] >= PLATEAU_MARGIN
        lines.append(
            f"| {name} | "
            + " | ".join(f"{accuracy[s]:.3f}" for s in steps)
            + f" | {loss:.3f} | {'yes' if leaves else 'no'} |"
        )
    return "\n".join(lines)


def final_loss_difference(steered: Path, plain: Path, seed: int, last_step: int) -> tuple[float, float, float]:
    """The final held-out MLM loss of `steered` less `plain`'s, with the 5–95% interval of resampling
    the held-out sequences, one resample applied to both runs (the same sequences and masks)."""
    from analysis.common.heldout import read_heldout_sequences

    a, b = read_heldout_sequences(steered), read_heldout_sequences(plain)
    if a is None or b is None:
        raise SystemExit(f"{steered} or {plain} kept no held-out per-sequence sums: the difference has no interval")
    if a.masked.shape != b.masked.shape or not (a.masked == b.masked).all():
        raise SystemExit(f"{steered} and {plain} were not evaluated on the same held-out sequences")
    last = list(a.steps).index(last_step), list(b.steps).index(last_step)
    loss_a, loss_b, masked = a.loss[last[0]], b.loss[last[1]], a.masked.astype(np.float64)
    point = loss_a.sum() / masked.sum() - loss_b.sum() / masked.sum()
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(masked), size=(RESAMPLES, len(masked)))
    total = masked[draws].sum(axis=1)
    differences = loss_a[draws].sum(axis=1) / total - loss_b[draws].sum(axis=1) / total
    low, high = np.quantile(differences, [0.05, 0.95])
    return float(point), float(low), float(high)


def positional_heads_at_last(tracked: Path) -> int:
    """Heads assigned prev, next or local at the last tracked step, on any task tracked."""
    track = pd.read_csv(tracked / "track.csv" if (tracked / "track.csv").exists() else tracked / "track.csv.gz")
    last = track[(track["step"] == track["step"].max()) & track["role"].isin(family.POSITIONAL) & track["assigned"]]
    return last[["layer", "head"]].drop_duplicates().shape[0]


def summarize(size: Size, run: Run) -> dict:
    root = size.work / run.name
    plain = None if run.condition == "plain" else size.work / Run(run.seed, "plain").name / "run"
    return summarize_run(run, root / "track", root / "run", plain, size.steps)


def summarize_run(run: Run, tracked: Path, workdir: Path, plain: Path | None, last_step: int,
                  task: str | None = None) -> dict:  # fmt: skip
    """One run's row: its heads and held-out loss at `last_step`, the loss's events over the tracked
    window, the earliest positional head's 50% point on `task` (the first task tracked when None) and,
    for a steered run, its final loss against the unsteered run in `plain` (paired)."""
    curves = pd.read_csv(tracked / "curve_events.csv")
    loss_events = curves[curves["curve"] == "heldout_mlm_loss"].set_index("event")
    changepoint = pd.read_csv(tracked / "curve_onsets.csv").set_index("curve").loc["heldout_mlm_loss"]
    lead = pd.read_csv(tracked / "lead_lag.csv")
    local = lead[(lead["group"] == "local") & (lead["event"] == "rise_50")]
    if task is not None:
        local = local[local["task"] == task]
    row = {
        "run": run.name, "seed": run.seed, "condition": run.condition,
        "final_heldout_loss": round(family.heldout_curve(workdir / "metrics.jsonl", "heldout_mlm_loss")[last_step], 4),
        "positional_heads_at_last": positional_heads_at_last(tracked),
        "loss_changepoint": changepoint["changepoint_step"], "loss_changepoint_low": changepoint["changepoint_low"],
        "loss_changepoint_high": changepoint["changepoint_high"],
    }  # fmt: skip
    # How far the loss falls over the window: a run that barely falls still has a 50% point.
    row["loss_fall"] = round(loss_events.loc["rise_50", "early"] - loss_events.loc["rise_50", "final"], 4)
    for event in ("rise_10", "rise_50"):
        found = loss_events.loc[event]
        row |= {f"loss_{event}": found["step"], f"loss_{event}_low": found["low"], f"loss_{event}_high": found["high"]}
    first = local.iloc[0] if len(local) else None
    row |= {
        "local_heads": 0 if first is None else first["heads"],
        "local_rise_50": None if first is None else first["earliest_step"],
        "local_rise_50_low": None if first is None else first["earliest_low"],
        "local_rise_50_high": None if first is None else first["earliest_high"],
    }
    if plain is not None:
        point, low, high = final_loss_difference(workdir, plain, run.seed, last_step)
        row |= {
            "loss_vs_plain": round(point, 4),
            "loss_vs_plain_low": round(low, 4),
            "loss_vs_plain_high": round(high, 4),
        }
    return row


def verdicts(summary: pd.DataFrame) -> dict[int, list[str]]:
    """Per seed, the rule's checks that failed (empty: all held)."""
    out = {}
    for seed, rows in summary.groupby("seed"):
        by = rows.set_index("condition")
        failed = []
        if by.loc["positional", "positional_heads_at_last"] > 1:
            failed.append("P1")
        if not by.loc["positional", "loss_vs_plain_low"] > 0:
            failed.append("P2")
        if by.loc["cls", "positional_heads_at_last"] < 2:
            failed.append("C1")
        if by.loc["cls", "loss_rise_50_low"] > by.loc["plain", "loss_rise_50_high"]:
            failed.append("C2")
        out[int(seed)] = failed
    return out


def commit_outputs(size: Size, run: Run) -> None:
    out = size.committed / run.name
    out.mkdir(parents=True, exist_ok=True)
    root = size.work / run.name
    for name in TRACK_FILES:
        shutil.copyfile(root / "track" / name, out / name)
    with gzip.GzipFile(out / "track.csv.gz", "wb", mtime=0) as sink:
        sink.write((root / "track" / "track.csv").read_bytes())
    shutil.copyfile(root / "run" / "metrics.jsonl", out / "metrics.jsonl")
    if size.name != "w64-4x4":
        # The final held-out per-sequence sums and the loss events' replicates: the paired
        # differences (final loss, drop shift) from committed files alone.
        shutil.copyfile(root / "track" / events.LEAD_LAG_REPLICATES, out / events.LEAD_LAG_REPLICATES)
        final = Path(SEQUENCES_DIR) / f"step-{size.steps:09d}.npz"
        (out / SEQUENCES_DIR).mkdir(exist_ok=True)
        shutil.copyfile(root / "run" / final, out / final)


def _interval(point, low, high) -> str:
    if pd.isna(point):
        return "–"
    return f"{point:.0f} [{low:.0f}, {high:.0f}]" if not pd.isna(low) else f"{point:.0f}"


SHIFT_COLUMN = "drop shift vs unsteered (5–95%)"


def _shift_cell(shift: tuple[float, float, float] | None) -> str:
    return "–" if shift is None or pd.isna(shift[0]) else f"{shift[0]:+.0f} [{shift[1]:+.0f}, {shift[2]:+.0f}]"


def _run_cells(r: dict, shift: str | None) -> str:
    """One run's cells of a steering table: heads, final loss (and against unsteered), the loss's fall,
    changepoint and 50% point, the drop shift when the table has one, the earliest positional head."""
    versus = (
        "–"
        if pd.isna(r.get("loss_vs_plain"))
        else (f"{r['loss_vs_plain']:+.3f} [{r['loss_vs_plain_low']:+.3f}, {r['loss_vs_plain_high']:+.3f}]")
    )
    cells = [
        r["run"], str(r["positional_heads_at_last"]), f"{r['final_heldout_loss']:.3f}", versus, f"{r['loss_fall']:.3f}",
        _interval(r["loss_changepoint"], r["loss_changepoint_low"], r["loss_changepoint_high"]),
        _interval(r["loss_rise_50"], r["loss_rise_50_low"], r["loss_rise_50_high"]),
        *([] if shift is None else [shift]),
        _interval(r["local_rise_50"], r["local_rise_50_low"], r["local_rise_50_high"]),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def committed_shifts(summary: pd.DataFrame, committed: Path) -> dict[str, tuple[float, float, float]] | None:
    """Each steered run's drop shift from its committed lead/lag replicates, by run; None unless
    every steered run of the summary committed them (the sets run before they were kept)."""
    shifts = {}
    for r in summary[summary["condition"] != "plain"].to_dict("records"):
        steered, plain = committed / r["run"], committed / Run(int(r["seed"]), "plain").name
        if not all((folder / events.LEAD_LAG_REPLICATES).exists() for folder in (steered, plain)):
            return None
        shifts[r["run"]] = drop_shift(steered, plain)
    return shifts


def table(summary: pd.DataFrame, size: Size) -> str:
    """The page's table (one row per run) and the verdict line; with the drop shift beside the rule's
    checks (not one of them) where the set's replicates are committed."""
    shifts = committed_shifts(summary, size.committed)
    columns = [f"run | positional heads at {size.steps} | held-out loss at {size.steps} | vs unsteered (5–95%) "
               f"| loss fall from {size.from_step} | loss changepoint | loss 50% point",
               *([] if shifts is None else [SHIFT_COLUMN]), "earliest positional head's 50% point"]  # fmt: skip
    header = " | ".join(columns)
    lines = [f"| {header} |", "|" + " --- |" * (header.count(" | ") + 1)]
    for r in summary.to_dict("records"):
        lines.append(_run_cells(r, None if shifts is None else _shift_cell(shifts.get(r["run"]))))
    complete = summary.groupby("seed")["condition"].transform(lambda c: set(c) == set(INTERVENTIONS))
    failed = verdicts(summary[complete])
    held = [seed for seed, checks in failed.items() if not checks]
    missing = [seed for seed in SEEDS if seed not in failed]
    lines.append("")
    lines.append(
        f"**The known answer holds in {len(held)} of {len(failed)} seeds.**"
        + "".join(f" Seed {seed}: {', '.join(checks)} failed." for seed, checks in failed.items() if checks)
        + (f" Seeds not run to the end: {', '.join(map(str, missing))}." if missing else "")
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class RealSet:
    """The real-text set as benchmarks/emergence_seeds.sh runs it, and where its files are committed."""

    committed: Path
    steps: int = 8000
    from_step: int = 1000
    task: str = "mrpc"
    seeds: tuple[int, ...] = (0, 1)

    def runs(self) -> list[Run]:
        return [Run(seed, condition) for seed in self.seeds for condition in INTERVENTIONS]


REAL = RealSet(ROOT / "docs" / "emergence" / "steering-real")
REAL_TRACK_FILES = (*TRACK_FILES, events.LEAD_LAG_REPLICATES)


def _real_source(source: Path, run: Run) -> tuple[str, Path] | None:
    """Where benchmarks/emergence_seeds.sh's steering set left `run`: its tarball (a device call's
    OUT) or its run folder (a CPU's work folder); None when neither is there."""
    name = f"{run.condition}-s{run.seed}"
    for candidate in (source / f"{name}.tar.gz", source / name):
        if candidate.exists():
            return name, candidate
    return None


def collect_real(source: Path, real: RealSet = REAL) -> list[Run]:
    """Copies what the page reads of each run of the set found in `source` into `real.committed`,
    flat per run as the synthetic sets' (the training's run.json as train-run.json); the runs found."""
    import tarfile

    final = f"{SEQUENCES_DIR}/step-{real.steps:09d}.npz"
    wanted = {**{f"track/{n}": n for n in REAL_TRACK_FILES}, "track/track.csv": "track.csv",
              "metrics.jsonl": "metrics.jsonl", "config.yaml": "config.yaml", "run.json": "train-run.json",
              final: final}  # fmt: skip
    found = []
    for run in real.runs():
        located = _real_source(source, run)
        if located is None:
            continue
        name, path = located
        contents: dict[str, bytes] = {}
        if path.is_dir():
            contents = {
                kept: (path / member).read_bytes() for member, kept in wanted.items() if (path / member).exists()
            }
        else:
            with tarfile.open(path) as tar:
                members = set(tar.getnames())
                for member, kept in wanted.items():
                    if f"{name}/{member}" in members:
                        contents[kept] = tar.extractfile(f"{name}/{member}").read()  # type: ignore[union-attr]
        missing = sorted(set(wanted.values()) - set(contents))
        if missing:
            # A CPU's work folder holds the runs still training or tracking: read what has finished.
            print(f"{path}: no {', '.join(missing)}: not finished, skipped", file=sys.stderr)
            continue
        out = real.committed / run.name
        (out / SEQUENCES_DIR).mkdir(parents=True, exist_ok=True)
        track = contents.pop("track.csv")
        with gzip.GzipFile(out / "track.csv.gz", "wb", mtime=0) as sink:
            sink.write(track)
        for kept, data in contents.items():
            (out / kept).write_bytes(data)
        found.append(run)
    return found


def drop_shift(steered: Path, plain: Path) -> tuple[float, float, float]:
    """The held-out loss's 50% point (over the tracked window) of `steered` less `plain`'s: the
    point events' difference, and the 5–95% interval of the difference over the resamples of the
    held-out sequences, replicate b of both runs drawn with the same weights (the same held-out set,
    resampling seed and count: checked)."""
    tracks = [json.loads((folder / "run.json").read_text()) for folder in (steered, plain)]
    for key in ("onsets", "analysed_steps"):
        if tracks[0][key] != tracks[1][key]:
            raise SystemExit(f"{steered} and {plain} were tracked with different {key}: their resamples do not pair")
    (_, a), (_, b) = (
        events.load_lead_lag_replicates(folder / events.LEAD_LAG_REPLICATES) for folder in (steered, plain)
    )
    if a.replicates is None or b.replicates is None:
        raise SystemExit(f"{steered} or {plain} has no held-out replicates: the shift has no interval")
    at = events.EVENTS.index("rise_50")
    _, low, high = events.difference(a.replicates[:, at], b.replicates[:, at])
    return float(a.point[at] - b.point[at]), low, high


def summarize_real(real: RealSet = REAL) -> pd.DataFrame:
    """The set's rows from the committed files alone: each run as `summarize_run`, a steered run's
    with its drop shift against its seed's unsteered run."""
    rows = []
    for run in real.runs():
        folder = real.committed / run.name
        plain = real.committed / Run(run.seed, "plain").name
        if not folder.exists() or not plain.exists():
            continue
        row = summarize_run(run, folder, folder, None if run.condition == "plain" else plain, real.steps, real.task)
        if run.condition != "plain":
            shift = drop_shift(folder, plain)
            row |= dict(zip(("drop_shift", "drop_shift_low", "drop_shift_high"), np.round(shift), strict=True))
        row["device"] = json.loads((folder / "train-run.json").read_text())["devices"]["kind"]
        rows.append(row)
    return pd.DataFrame(rows)


ROLE_LABELS = {"prev": "prev", "next": "next", "cls": "[CLS]"}
SHIFT_WORDS = {"after": "later", "before": "earlier", "overlapping": "no shift detected"}


def _direction(words: list[str]) -> str:
    """The rule's reading across seeds: a direction only when every seed run shows it."""
    if len(set(words)) != 1:
        return "no direction across the seeds"
    if words[0] == SHIFT_WORDS["overlapping"]:
        return "no shift detected in any seed"
    return f"{words[0]} in every seed"


def real_table(summary: pd.DataFrame, real: RealSet = REAL) -> str:
    """The real-text set's table (one row per run) and its reading, by the rule in the docstring."""
    if summary.empty:
        return "No run of the real-text set has been collected."
    lines = [
        f"| run | positional heads at {real.steps} | held-out loss at {real.steps} | vs unsteered (5–95%) "
        f"| loss fall from {real.from_step} | loss changepoint | loss 50% point | {SHIFT_COLUMN} "
        f"| earliest {real.task.upper()} positional head's 50% point | device |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary.to_dict("records"):
        shift = None if pd.isna(r.get("drop_shift")) else (r["drop_shift"], r["drop_shift_low"], r["drop_shift_high"])
        lines.append(_run_cells(r, _shift_cell(shift))[:-1] + f"| {r['device']} |")
    complete = summary.groupby("seed")["condition"].transform(lambda c: set(c) == set(INTERVENTIONS))
    steered = summary[complete & (summary["condition"] != "plain")]
    seeds = sorted(summary.loc[complete, "seed"].unique())
    readings = [] if seeds else ["No seed has its three runs yet."]
    for condition, label in (
        (("positional", "Suppressing prev and next"), ("cls", "Suppressing [CLS]")) if seeds else ()
    ):
        rows = steered[steered["condition"] == condition]
        words = [] if rows.empty else [SHIFT_WORDS[events.relation_of_difference(low, high)]
                 for low, high in zip(rows["drop_shift_low"], rows["drop_shift_high"], strict=True)]  # fmt: skip
        counts = ", ".join(f"{word} in {words.count(word)}" for word in SHIFT_WORDS.values())
        readings.append(f"{label}: the drop {counts}, of {len(words)} seeds; {_direction(words)}.")
    missing = [seed for seed in real.seeds if seed not in seeds]
    lines += ["", "**" + " ".join(readings) + "**"
              + (f" Seeds not run to the end: {', '.join(map(str, missing))}." if missing else "")]  # fmt: skip
    return "\n".join(lines)


STEERED_ROLES = ("prev", "next", "cls")


def real_role_attention(real: RealSet = REAL) -> str:
    """Per run, how much of each steered role's bias is left at the last step on `real.task`:
    the mean over every head of the head's β̄ (track.csv's `mean`), and the largest. Descriptive,
    added after the set had been read; not part of its rule."""
    lines = [
        "| run | " + " | ".join(f"{ROLE_LABELS[role]} β̄ at {real.steps}: mean over heads (largest)" for role in STEERED_ROLES) + " |",
        "| --- |" + " --- |" * len(STEERED_ROLES),
    ]  # fmt: skip
    for run in real.runs():
        path = real.committed / run.name / "track.csv.gz"
        if not path.exists():
            continue
        track = pd.read_csv(path)
        last = track[(track["step"] == real.steps) & (track["task"] == real.task)]
        cells = [last.loc[last["role"] == role, "mean"].agg(["mean", "max"]) for role in STEERED_ROLES]
        lines.append(f"| {run.name} | " + " | ".join(f"{c['mean']:.2f} ({c['max']:.2f})" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "table", "plateau", "real"])
    parser.add_argument("--size", choices=sorted(SIZES), default="w64-4x4")
    parser.add_argument("--from", dest="source", type=Path,
                        help="real: the steering set's outputs (tarballs or run folders) to collect first")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "real":
        if args.source is not None:
            if not args.source.is_dir():
                raise SystemExit(f"error: {args.source} is not a folder of the steering set's outputs")
            found = collect_real(args.source)
            print(f"collected {', '.join(run.name for run in found) or 'no run'} from {args.source}", file=sys.stderr)
        summary = summarize_real()
        if not summary.empty:
            summary.to_csv(REAL.committed / "summary.csv", index=False)
        print(real_table(summary))
        return
    size = SIZES[args.size]
    summary_path = size.committed / "summary.csv"
    if args.command == "plateau":
        run_plateau(SIZES["issue"])
        print(plateau_table(SIZES["issue"]))
        return
    if args.command == "table":
        print(table(pd.read_csv(summary_path), size))
        return
    # Rows committed by an earlier session stand; a seed is rerun whole when any of its runs is missing,
    # since its steered rows pair with its unsteered run's held-out sequences.
    done = {r["run"]: r for r in pd.read_csv(summary_path).to_dict("records")} if summary_path.exists() else {}
    rows = []
    for seed in SEEDS:
        runs = [run for run in RUNS if run.seed == seed]
        if all(run.name in done for run in runs):
            rows += [done[run.name] for run in runs]
            continue
        if seed != RUNS[0].seed:
            run_one(size, RUNS[0])  # the shared prepared data live in the first run's folder
        for run in runs:
            run_one(size, run)
            rows.append(summarize(size, run))
            commit_outputs(size, run)
            print(f"{run.name}: {rows[-1]}", file=sys.stderr, flush=True)
        size.committed.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(summary_path, index=False)


if __name__ == "__main__":
    main()
