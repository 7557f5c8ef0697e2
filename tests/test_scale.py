"""The analyses give the same results on 1, 2, 4 and 8 devices, and as 2 processes of one job.

Run on CPU with fake devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`, in a fresh
process: this one's JAX has settled on one device) and with 2 JAX processes on localhost. A batch
of 6 sequences is split over 4 and 8 devices only after padding, so the padding path is covered.

Why 1e-5 relative: each per-sequence β is a mean over ≤ T = 32 scored rows of ratios of sums of ≤ T
float32 attention probabilities, and each head's mean in roles.csv a mean of ≤ 16 such scores.
Splitting a batch differently changes only the shapes XLA compiles for, hence the order of those
float32 sums: at most (T + T + 16) · 2⁻²⁴ ≈ 4.8e-6 relative, below 1e-5. A result that used a
padding row's scores, or dropped a device's share, moves a mean by far more (the planted case).

The SD is not bound by 1e-5 relative: where it is small against the values, the per-sequence
errors above are amplified by cancellation (2.9e-4 relative was seen on an AMD EPYC). With each
score x_i off by at most r·|x_i| (r = RELATIVE), the sample SD s = ‖Px‖/√(n−1), P the centring
projection (norm 1), moves by at most ‖Pδx‖/√(n−1) ≤ r·‖x‖/√(n−1) = r·√(s² + n·mean²/(n−1)), plus
r·s for rounding in the SD's own sums (`sd_bound`). A planted bug still moves it far past that.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

DEVICE_COUNTS = (1, 2, 4, 8)
RELATIVE = 1e-5

ANALYSES = r"""
import sys
from pathlib import Path

import bertjax
from analysis import finetune_effect, prune, roles, track

ckpt, glue, cache, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
data = ["--glue-dir", glue, "--n", "16", "--batch-size", "6", "--max-length", "32", "--cache-dir", cache]
# A classifier for prune: the checkpoint's encoder under a fresh 2-label head (what is compared is
# the evaluation path, not how good the classifier is).
classifier = out / "classifier"
model = bertjax.from_pretrained(ckpt, "BertForSequenceClassification")
bertjax.save_pretrained(model, classifier)
bertjax.load_tokenizer(ckpt).save_pretrained(classifier)
for devices in sys.argv[5].split(","):
    flags = ["--devices", devices]
    roles.main(["--ckpt", ckpt, "--task", "mrpc,sst2", "--tau", "1", "--no-figures",
                "--out", str(out / f"roles-{devices}"), *data, *flags])
    track.main(["--ckpt", f"{ckpt}@0", "--ckpt", f"{classifier}@1", "--task", "mrpc", "--tau", "1",
                "--no-figures", "--out", str(out / f"track-{devices}"),
                "--scores-cache", str(out / f"track-cache-{devices}"), *data, *flags])
    finetune_effect.main(["--pre", ckpt, "--post", f"{classifier}:mrpc", "--no-figures",
                          "--out", str(out / f"effect-{devices}"), *data, *flags])
    prune.main(["--ckpt", str(classifier), "--task", "mrpc", "--glue-dir", glue, "--n", "16", "--batch-size", "6",
                "--max-length", "32", "--random-seeds", "1", "--prune-step", "0.25", "--figure-format", "png",
                "--out", str(out / f"prune-{devices}"), *flags])
