"""Every number of docs/emergence.md, from committed files: the page's generated blocks.

    python docs/emergence_page.py            # rewrites the blocks of docs/emergence.md
    python docs/emergence_page.py --check    # exits 1 naming the blocks where the page differs

A block is the text between `<!-- NAME -->` and `<!-- /NAME -->`; each is made by one function below
from the files committed under docs/emergence/ (the lengths also read the staged GLUE dev sets:
`$BERTJAX_DATA/glue`). The prose outside the blocks states no measured number: it says what the
blocks show. tests/test_docs_emergence.py runs the check on every block.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import emergence_events
import emergence_family
import emergence_lengths
import emergence_seeds
import emergence_steering

from analysis.heads import onset, seeds
from sieves import stats

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "emergence.md"
RUNS = DOCS / "emergence"
POSITIONAL = ["local", "prev", "next"]
SYNTACTIC = ["nsubj", "dobj", "syntactic"]
# The single-seed CPU runs of 2026-11 (before the seeds): what each one changed.
HISTORY = {"real": "MLM only, post-LN", "real-pre-ln": "MLM only, pre-LN, sinusoidal", "real-nsp": "MLM + NSP, post-LN"}
HISTORY_STEPS = [1, 121, 400, 728, 1326, 2414, 4394, 8000]
HISTORY_ROLES = ["local", "prev", "next", "cls", "delimiter"]


@functools.cache
def seed_track(name: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(track, onsets, curves) of one committed seed, read once for every block (not modified)."""
    return seeds.read_track(emergence_seeds.SEEDS / name / "track")


@functools.cache
def seed_summaries() -> dict[str, pd.DataFrame]:
    return emergence_seeds.summaries()


def _range(values) -> str:
    values = [round(v) for v in values]
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}–{high}"


def _seed_rows(tables: dict[str, pd.DataFrame], recipe: str) -> pd.DataFrame:
    table = tables[recipe]
    return table[table["seed"] != "all"]


def earliest_of(tables: dict[str, pd.DataFrame], recipe: str, tasks: list[str], roles: list[str]) -> pd.DataFrame:
    """Per seed: the earliest onset over `tasks` × `roles`, and where it lies against the loss."""
    rows = _seed_rows(tables, recipe)
    rows = rows[rows["task"].isin(tasks) & rows["role"].isin(roles) & rows["earliest_onset"].notna()]
    return rows.sort_values("earliest_onset").groupby("seed", sort=True).head(1).set_index("seed")


def _bao(frame: pd.DataFrame) -> str:
    counts = frame["vs_loss"].value_counts()
    return " / ".join(str(int(counts.get(k, 0))) for k in ("before", "overlapping", "after"))


def _curves(recipe: str) -> pd.DataFrame:
    rows = []
    for name in emergence_seeds.RECIPES[recipe]:
        curves = pd.read_csv(emergence_seeds.SEEDS / name / "track" / onset.CURVE_ONSETS_CSV).set_index("curve")
        rows.append(curves.assign(run=name))
    return pd.concat(rows)


def headline() -> str:
    """The result, stated first: across seeds, per recipe."""
    tables = seed_summaries()
    parts = []
    for recipe, names in emergence_seeds.RECIPES.items():
        curves = _curves(recipe)
        loss, sas = curves.loc[onset.LOSS_CURVE], curves.loc[onset.SAS_CURVE]
        mrpc = earliest_of(tables, recipe, ["mrpc"], POSITIONAL + SYNTACTIC)
        pairs = earliest_of(tables, recipe, ["mrpc", "qnli"], POSITIONAL + SYNTACTIC)
        sst2 = earliest_of(tables, recipe, ["sst2"], POSITIONAL + SYNTACTIC)
        cls = _seed_rows(tables, recipe)
        cls = cls[(cls["task"] == "mrpc") & (cls["role"] == "cls")]
        parts.append(
            f"- **{recipe}** ({len(names)} seeds): loss changepoint {_range(loss['changepoint_step'])} (90% intervals "
            f"within {_range([loss['changepoint_low'].min(), loss['changepoint_high'].max()])}); SAS changepoint "
            f"{_range(sas['changepoint_step'])} (b / o / a the loss's {_bao(sas)}); the earliest positional or "
            "syntactic head on MRPC at "
            f"{_range(mrpc['earliest_onset'])} (b / o / a {_bao(mrpc)}), on MRPC or QNLI at "
            f"{_range(pairs['earliest_onset'])} (b / o / a {_bao(pairs)}), on SST-2 at "
            f"{_range(sst2['earliest_onset'])} (b / o / a {_bao(sst2)}); an MRPC [CLS] head in "
            f"{int(cls['earliest_onset'].notna().sum())} of {len(names)} seeds"
            + (f" (onsets {_range(cls['earliest_onset'].dropna())})" if cls["earliest_onset"].notna().any() else "")
            + "."
        )
    sas_margin = []
    for names in emergence_seeds.RECIPES.values():
        for name in names:
            table = pd.read_csv(emergence_seeds.SEEDS / name / "track" / "sas.csv")
            last = table[(table["relation"] == "all") & (table["step"] == table["step"].max())].iloc[0]
            sas_margin.append(last["uas"] - last["baseline_uas"])
    parts.append(
        f"- The SAS at the last step is {min(sas_margin):.3f}–{max(sas_margin):.3f} above the best fixed-offset "
        "baseline at this size."
    )
    return "\n".join(parts)


