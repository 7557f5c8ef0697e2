"""Role probes inside pre-training (train.probe): logged at every probe step into metrics.jsonl and
TensorBoard, equal to `analysis.track` on the same checkpoints and probe set, and a bad probe
section stopped by one error line before any work.

One short run of configs/pretrain/synthetic.yaml (the known-answer language of tests/test_emergence)
with probes every 40 steps and at its log-spaced checkpoints.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bertjax.errors import UserError

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "pretrain" / "synthetic.yaml"
STEPS, EVERY, N, MAX_LENGTH, BATCH = 120, 40, 48, 32, 16
ROLES = ("prev", "next", "local", "block", "cls", "sep", "delimiter")
# 120 steps leave every head's β within ~10% of chance (largest 1.10 at step 120, 1.05 at 24), so
# τ sits just above chance: the counts compared are then not all zero, and every p-value is far
# from α (β's SD across sequences is tiny), so equal counts are a real check.
TAU, ALPHA = 1.02, 0.05


@pytest.fixture(scope="module")
def language(tmp_path_factory) -> Path:
    from train import synthetic

    out = tmp_path_factory.mktemp("language") / "text"
    synthetic.write(out, words=64, successors=2, tokens=40_000, seed=0)
    return out


def overrides(language: Path, *extra: str) -> list[str]:
    return [
        f"data.corpora.0.path={language / 'train.txt'}",
        f"heldout.corpora.0.path={language / 'heldout.txt'}",
        "heldout.sequences=128",
        f"train.steps={STEPS}",
        "train.log_every=20",
        "checkpoint.log_spaced=4",
        f"probe.task=text:{language / 'pairs.txt'}",
        f"probe.n={N}",
        f"probe.max_length={MAX_LENGTH}",
        f"probe.batch_size={BATCH}",
        f"probe.every={EVERY}",
        f"probe.roles=[{','.join(ROLES)}]",
        f"probe.tau={TAU}",
        f"probe.alpha={ALPHA}",
        *extra,
    ]


@pytest.fixture(scope="module")
def run(language, tmp_path_factory) -> Path:
    from train import pretrain

    workdir = tmp_path_factory.mktemp("probe") / "run"
    pretrain.main(["--config", str(CONFIG), "--workdir", str(workdir), *overrides(language)])
    return workdir


def probe_records(workdir: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in lines if "probe/prev/heads" in r}


def checkpoint_steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def tensorboard_scalars(workdir: Path) -> dict[str, dict[int, float]]:
    """tag → {step: value}, read from the TFRecord event files (tensorboard itself is not a
    dependency): each record is length (u64), its CRC, the Event proto, its CRC."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_probe_metrics_are_logged_at_every_probe_step(run):
    saves = checkpoint_steps(run)
    expected = sorted({*range(EVERY, STEPS + 1, EVERY), *saves})
    records = probe_records(run)
    assert sorted(records) == expected
    # Single-segment lines would drop `block`; pairs.txt holds pairs, so every role is probed.
    keys = [f"probe/{role}/{what}" for role in ROLES for what in ("heads", "max_beta", "max_layer", "max_head", "n")]
    scalars = tensorboard_scalars(run)
    for step, record in records.items():
        for key in keys:
            assert key in record, (step, key)
            assert scalars[key][step] == pytest.approx(record[key], rel=1e-6)  # TensorBoard stores float32
        assert record["probe/prev/n"] == N
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["timings_s"]["probe_s"] > 0


def test_probe_equals_analysis_track(run, language, tmp_path):
    from analysis import track

    out = tmp_path / "track"
    track.main(["--run", str(run), "--task", f"text:{language / 'pairs.txt'}", "--n", str(N), "--max-length",
                str(MAX_LENGTH), "--batch-size", str(BATCH), "--roles", ",".join(ROLES), "--tau", str(TAU),
                "--alpha", str(ALPHA), "--no-figures", "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / "track.csv")
    records = probe_records(run)
    steps = sorted(table["step"].unique())
    assert steps == checkpoint_steps(run) and len(steps) >= 3
    # β is a ratio of float32 sums over ≤ T keys, averaged over ≤ T rows: each computation is within
    # ~3·T·u of the exact value (u = 2⁻²⁴), so two differently compiled ones within 6·T·u.
    # A probe in bf16, or with another sieve or padding, is off by orders of magnitude more.
    bound = 6 * MAX_LENGTH * 2.0**-24
    assigned_somewhere = 0
    for step in steps:
        record = records[step]
        for role in ROLES:
            rows = table[(table["step"] == step) & (table["role"] == role)].sort_values(["layer", "head"])
            # A p-value within rounding of α would make an exact count ill-posed on another CPU.
            assert not np.any(np.abs(rows["p_value"] - ALPHA) < 1e-9)
            assert record[f"probe/{role}/heads"] == int(rows["assigned"].sum()), (step, role)
            assert record[f"probe/{role}/n"] == int(rows["n"].iloc[0])
            best = rows.loc[rows["mean"].idxmax()]
            assert record[f"probe/{role}/max_beta"] == pytest.approx(best["mean"], rel=bound, abs=0)
            assert (record[f"probe/{role}/max_layer"], record[f"probe/{role}/max_head"]) == (
                best["layer"],
                best["head"],
            )
            assigned_somewhere += int(rows["assigned"].sum())
    assert assigned_somewhere > 0  # the counts compared are not all zeros


@pytest.mark.parametrize(
    "extra, message",
    [
        (["probe.task=nosuch"], "probe.task: 'nosuch' is none of"),
        (["probe.task=text:/no/such/file.txt"], "probe.task text:/no/such/file.txt: /no/such/file.txt is not a file"),
        (["probe.every=0"], "probe.every must be at least 1, got 0"),
        (["probe.roles=[prev,nosuch]"], "probe.roles: unknown role 'nosuch'"),
        ([f"probe.max_length={MAX_LENGTH + 1}"], f"probe.max_length {MAX_LENGTH + 1} exceeds the model's"),
    ],
)
def test_probe_config_errors_stop_before_any_work(language, tmp_path, extra, message):
    from train import pretrain

    workdir = tmp_path / "run"
    with pytest.raises(UserError) as error:
        pretrain.main(["--config", str(CONFIG), "--workdir", str(workdir), *overrides(language, *extra)])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not workdir.exists()