"""


@pytest.fixture(scope="module")
def outputs(minilm_path, shared_data, tmp_path_factory, fake_devices) -> Path:
    out = tmp_path_factory.mktemp("scale")
    fake_devices(ANALYSES, str(minilm_path), str(shared_data / "glue"), str(out / "parses"), str(out),
                 ",".join(map(str, DEVICE_COUNTS)), timeout=900)  # fmt: skip
    return out


def relative_gap(a: pd.Series, b: pd.Series) -> float:
    a, b = a.to_numpy(float), b.to_numpy(float)
    both = np.isfinite(a) & np.isfinite(b)
    assert (np.isfinite(a) == np.isfinite(b)).all()
    return float(np.max(np.abs(a[both] - b[both]) / np.maximum(np.abs(b[both]), 1e-30), initial=0.0))


def sd_bound(reference: pd.DataFrame) -> pd.Series:
    """The largest change of the SD that per-sequence errors of RELATIVE each allow (module doc)."""
    n, mean, sd = reference["n"], reference["mean"], reference["std"]
    return RELATIVE * (np.sqrt(sd**2 + n * mean**2 / (n - 1)) + sd)


def agree(table: pd.DataFrame, reference: pd.DataFrame, keys: list[str], means: list[str], exact: list[str]) -> None:
    """Same rows, the `exact` columns equal, the `means` within RELATIVE of `reference`'s and, where
    the table has one, its `std` within `sd_bound`."""
    table, reference = table.sort_values(keys, ignore_index=True), reference.sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(table[keys + exact], reference[keys + exact])
    for column in means:
        assert relative_gap(table[column], reference[column]) <= RELATIVE, column
    if "std" in reference:
        sd_within_bound(table, reference)


def sd_within_bound(table: pd.DataFrame, reference: pd.DataFrame) -> None:
    """Rows in the same order; NaN exactly where the reference has NaN."""
    a, b = table["std"].to_numpy(float), reference["std"].to_numpy(float)
    assert (np.isfinite(a) == np.isfinite(b)).all()
    finite = np.isfinite(b)
    gap = np.abs(a - b)[finite]
    assert (gap <= sd_bound(reference).to_numpy(float)[finite]).all(), f"std: largest gap {gap.max(initial=0):.3g}"


def t_within_bound(table: pd.DataFrame, reference: pd.DataFrame, keys: list[str]) -> None:
    """t = (mean − τ)·√n / sd cancels where the mean is near τ, so its error is bounded through the
    mean's, not relative to t: |Δt| ≤ RELATIVE·|mean|·√n/sd + |t|·sd_bound/sd (the sd's share)."""
    a, b = table.sort_values(keys, ignore_index=True), reference.sort_values(keys, ignore_index=True)
    finite = np.isfinite(b["t"])
    bound = (RELATIVE * b["mean"].abs() * np.sqrt(b["n"]) + b["t"].abs() * sd_bound(b)) / b["std"]
    assert ((a["t"] - b["t"]).abs()[finite] <= bound[finite]).all()


@pytest.mark.slow  # the `outputs` fixture runs every analysis on 1, 2, 4 and 8 devices: ~87 s of CPU
@pytest.mark.parametrize("devices", DEVICE_COUNTS[1:])
def test_roles_agree_on_every_device_count(outputs, devices):
    one, many = (pd.read_csv(outputs / f"roles-{d}" / "roles.csv") for d in (1, devices))
    assert one["assigned"].any() and not one["assigned"].all(), "τ = 1 must assign some roles and not others"
    keys = ["task", "layer", "head", "role"]
    agree(many, one, keys, ["mean"], ["n", "assigned"])
    t_within_bound(many, one, keys)
    run = json.loads((outputs / f"roles-{devices}" / "run.json").read_text())
    assert run["mesh"] == {"data": devices, "fsdp": 1} and run["processes"] == 1
    assert run["config"]["devices"] == devices


@pytest.mark.slow  # the `outputs` fixture, when run alone
@pytest.mark.parametrize("devices", DEVICE_COUNTS[1:])
def test_track_agrees_on_every_device_count(outputs, devices):
    one, many = (pd.read_csv(outputs / f"track-{d}" / "track.csv") for d in (1, devices))
    agree(many, one, ["step", "task", "layer", "head", "role"], ["mean"], ["n", "assigned"])


@pytest.mark.slow  # the `outputs` fixture, when run alone
@pytest.mark.parametrize("devices", DEVICE_COUNTS[1:])
def test_finetune_effect_agrees_on_every_device_count(outputs, devices):
    for name, keys, means in (
        ("head_means", ["post_ckpt", "task", "layer", "head", "role"], ["pre", "post"]),
        ("attention_similarity", ["post_ckpt", "task", "layer", "head"], ["cosine"]),
    ):
        one, many = (pd.read_csv(outputs / f"effect-{d}" / f"{name}.csv") for d in (1, devices))
        agree(many, one, keys, means, ["n"])
    assert json.loads((outputs / f"effect-{devices}" / "run.json").read_text())["mesh"]["data"] == devices


@pytest.mark.slow  # the `outputs` fixture, when run alone
@pytest.mark.parametrize("devices", DEVICE_COUNTS[1:])
def test_prune_agrees_on_every_device_count(outputs, devices):
    one, many = (pd.read_csv(outputs / f"prune-{d}" / "mrpc_importance.csv") for d in (1, devices))
    agree(many, one, ["layer", "head"], ["importance_raw"], [])
    curves = [pd.read_csv(outputs / f"prune-{d}" / "pruning.csv") for d in (1, devices)]
    pd.testing.assert_frame_equal(curves[1], curves[0])  # metrics are counts of correct examples
    assert json.loads((outputs / f"prune-{devices}" / "run.json").read_text())["mesh"]["data"] == devices


@pytest.mark.slow  # the `outputs` fixture, when run alone
def test_a_planted_padding_bug_breaks_the_bound(outputs):
    """Scores of the first sequences of each batch replaced by a padding row's (what a result taken
    from the wrong rows of a padded batch would hold) move the means well past the bound."""
    with np.load(outputs / "roles-1" / "scores.npz") as stored:
        scores = stored["mrpc/local"]
    planted = scores.copy()
    planted[:2] = planted[-1]
    assert relative_gap(pd.Series(planted.mean(0).ravel()), pd.Series(scores.mean(0).ravel())) > 100 * RELATIVE
    n = len(scores)
    reference = pd.DataFrame({"n": n, "mean": scores.mean(0).ravel(), "std": scores.std(0, ddof=1).ravel()})
    moved = np.abs(planted.std(0, ddof=1).ravel() - reference["std"]) / sd_bound(reference)
    assert moved.max() > 100, "the planted bug must move some SD far past its bound"


JOB = r"""
import os, sys
from bertjax import distributed