# Each contrast: (the baseline recipe, the changed one); differences are changed − baseline.
CONTRASTS = [("MLM only", "MLM + NSP"), ("MLM only", "MLM only, pre-LN")]
CONTRAST_CURVES = {onset.LOSS_CURVE: "held-out loss changepoint", onset.ACCURACY_CURVE: "accuracy changepoint",
                   onset.SAS_CURVE: "SAS changepoint"}  # fmt: skip
CONTRAST_ONSETS = [("first positional head, MRPC", ["mrpc"], POSITIONAL), ("first positional head, SST-2", ["sst2"],
                   POSITIONAL), ("first syntactic head, MRPC", ["mrpc"], SYNTACTIC), ("first [CLS] head, MRPC",
                   ["mrpc"], ["cls"])]  # fmt: skip


def _seed_intervals(recipe: str, quantity: str) -> pd.DataFrame:
    """One row per seed of `recipe`: the quantity's step and interval (NA where the seed has none);
    an onset's interval starts at the analysed step before its low end, as against the loss."""
    names = emergence_seeds.RECIPES[recipe]
    if quantity in CONTRAST_CURVES:
        rows = _curves(recipe).loc[quantity].set_index("run")
        frame = rows[["changepoint_step", "changepoint_low", "changepoint_high"]]
        return frame.set_axis(["step", "low", "high"], axis=1).reindex(names).astype(float)
    _, tasks, roles = next(c for c in CONTRAST_ONSETS if c[0] == quantity)
    first = earliest_of(seed_summaries(), recipe, tasks, roles)
    rows = []
    for name in names:
        if name not in first.index:
            rows.append((np.nan, np.nan, np.nan))
            continue
        steps = sorted(pd.unique(seed_track(name)[0]["step"]))
        row = first.loc[name]
        rows.append((row["earliest_onset"], onset.step_before(row["earliest_onset_low"], steps),
                     row["earliest_onset_high"]))  # fmt: skip
    return pd.DataFrame(rows, index=names, columns=["step", "low", "high"], dtype=float)


