"""The known answer as a family: synthetic languages of several sizes and seeds, models of 2×2 and 4×4
heads, each pre-trained and tracked as docs/emergence.md section 1 does for one, and a planted twin.

    .venv/bin/python docs/emergence_family.py run        # trains and tracks what is missing (resumable)
    .venv/bin/python docs/emergence_family.py table      # the page's table from the committed summary

A member is (words, layers × heads, seed): the language `train.synthetic --words W --seed S`, the
recipe `configs/pretrain/synthetic.yaml` with `data.vocab_size` large enough to keep every word whole,
`train.seed S` and the model's size, then `analysis.track --task text:pairs.txt --n 100` with the
recipe's default onset settings (τ 3, persistence 2, the paired bootstrap's 5–95% intervals).

The rule, fixed before any member was run (2026-11-27), and not changed after:
- the vocabulary keeps every word of the language whole (`split_words` 0);
- the known-answer checks of tests/test_emergence.py: no positional head at step 1, a prev or next head
  at the last step, every positional onset after step 1, held-out MLM accuracy past the best
  context-free guess at or before the first onset;
- the member **holds** when, besides, the earliest positional onset (prev, next or local, status
  `onset`) has `vs_loss` "overlapping": its interval meets the held-out MLM loss changepoint's.
The planted twin (every token embedded at position 0, in training and tracking, so no head can find a
neighbour by position) must not hold. The table reports every member, held or not.

Outputs: `runs/emergence-family/` (languages, workdirs with checkpoints, tracks; not committed) and
`docs/emergence/family/` (committed): `summary.csv`, and per member `onset.csv`, `curve_onsets.csv`,
`track.csv`, `metrics.jsonl`, `language.json` and the track's `run.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "pretrain" / "synthetic.yaml"
WORK = ROOT / "runs" / "emergence-family"
COMMITTED = ROOT / "docs" / "emergence" / "family"
STEPS = 1000
TAU = 3.0
POSITIONAL = ("prev", "next", "local")
ROLES = "prev,next,local,cls,sep,delimiter"
# The trained vocabulary's size that keeps every word whole, per language size (checked per member:
# `split_words`); the trainer stops early when it runs out of merges, so a larger size costs nothing.
VOCAB_SIZE = {64: 256, 128: 512, 250: 768}


@dataclass(frozen=True)
class Member:
    words: int
    layers: int
    heads: int
    seed: int
    planted: bool = False

    @property
    def name(self) -> str:
        return f"w{self.words}-{self.layers}x{self.heads}-s{self.seed}" + ("-planted" if self.planted else "")


MEMBERS = [Member(w, n, n, s) for w in (64, 128, 250) for n in (2, 4) for s in (0, 1)] + [Member(64, 2, 2, 0, True)]


def language_dir(member: Member) -> Path:
    return WORK / f"language-w{member.words}-s{member.seed}"


@contextlib.contextmanager
def positions_at_zero():
    """The planted defect of tests/test_emergence.py: every token embedded at position 0."""
    import jax.numpy as jnp

    from bertjax import model

    real_call = model.BertEmbeddings.__call__

    def at_position_zero(self, input_ids, token_type_ids, position_ids=None, rngs=None):
        return real_call(self, input_ids, token_type_ids, jnp.zeros_like(input_ids), rngs)

    model.BertEmbeddings.__call__ = at_position_zero
    try:
        yield
    finally:
        model.BertEmbeddings.__call__ = real_call


def run_member(member: Member) -> None:
    from analysis import track
    from bertjax import cli
    from train import pretrain, synthetic

    language = language_dir(member)
    if not (language / "pairs.txt").exists():
        synthetic.write(language, words=member.words, successors=2, tokens=300_000, seed=member.seed)
    root = WORK / member.name
    workdir, tracked = root / "run", root / "track"
    overrides = [
        f"data.corpora.0.path={language / 'train.txt'}",
        f"heldout.corpora.0.path={language / 'heldout.txt'}",
        f"data.vocab_size={VOCAB_SIZE[member.words]}",
        f"train.steps={STEPS}",
        f"train.seed={member.seed}",
        f"model.num_hidden_layers={member.layers}",
        f"model.num_attention_heads={member.heads}",
    ]
    defect = positions_at_zero() if member.planted else contextlib.nullcontext()
    with defect:
        if not (tracked / "onset.csv").exists():
            cli.run(pretrain.main, ["--config", str(CONFIG), "--workdir", str(workdir), *overrides])
        if not (tracked / "onset.csv").exists():
            cli.run(track.main, ["--run", str(workdir), "--task", f"text:{language / 'pairs.txt'}", "--n", "100",
                                 "--tau", str(TAU), "--roles", ROLES, "--no-figures", "--out", str(tracked)])  # fmt: skip


def split_words(member: Member) -> int:
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab=str(WORK / member.name / "run" / "data-T32" / "vocab.txt"))
    words = json.loads((language_dir(member) / "language.json").read_text())["words"]
    return sum(len(tokenizer.tokenize(w)) > 1 for w in words)


def context_free_accuracy(data: Path) -> float:
    """The best accuracy without context: always guess the most frequent maskable token."""
    meta = json.loads((data / "meta.json").read_text())
    ids = np.concatenate([np.load(data / shard["name"] / "input_ids.npy").ravel() for shard in meta["shards"]])
    counts = np.bincount(ids.astype(np.int64), minlength=meta["vocab_size"])
    counts[list(meta["special_ids"].values())] = 0
    return counts.max() / counts.sum()


def heldout_curve(metrics: Path, key: str) -> dict[int, float]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def known_answer_failures(
    track: pd.DataFrame, onsets: pd.DataFrame, accuracy: dict[int, float], chance: float
) -> list[str]:
    """What of the known-answer checks failed (empty: all held)."""
    failures = []
    positional = track[track["role"].isin(POSITIONAL)]
    steps = sorted(track["step"].unique())
    first, last = steps[0], steps[-1]
    if positional[(positional["step"] == first)]["assigned"].any():
        failures.append("a positional head at step 1")
    held_last = positional[(positional["step"] == last) & positional["assigned"]]
    if not held_last["role"].isin(["prev", "next"]).any():
        failures.append("no prev/next head at the last step")
    found = onsets[onsets["role"].isin(POSITIONAL) & (onsets["status"] == "onset")]
    if (found["onset_step"] <= first).any():
        failures.append("an onset at step 1")
    if found.empty:
        failures.append("no positional onset")
    else:
        past = [step for step, value in sorted(accuracy.items()) if value > chance]
        if not past or past[0] > found["onset_step"].min():
            failures.append("held-out accuracy past the context-free guess only after the first onset")
    return failures


def summarize(member: Member) -> dict:
    root = WORK / member.name
    tracked, workdir = root / "track", root / "run"
    track = pd.read_csv(tracked / "track.csv")
    onsets = pd.read_csv(tracked / "onset.csv")
    curves = pd.read_csv(tracked / "curve_onsets.csv")
    loss = curves[curves["curve"] == "heldout_mlm_loss"].iloc[0]
    accuracy = heldout_curve(workdir / "metrics.jsonl", "heldout_mlm_accuracy")
    chance = context_free_accuracy(workdir / "data-T32")
    failures = known_answer_failures(track, onsets, accuracy, chance)
    found = onsets[onsets["role"].isin(POSITIONAL) & (onsets["status"] == "onset")].sort_values(
        ["onset_step", "layer", "head"]
    )
    first = found.iloc[0] if len(found) else None
    last_step = track["step"].max()
    held_last = track[(track["step"] == last_step) & track["role"].isin(POSITIONAL) & track["assigned"]]
    holds = not failures and first is not None and first["vs_loss"] == "overlapping"
    return {
        "member": member.name, "words": member.words, "layers": member.layers, "heads": member.heads,
        "seed": member.seed, "planted": member.planted, "split_words": split_words(member),
        "final_heldout_loss": round(heldout_curve(workdir / "metrics.jsonl", "heldout_mlm_loss")[STEPS], 4),
        "context_free_accuracy": round(chance, 4),
        "loss_changepoint": loss["changepoint_step"], "loss_low": loss["changepoint_low"], "loss_high": loss["changepoint_high"],
        "positional_heads_at_last": held_last[["layer", "head"]].drop_duplicates().shape[0],
        "first_onset_role": None if first is None else first["role"],
        "first_onset_head": None if first is None else f"{first['layer']}-{first['head']}",
        "first_onset": None if first is None else first["onset_step"],
        "first_onset_low": None if first is None else first["onset_low"],
        "first_onset_high": None if first is None else first["onset_high"],
        "vs_loss": None if first is None else first["vs_loss"],
        "known_answer_failures": "; ".join(failures),
        "holds": holds,
    }  # fmt: skip


def commit_outputs(member: Member) -> None:
    out = COMMITTED / member.name
    out.mkdir(parents=True, exist_ok=True)
    root = WORK / member.name
    for name in ("onset.csv", "curve_onsets.csv", "track.csv", "run.json"):
        shutil.copyfile(root / "track" / name, out / name)
    shutil.copyfile(root / "run" / "metrics.jsonl", out / "metrics.jsonl")
    shutil.copyfile(language_dir(member) / "language.json", out / "language.json")


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value == "":
        return "–"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def table(summary: pd.DataFrame) -> str:
    """The page's table: one row per member."""
    lines = [
        "| member | words split | held-out loss at 1000 | loss changepoint | positional heads at 1000 "
        "| first positional onset | vs loss | known-answer checks | holds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary.to_dict("records"):
        r = {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in r.items()}
        onset = (
            "none"
            if r["first_onset"] is None
            else (
                f"{_cell(r['first_onset'])} ({_cell(r['first_onset_low'])}–{_cell(r['first_onset_high'])}), "
                f"{r['first_onset_role']} {r['first_onset_head']}"
            )
        )
        lines.append(
            f"| {r['member']} | {r['split_words']} | {r['final_heldout_loss']:.3f} "
            f"| {_cell(r['loss_changepoint'])} ({_cell(r['loss_low'])}–{_cell(r['loss_high'])}) "
            f"| {r['positional_heads_at_last']} | {onset} | {_cell(r['vs_loss'])} "
            f"| {r['known_answer_failures'] or 'all hold'} | {'yes' if r['holds'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "table"])
    parser.add_argument("--only", help="run only the members whose name contains this")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(pd.read_csv(COMMITTED / "summary.csv")))
        return
    rows = []
    for member in MEMBERS:
        if args.only and args.only not in member.name:
            continue
        run_member(member)
        rows.append(summarize(member))
        commit_outputs(member)
        print(f"{member.name}: holds {rows[-1]['holds']}", file=sys.stderr, flush=True)
    if not args.only:
        pd.DataFrame(rows).to_csv(COMMITTED / "summary.csv", index=False)


if __name__ == "__main__":
    main()