index, port, case, ckpt, glue, cache, out = sys.argv[1:8]
# A short heartbeat timeout, so that a dead process is noticed in seconds (100 s by default).
distributed.initialize(True, coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(index),
                       heartbeat_timeout_seconds=3)
if case == "die" and index == "1":
    os._exit(3)
from analysis import roles, track

data = ["--glue-dir", glue, "--n", "16", "--batch-size", "6", "--max-length", "32", "--cache-dir", cache, "--devices", "1"]
if case == "track":
    classifier = sys.argv[8]
    track.main(["--ckpt", f"{ckpt}@0", "--ckpt", f"{classifier}@1", "--task", "mrpc", "--tau", "1", "--no-figures",
                "--out", out, "--scores-cache", out + ".cache", *data])
else:
    roles.main(["--ckpt", ckpt, "--task", "mrpc,sst2", "--tau", "1", "--no-figures", "--out", out, *data])
"""


@pytest.mark.slow  # the `outputs` fixture, when run alone
def test_two_processes_give_the_one_process_result(outputs, localhost_job, minilm_path, shared_data, tmp_path):
    out = tmp_path / "job"
    args = (str(minilm_path), str(shared_data / "glue"), str(outputs / "parses"), str(out))
    results = localhost_job(JOB, "run", *args, timeout=300)
    for status, _, err in results:
        assert status == 0, err[-3000:]
    one, job = (pd.read_csv(d / "roles.csv") for d in (outputs / "roles-1", out))
    keys = ["task", "layer", "head", "role"]
    agree(job, one, keys, ["mean"], ["n", "assigned"])
    t_within_bound(job, one, keys)
    assert job[keys].equals(one[keys])  # the same row order
    with np.load(outputs / "roles-1" / "scores.npz") as a, np.load(out / "scores.npz") as b:
        assert a.files == b.files
        for key in (k for k in a.files if k.endswith("/index")):
            np.testing.assert_array_equal(b[key], a[key])  # every example once, in file order
    run = json.loads((out / "run.json").read_text())
    assert run["processes"] == 2 and run["tasks"]["mrpc"]["sequences"] == 16
    # process 1 wrote nothing of its own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def test_a_process_that_dies_leaves_no_output(localhost_job, minilm_path, shared_data, tmp_path):
    out = tmp_path / "job"
    args = (str(minilm_path), str(shared_data / "glue"), str(tmp_path / "parses"), str(out))
    (status0, _, err0), (status1, _, _) = localhost_job(JOB, "die", *args, timeout=300)
    assert status1 == 3 and status0 != 0, err0[-3000:]
    assert not out.exists()


@pytest.mark.slow  # the `outputs` fixture, when run alone
def test_two_processes_track_a_series_as_one(outputs, localhost_job, minilm_path, shared_data, tmp_path):
    out = tmp_path / "job"
    args = (str(minilm_path), str(shared_data / "glue"), str(outputs / "parses"), str(out), str(outputs / "classifier"))
    for status, _, err in localhost_job(JOB, "track", *args, timeout=300):
        assert status == 0, err[-3000:]
    one, job = (pd.read_csv(d / "track.csv") for d in (outputs / "track-1", out))
    keys = ["step", "task", "layer", "head", "role"]
    agree(job, one, keys, ["mean"], ["n", "assigned"])
    assert job[keys].equals(one[keys])
    # process 0 alone wrote the outputs and the cache: one entry a step
    assert len(list((tmp_path / "job.cache").glob("step-*.npz"))) == 2
    assert json.loads((out / "run.json").read_text())["processes"] == 2


@pytest.mark.parametrize("module", ["roles", "track", "finetune_effect", "prune", "ablate"])
def test_a_device_count_below_one_is_one_line(module, cli_error):
    import importlib

    required = {"roles": ["--ckpt", "x"], "track": ["--run", "x"], "finetune_effect": ["--pre", "x", "--post", "y"],
                "prune": ["--ckpt", "x"], "ablate": ["--ckpt", "x"]}[module]  # fmt: skip
    entry = importlib.import_module(f"analysis.{module}")
    assert cli_error(entry.main, [*required, "--devices", "0"]) == "error: --devices must be at least 1, got 0"