def contrasts() -> str:
    """Recipe against recipe across seeds: every pair of seeds, the changed recipe's step minus the
    baseline's, and whether its interval lies after, overlaps or lies before the baseline's."""
    lines = ["| contrast | quantity | seeds with it | difference in steps, median [range] over seed pairs | "
             "pairs later / overlapping / earlier |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for baseline, changed in CONTRASTS:
        for quantity in [*CONTRAST_CURVES, *(c[0] for c in CONTRAST_ONSETS)]:
            got = seeds.contrast(_seed_intervals(baseline, quantity), _seed_intervals(changed, quantity))
            counts = (f"{got['seeds_first']} of {len(emergence_seeds.RECIPES[baseline])}, "
                      f"{got['seeds_second']} of {len(emergence_seeds.RECIPES[changed])}")  # fmt: skip
            difference = (
                "–"
                if not got["pairs"]
                else (f"{got['difference_median']:+.0f} [{got['difference_min']:+.0f}, {got['difference_max']:+.0f}]")
            )
            lines.append(
                f"| {changed} − {baseline} | {CONTRAST_CURVES.get(quantity, quantity)} | {counts} | {difference} | "
                f"{got['after']} / {got['overlapping']} / {got['before']} of {got['pairs']} |"
            )
    return "\n".join(lines)


def cls_heads() -> str:
    """Per seed: the MRPC heads holding the [CLS] role at their most and at the last step (an onset
    needs the role held to the end, so the plateau's passing [CLS] heads have none)."""
    lines = ["| recipe | run | most heads holding [CLS] (step) | at the last step | last step with one |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for recipe, names in emergence_seeds.RECIPES.items():
        for name in names:
            held = onset.heads_holding(seed_track(name)[0], "mrpc")["cls"]
            holding = held.index[held > 0]
            last = "–" if holding.empty else str(int(holding.max()))
            lines.append(
                f"| {recipe} | {name} | {int(held.max())} ({int(held.idxmax())}) | {int(held.iloc[-1])} | {last} |"
            )
    return "\n".join(lines)


def seeds_data() -> str:
    """What the seeds read and how long they trained (the prepared data's meta.json, each run.json)."""
    counts = {
        k: json.loads((emergence_seeds.SEEDS / f"data-{k}-meta.json").read_text())["counts"] for k in ("mlm", "nsp")
    }
    names = [n for ns in emergence_seeds.RECIPES.values() for n in ns]
    runs = [json.loads((emergence_seeds.SEEDS / n / "run.json").read_text()) for n in names]
    steps = {r["config"]["train"]["steps"] for r in runs}
    batch = {r["config"]["train"]["global_batch_size"] for r in runs}
    assert len(steps) == len(batch) == 1, "the seeds share one schedule"
    (steps,), (batch,) = steps, batch
    passes = {k: steps * batch / c["instances"] for k, c in counts.items()}
    by_device: dict[str, list[float]] = {}
    jax_versions: dict[str, set[str]] = {}
    for name, run in zip(names, runs, strict=True):
        by_device.setdefault(emergence_seeds.device(name), []).append(emergence_seeds.training_seconds(name))
        jax_versions.setdefault(emergence_seeds.device(name), set()).add(run["versions"]["jax"])
    took = "; ".join(f"{_range(t)} s each on the {d}, {len(t)} runs" if len(t) > 1 else f"{t[0]:.0f} s on the {d}"
                     for d, t in by_device.items())  # fmt: skip
    versions = ", ".join(f"{' and '.join(sorted(v))} on the {d}" for d, v in jax_versions.items())
    return (
        f"Each run read the recipe's first {counts['mlm']['documents']:,} documents "
        f"({counts['mlm']['tokens'] / 1e6:.1f} M tokens; {counts['mlm']['instances']:,} instances MLM only and "
        f"{counts['nsp']['instances']:,} with NSP: {passes['mlm']:.1f} and {passes['nsp']:.1f} passes in {steps} steps "
        f"of {batch}; `seeds/data-mlm-meta.json`, `seeds/data-nsp-meta.json`). The trainings took {took} "
        "(`timings_s.total_s` of each run's `run.json`, summed over a resumed run's stretches), with jax "
        f"{versions} (`versions.jax`)."
    )


def convention_change() -> str:
    """How many rows of the onsets table the window convention moved: an onset's window compared as
    [its interval's low end, high end] (the first reading) against (the step before it, high end]."""
    changed = []
    for task in emergence_seeds.TASKS:
        for role in emergence_seeds.ROLES:
            for names in emergence_seeds.RECIPES.values():
                counts = {"first": [], "now": []}
                for name in names:
                    track, onsets, curves = seed_track(name)
                    steps = sorted(pd.unique(track["step"]))
                    ref = curves[curves["curve"] == onset.REFERENCE_CURVE].iloc[0]
                    held = onsets[(onsets["task"] == task) & (onsets["role"] == role) & (onsets["status"] == "onset")]
                    if held.empty:
                        continue
                    first = held.sort_values(["onset_step", "onset_low"]).iloc[0]
                    bounds = (ref["changepoint_low"], ref["changepoint_high"])
                    counts["first"].append(onset.relation(first["onset_low"], first["onset_high"], *bounds))
                    counts["now"].append(
                        onset.relation(onset.step_before(first["onset_low"], steps), first["onset_high"], *bounds)
                    )
                if sorted(counts["first"]) != sorted(counts["now"]):
                    changed.append(f"{task} {role}")
                    break
    rows = len(emergence_seeds.TASKS) * len(emergence_seeds.ROLES)
    return (
        f"This convention was aligned with the changepoint's after the seeds were first read; it moves "
        f'{len(changed)} of the {rows} rows below ({", ".join(changed)}) toward "overlapping".'
    )


def series_corrected(method: str = "holm") -> str:
    """Point onsets when every test of a run is one family (`--correction holm --correction-scope
    series`), from each seed's committed p-values; the intervals would need the paired replicates,
    which only the scores cache holds, so an onset's window here is (the step before it, it]."""
    lines = ["| task | role | " + " | ".join(f"{r}: uncorrected | {r}: Holm over the series" for r in emergence_seeds.RECIPES)
             + " |", "| --- | --- |" + " --- | --- |" * len(emergence_seeds.RECIPES)]  # fmt: skip
    cells: dict[tuple[str, str], list[str]] = {}
    for names in emergence_seeds.RECIPES.values():
        tables = {"none": [], method: []}
        for name in names:
            directory = emergence_seeds.SEEDS / name / "track"
            track, _, curves = seed_track(name)
            alpha = json.loads((directory / "run.json").read_text())["tests"]["alpha"]
            for correction in tables:
                adjusted = stats.adjust_pvalues(track["p_value"].to_numpy(), correction)
                decided = track.assign(assigned=stats.assign(adjusted, alpha))
                onsets = onset.role_onsets(decided)
                onsets = onsets.assign(onset_low=onsets["onset_step"], onset_high=onsets["onset_step"])
                tables[correction].append(seeds.per_seed(name, decided, onsets, curves))
        for per_seed in tables.values():
            table = pd.concat(per_seed)
            for (task, role), part in table.groupby(["task", "role"], sort=False):
                found = part["earliest_onset"].dropna()
                text = "none" if found.empty else f"{_range(found)} ({_bao(part)})"
                cells.setdefault((task, role), []).append(text)
    for task in emergence_seeds.TASKS:
        for role in emergence_seeds.ROLES:
            lines.append(f"| {task} | {role} | " + " | ".join(cells[(task, role)]) + " |")
    return "\n".join(lines)


def family() -> str:
    return emergence_family.table(pd.read_csv(emergence_family.COMMITTED / "summary.csv"))


def family_verdict() -> str:
    """How many members held, which did not and why, and what the planted twin did."""
    summary = pd.read_csv(emergence_family.COMMITTED / "summary.csv").fillna({"known_answer_failures": ""})
    members, twins = summary[~summary["planted"]], summary[summary["planted"]]
    held = members[members["holds"]]
    text = f"**{len(held)} of {len(members)} members hold.**"
    failed = []
    for r in members[~members["holds"]].to_dict("records"):
        why = r["known_answer_failures"] or (
            f"its earliest positional onset is {r['vs_loss']} the loss changepoint" if isinstance(r["vs_loss"], str)
            else "no positional onset")  # fmt: skip
        failed.append(f"{r['member']} ({why})")
    if failed:
        text += " Not holding: " + "; ".join(failed) + "."
    for r in twins.to_dict("records"):
        text += (f" The planted twin {r['member']} " + ("holds: the check is not evidence." if r["holds"] else
                 f"does not hold ({r['known_answer_failures'] or 'no overlapping onset'}), as it must."))  # fmt: skip
    return text


def history_heldout() -> str:
    """Held-out MLM loss / accuracy of the single-seed CPU runs at their common checkpoints."""
    heldout = {name: onset.read_heldout(RUNS / name) for name in HISTORY}
    lines = ["| step | " + " | ".join(HISTORY.values()) + " |", "| --- |" + " --- |" * len(HISTORY)]
    for step in HISTORY_STEPS:
        cells = []
        for name in HISTORY:
            frame = heldout[name]
            if step in frame.index:
                cells.append(f"{frame.loc[step, onset.LOSS_CURVE]:.3f} / {frame.loc[step, onset.ACCURACY_CURVE]:.3f}")
            else:
                cells.append("–")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def roles_by_step(track: pd.DataFrame) -> pd.DataFrame:
    """Per step, task and role: the head with the largest mean β and how many heads hold the role
    (the `roles_by_step.csv` of the single-seed runs, from a track.csv)."""
    rows = []
    for (step, task, role), part in track.groupby(["step", "task", "role"], sort=True):
        best = part.sort_values(["mean", "layer", "head"], ascending=[False, True, True]).iloc[0]
        rows.append({"step": step, "task": task, "role": role, "best_layer": int(best["layer"]),
                     "best_head": int(best["head"]), "max_mean_beta": round(float(best["mean"]), 4),
                     "heads_held": int(part["assigned"].sum())})  # fmt: skip
    return pd.DataFrame(rows)


def history_roles() -> str:
    """Heads holding each role on MRPC / SST-2 at τ = 3 (each run's roles_by_step.csv)."""
    names = {"cls": "[CLS]"}
    lines = ["| step | run | " + " | ".join(names.get(r, r) for r in HISTORY_ROLES) + " |",
             "| --- | --- |" + " --- |" * len(HISTORY_ROLES)]  # fmt: skip
    tables = {name: pd.read_csv(RUNS / name / "roles_by_step.csv") for name in HISTORY}
    for step in HISTORY_STEPS[1:]:
        for name, label in HISTORY.items():
            table = tables[name]
            at = table[table["step"] == step].set_index(["task", "role"])["heads_held"]
            if at.empty:
                continue
            cells = [f"{int(at[('mrpc', r)])} / {int(at[('sst2', r)])}" for r in HISTORY_ROLES]
            lines.append(f"| {step} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def history_changepoints() -> str:
    """The rule's changepoints on the single-seed runs' 31 evaluations (1000 wild-bootstrap replicates, seed 0)."""
    lines = ["| run | curve | evaluations | changepoint | 90% interval | segments (first step: slope per e-fold) |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, label in HISTORY.items():
        heldout = onset.read_heldout(RUNS / name)
        for curve, falling in ((onset.LOSS_CURVE, True), (onset.ACCURACY_CURVE, False)):
            values = heldout[curve].dropna()
            row = onset.curve_row(curve, "", values.index.to_numpy(), values.to_numpy(), falling, 1000, 0)
            lines.append(f"| {label} | {curve} | {row['points']} | {row['changepoint_step']} | "
                         f"{row['changepoint_low']}–{row['changepoint_high']} | {row['fit']} |")  # fmt: skip
    return "\n".join(lines)


def plateau() -> str:
    """The earlier attempt's end: held-out MLM and NSP at its last evaluation, heads holding a role."""
    heldout = onset.read_heldout(RUNS / "plateau")
    last = heldout.index.max()
    row = heldout.loc[last]
    return (
        f"At its last step ({last}) the held-out MLM loss was {row[onset.LOSS_CURVE]:.3f} and accuracy "
        f"{row[onset.ACCURACY_CURVE]:.3f}, held-out NSP accuracy {row['heldout_nsp_accuracy']:.3f} "
        f"(`plateau/metrics.jsonl`)."
    )


GPU_SIZE = RUNS / "gpu-size"
GPU_SIZE_GROUPS = {"positional (local, prev, next)": ["local", "prev", "next"],
                   "[CLS], [SEP], delimiter": ["cls", "sep", "delimiter"],
                   "syntactic (nsubj, dobj, amod, advmod, any)": ["nsubj", "dobj", "amod", "advmod", "syntactic"]}  # fmt: skip


def _probes(metrics: Path) -> pd.DataFrame:
    """The role probes a run recorded: one row per probe step, `ROLE/max_beta` and `ROLE/heads`."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    probes = {int(r["step"]): {k[len("probe/"):]: v for k, v in r.items() if k.startswith("probe/")}
              for r in rows if any(k.startswith("probe/") for k in r)}  # fmt: skip
    return pd.DataFrame.from_dict(probes, orient="index").sort_index()


def gpu_size() -> str:
    """The GPU-size recipe's two seeds (issue 48 item 10): held-out MLM, and per role group the
    largest probe β and the first probe step with a head holding one of its roles."""
    lines = ["| seed | steps | held-out MLM loss at step 1 / 100 / 1000 / last | held-out MLM accuracy, steps ≥ 100 | "
             + " | ".join(f"{group}: largest β (first step with a head)" for group in GPU_SIZE_GROUPS) + " |",
             "|" + " --- |" * (4 + len(GPU_SIZE_GROUPS))]  # fmt: skip
    for run in sorted(p for p in GPU_SIZE.iterdir() if p.is_dir()):
        heldout = onset.read_heldout(run)
        loss, accuracy = heldout[onset.LOSS_CURVE], heldout[onset.ACCURACY_CURVE]
        last = int(heldout.index.max())
        at = " / ".join(f"{loss.loc[step]:.3f}" for step in (1, 100, 1000, last))
        late = accuracy[accuracy.index >= 100]
        probes = _probes(run / "metrics.jsonl")
        cells = []
        for roles in GPU_SIZE_GROUPS.values():
            largest = probes[[f"{r}/max_beta" for r in roles]].max().max()
            held = probes[(probes[[f"{r}/heads" for r in roles]] > 0).any(axis=1)]
            cells.append(f"{largest:.2f} ({int(held.index.min()) if len(held) else 'none'})")
        lines.append(f"| {run.name} | {last} | {at} | {late.min():.3f}–{late.max():.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def synthetic() -> str:
    """The recipe's run, step by step (section 1; the family's member w64-2x2-s0 is this run again)."""
    member = RUNS / "synthetic"
    track = pd.read_csv(member / "track.csv")
    heldout = onset.read_heldout(member)
    roles = ["local", "prev", "next", "cls", "sep"]
    lines = ["| step | held-out MLM loss | MLM accuracy | heads (of 4) holding " + " / ".join(roles) + " |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for step in sorted(track["step"].unique()):
        held = track[(track["step"] == step) & track["assigned"]]["role"].value_counts()
        counts = " / ".join(str(int(held.get(r, 0))) for r in roles)
        lines.append(f"| {step} | {heldout.loc[step, onset.LOSS_CURVE]:.3f} | "
                     f"{heldout.loc[step, onset.ACCURACY_CURVE]:.3f} | {counts} |")  # fmt: skip
    return "\n".join(lines)


def glue_dir() -> Path:
    return Path(os.environ.get("BERTJAX_DATA", DOCS.parent.parent / "shared" / "data")) / "glue"


BLOCKS: dict[str, Callable[[], str]] = {
    "headline": headline,
    "seeds-data": seeds_data,
    "seeds-runs": emergence_seeds.runs_table,
    "seeds-contrasts": contrasts,
    "seeds-cls": cls_heads,
    "seeds-onsets": lambda: emergence_seeds.onsets_table(seed_summaries()),
    "seeds-convention": convention_change,
    "seeds-corrected": series_corrected,
    "seeds-lengths": lambda: emergence_lengths.lengths(glue_dir()),
    "seeds-tau": emergence_events.tau_table,
    "seeds-events": emergence_events.events_table,
    "events-run": emergence_events.run_events,
    "events-run-curves": emergence_events.run_curves,
    "events-run-robustness": emergence_events.run_robustness,
    "family": family,
    "family-verdict": family_verdict,
    "steering": lambda: steering("w64-4x4"),
    "steering-issue": lambda: steering("issue"),
    "steering-issue-plateau": lambda: emergence_steering.plateau_table(emergence_steering.SIZES["issue"]),
    "steering-issue-lr": lambda: steering("issue-lr1e-3"),
    "steering-real": lambda: emergence_steering.real_table(emergence_steering.summarize_real()),
    "steering-real-attention": emergence_steering.real_role_attention,
    "synthetic": synthetic,
    "history-heldout": history_heldout,
    "history-roles": history_roles,
    "history-changepoints": history_changepoints,
    "plateau": plateau,
    "gpu-size": gpu_size,
}


def steering(size_name: str) -> str:
    size = emergence_steering.SIZES[size_name]
    return emergence_steering.table(pd.read_csv(size.committed / "summary.csv"), size)


def block_span(page: str, name: str) -> tuple[int, int]:
    start_mark, end_mark = f"<!-- {name} -->\n", f"\n<!-- /{name} -->"
    start = page.find(start_mark)
    end = page.find(end_mark, start)
    if start < 0 or end < 0:
        raise SystemExit(f"docs/emergence.md has no {name} block")
    return start + len(start_mark), end


def render(page: str, generated: dict[str, str]) -> str:
    for name, text in generated.items():
        start, end = block_span(page, name)
        page = page[:start] + text + page[end:]
    return page


def main(argv: list[str]) -> None:
    page = PAGE.read_text()
    generated = {name: make() for name, make in BLOCKS.items()}
    if "--check" in argv:
        stale = [name for name, text in generated.items() if page[slice(*block_span(page, name))] != text]
        if stale:
            raise SystemExit(f"docs/emergence.md differs from its files in: {', '.join(stale)}")
        return
    PAGE.write_text(render(page, generated))


if __name__ == "__main__":
    main(sys.argv[1:])
