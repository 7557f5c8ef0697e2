"""Smoke tests of the benchmark scripts: each runs in-process on a tiny shape and prints its JSON lines."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_train_step_runs_on_a_tiny_shape(capsys):
    from benchmarks import train_step

    train_step.main(["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--repeat", "1", "--warmup", "0"])
    records = json_lines(capsys.readouterr().out)
    assert all(r["benchmark"] == "train_step" and r["preset"] == "tiny" for r in records)
    assert all((r["batch"], r["seq_len"], r["dtype"], r["malloc"]) == (2, 32, "float32", "default") for r in records)
    steps = {r["backend"]: r for r in records if "speedup" not in r}
    assert set(steps) == {"bertjax", "torch"}
    # The same model on both sides: HF's BertForPreTraining has bertjax's parameter count.
    assert steps["bertjax"]["params"] == steps["torch"]["params"] > 0
    for r in steps.values():
        assert r["runs"] == 1 and len(r["times_s"]) == 1
        assert 0 < r["min_s"] <= r["median_s"]
        assert r["sequences_per_s"] == pytest.approx(2 / r["median_s"])
        assert r["tokens_per_s"] == pytest.approx(2 * 32 / r["median_s"])
        assert r["flops_per_s"] > 0
        # A real MLM + NSP loss of a random model: near ln(vocab) + ln(2), finite.
        assert 5 < r["loss"] < 15
        assert r["machine"]["cores"] >= 1
    assert steps["bertjax"]["compile_s"] > 0
    [speedup] = [r for r in records if "speedup" in r]
    assert speedup["speedup"] == pytest.approx(steps["torch"]["median_s"] / steps["bertjax"]["median_s"])
    assert speedup["bertjax_median_s"] == steps["bertjax"]["median_s"]
    assert speedup["torch_median_s"] == steps["torch"]["median_s"]


def test_intervene_cost_times_each_steering_beside_the_unsteered_step(capsys):
    """benchmarks.intervene_cost on the tiny preset: a line per variant, its step train.pretrain's
    (the section resolved from the config, LAMB, the penalties in the metrics), and a cost line per
    steered variant: the median of its per-round ratios to the unsteered step, with their spread."""
    import statistics

    from benchmarks import intervene_cost

    intervene_cost.main(["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--repeat", "3", "--warmup", "0"])
    records = json_lines(capsys.readouterr().out)
    assert all(r["benchmark"] == "intervene_cost" and (r["preset"], r["batch"], r["seq_len"]) == ("tiny", 2, 32)
               and (r["optimizer"], r["layers"], r["heads"]) == ("lamb", 2, 2) for r in records)  # fmt: skip
    steps = {r["variant"]: r for r in records if "cost" not in r}
    costs = {r["variant"]: r for r in records if "cost" in r}
    assert list(steps) == ["none", "positional", "cls"] and list(costs) == ["positional", "cls"]
    assert steps["none"]["intervene"] == [] and steps["none"]["intervene_metrics"] == {}
    assert [e["role"] for e in steps["positional"]["intervene"]] == ["prev", "next"]
    assert [e["role"] for e in steps["cls"]["intervene"]] == ["cls"]
    assert set(steps["positional"]["intervene_metrics"]) == {
        "intervene/0-prev", "intervene/0-prev/beta", "intervene/1-next", "intervene/1-next/beta"}  # fmt: skip
    assert all(v >= 0 and np.isfinite(v) for r in steps.values() for v in r["intervene_metrics"].values())
    for r in steps.values():
        assert r["runs"] == len(r["times_s"]) == len(r["cpu_times_s"]) == 3 and r["compile_s"] > 0
        assert r["cpu_median_s"] > 0
        assert 0 < r["min_s"] <= r["median_s"] and r["params"] == steps["none"]["params"]
        assert 5 < r["loss"] < 15
    for variant, cost in costs.items():
        # times_s are rounded to 0.1 ms: the ratios recomputed from them agree to ~1e-3.
        ratios = [s / u for s, u in zip(steps[variant]["times_s"], steps["none"]["times_s"], strict=True)]
        assert cost["baseline"] == "none" and cost["rounds"] == 3
        assert cost["cost"] == pytest.approx(statistics.median(ratios), rel=1e-2)
        low, high = cost["cost_range"]
        assert low <= cost["cost_quartiles"][0] <= cost["cost"] <= cost["cost_quartiles"][1] <= high
        low, high = cost["cpu_cost_range"]
        assert low <= cost["cpu_cost_quartiles"][0] <= cost["cpu_cost"] <= cost["cpu_cost_quartiles"][1] <= high
        assert cost["ratio_of_medians"] == pytest.approx(steps[variant]["median_s"] / steps["none"]["median_s"])


def test_train_step_runs_torch_as_its_users_do_in_bf16(capsys):
    """The torch baseline a GPU user runs: SDPA attention and bf16 autocast over fp32 params (fused
    AdamW is CUDA's alone), beside bertjax's bf16 step, with the ratio of their medians."""
    from benchmarks import train_step

    argv = ["--tiny", "--repeat", "1", "--warmup", "0", "--dtype", "bfloat16", "--backends", "bertjax,torch"]
    train_step.main(argv)
    records = json_lines(capsys.readouterr().out)
    steps = {r["backend"]: r for r in records if "speedup" not in r}
    torch_step = steps["torch"]
    assert (torch_step["attention"], torch_step["autocast"]) == ("sdpa", "torch.bfloat16")
    assert torch_step["fused_adamw"] is False and "compile_s" not in torch_step
    assert 5 < torch_step["loss"] < 15 and steps["bertjax"]["params"] == torch_step["params"]
    [speedup] = [r for r in records if "speedup" in r]
    assert speedup["baseline"] == "torch"
    assert speedup["speedup"] == pytest.approx(torch_step["median_s"] / steps["bertjax"]["median_s"])


def test_the_compiled_torch_backend_is_the_same_model_under_torch_compile():
    """`torch-compile` wraps the eager backend's model in `torch.compile` (compiling BERT on a CPU
    takes minutes: the GPU script's tiny dry run steps it, tests/test_benchmarks.py's slow test)."""
    import torch

    from benchmarks import train_step
    from bertjax.config import preset

    config = preset("tiny")
    batch = train_step.make_batch(config, 2, 32)
    eager, compiled = (train_step.TorchStep(config, batch, compiled=c) for c in (False, True))
    assert (eager.name, compiled.name) == ("torch", "torch-compile")
    assert eager.forward is eager.model
    assert isinstance(compiled.forward, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled.forward._orig_mod is compiled.model
    assert compiled.n_params == eager.n_params


def test_sieve_kernel_runs_on_a_tiny_shape(capsys):
    from benchmarks import sieve_kernel

    sieve_kernel.main(
        ["--layers", "2", "--heads", "2", "--batch", "3", "--length", "16", "--roles", "2", "--repeat", "2"]
    )
    kernel, loop, ratio = json_lines(capsys.readouterr().out)
    assert (kernel["implementation"], loop["implementation"]) == ("jax_kernel", "numpy_per_token_loop")
    assert (kernel["runs"], loop["runs"]) == (2, 1)
    assert ratio["speedup"] == pytest.approx(loop["median_s"] / kernel["median_s"])
    assert all((r["layers"], r["batch"], r["length"]) == (2, 3, 16) for r in (kernel, loop, ratio))


def test_the_per_token_loop_is_the_kernel_reference():
    from benchmarks.sieve_kernel import make_inputs, per_token_loop
    from sieves.kernel import sieve_scores

    inputs = make_inputs(layers=2, batch=3, heads=2, length=12, roles=2, seed=1)
    _, real, rows, sieves = inputs
    assert rows.any() and (sieves.sum(-1)[rows] <= 4).all() and not sieves[:, ~real].any()
    np.testing.assert_allclose(per_token_loop(*inputs), np.asarray(sieve_scores(*inputs)[0]), rtol=1e-5)


@pytest.fixture(scope="module")
def random_tiny(shared_data, tmp_path_factory) -> tuple[str, Path]:
    from benchmarks.common import random_checkpoint

    directory = tmp_path_factory.mktemp("random-tiny")
    return random_checkpoint("tiny", shared_data / "vocab" / "bert-base-uncased-vocab.txt", directory), directory


def test_roles_overhead_runs_on_exported_parses(shared_data, random_tiny, tmp_path, capsys):
    from benchmarks import roles_overhead

    ckpt, _ = random_tiny
    common = ["--ckpt", ckpt, "--glue-dir", str(shared_data / "glue"), "--n", "6", "--tasks", "mrpc:dev", "sst2:train"]
    parses = tmp_path / "parses.json"
    roles_overhead.main(common + ["--export-parses", str(parses), "--cache-dir", str(tmp_path / "cache")])
    assert json_lines(capsys.readouterr().out) == []
    assert len(json.loads(parses.read_text())["parses"]) == 6 * 2 + 6  # MRPC pairs, SST-2 sentences
    roles_overhead.main(common + ["--parses", str(parses), "--repeat", "1", "--no-figures"])
    forward, end_to_end, ratio = json_lines(capsys.readouterr().out)
    assert end_to_end["sequences"] == {"mrpc:dev": 6, "sst2:train": 6} and end_to_end["n_sequences"] == 12
    for stages in (end_to_end["first_run_stages_s"], end_to_end["stages_s"]):
        assert {"load_model", "prepare", "score", "tests_and_tables"} <= set(stages)
    assert ratio["overhead"] == pytest.approx(end_to_end["median_s"] / forward["median_s"] - 1)


def test_host_stages_compares_two_trees_stage_by_stage(shared_data, random_tiny, tmp_path, capsys):
    """This tree against itself as the baseline: both sides' stages, the host stages' sum without
    the scoring, their ratio, and the outputs found identical."""
    from benchmarks import host_stages

    ckpt, _ = random_tiny
    host_stages.main(["--baseline", str(ROOT), "--ckpt", ckpt, "--glue-dir", str(shared_data / "glue"), "--task",
                      "mrpc", "--n", "4", "--repeat", "1", "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    this, baseline, ratio = json_lines(capsys.readouterr().out)
    assert (this["tree"], baseline["tree"], ratio["side"]) == ("this", "baseline", "ratio")
    for side in (this, baseline):
        assert {"load_model", "mrpc/prepare", "mrpc/score", "tests_and_tables", "figures"} <= set(side["stages_s"])
        host = sum(v for k, v in side["stages_s"].items() if k not in ("mrpc/score", "total"))
        assert side["host_s"] == pytest.approx(host) and side["runs"] == 1
    assert ratio["identical"] is True and ratio["host_ratio"] == pytest.approx(this["host_s"] / baseline["host_s"])


def test_scoring_host_compares_the_masks_of_two_trees(shared_data, random_tiny, tmp_path, capsys):
    """This tree against itself: both sides' host seconds, their ratio, the masks found identical;
    a baseline whose masks differ (a planted sieve) is reported as not identical."""
    from benchmarks import scoring_host

    ckpt, _ = random_tiny
    argv = ["--ckpt", ckpt, "--glue-dir", str(shared_data / "glue"), "--task", "mrpc", "--n", "4", "--repeat", "1",
            "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    scoring_host.main(["--baseline", str(ROOT), *argv])
    this, baseline, ratio = json_lines(capsys.readouterr().out)
    assert (this["tree"], baseline["tree"], ratio["side"]) == ("this", "baseline", "ratio")
    assert this["batches"] == baseline["batches"] == 1 and ratio["identical"] is True
    assert ratio["host_ratio"] == pytest.approx(this["host_s"] / baseline["host_s"])
    planted = tmp_path / "planted"
    shutil.copytree(ROOT / "sieves", planted / "sieves")
    for package in ("analysis", "bertjax", "train"):
        (planted / package).symlink_to(ROOT / package)
    builders = planted / "sieves" / "builders.py"
    builders.write_text(
        builders.read_text().replace(
            "np.abs(padded.offsets) <= options.window", "np.abs(padded.offsets) <= options.window + 1"
        )
    )
    scoring_host.main(["--baseline", str(planted), *argv])
    assert json_lines(capsys.readouterr().out)[-1]["identical"] is False


def test_attention_norms_runs_on_a_tiny_shape(shared_data, random_tiny, tmp_path, capsys):
    from benchmarks import attention_norms

    ckpt, _ = random_tiny
    attention_norms.main(["--ckpt", ckpt, "--glue-dir", str(shared_data / "glue"), "--task", "mrpc", "--n", "6",
                          "--repeat", "1", "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    *sides, added = json_lines(capsys.readouterr().out)
    assert [line["side"] for line in sides] == ["weights", "norms", "both"] and sides[0]["n_sequences"] == 6
    assert added["added"]["norms"] == pytest.approx(sides[1]["median_s"] / sides[0]["median_s"] - 1)


def test_series_throughput_runs_on_a_tiny_series(shared_data, random_tiny, tmp_path, capsys):
    from benchmarks import series_throughput

    ckpt, _ = random_tiny
    series_throughput.main(["--ckpt", ckpt, "--checkpoints", "2", "--glue-dir", str(shared_data / "glue"), "--n", "4",
                            "--batch-size", "4", "--cache-dir", str(tmp_path)])  # fmt: skip
    track, forward, ratio = json_lines(capsys.readouterr().out)
    assert (track["side"], forward["side"], track["checkpoints"], track["n"]) == ("track", "forward_only", 2, 4)
    stages = ("load", "scoring", "tests", "cache_writes", "tables", "rest")
    assert all(track[s] >= 0 for s in stages) and track["total_s"] == pytest.approx(
        sum(track[s] for s in stages), abs=2e-3
    )
    assert track["checkpoints_per_min"] == pytest.approx(2 / track["total_s"] * 60, rel=1e-3)
    # The lines round seconds to 1 ms; the ratio is of the unrounded ones: its error from rounding
    # both by up to 0.5 ms is at most 0.0005 · (1 + scoring / forward) / forward.
    scoring, total = track["scoring"], forward["total_s"]
    rounding = 0.0005 * (1 + scoring / total) / total
    assert ratio["scoring_over_forward"] == pytest.approx(scoring / total, rel=1e-6, abs=rounding)


def test_scale_runs_on_a_tiny_shape(shared_data, random_tiny, tmp_path, capsys):
    from benchmarks import scale

    ckpt, _ = random_tiny
    scale.main(["--ckpt", ckpt, "--task", "sst2", "--glue-dir", str(shared_data / "glue"), "--n", "6",
                "--batch-size", "4", "--repeat", "1", "--cache-dir", str(tmp_path)])  # fmt: skip
    unsharded, one, overhead = json_lines(capsys.readouterr().out)  # this process has one device
    assert (unsharded["side"], unsharded["devices"], one["side"], one["devices"]) == ("unsharded", None, "devices=1", 1)
    assert one["n_sequences"] == 6 and one["sequences_per_s"] == pytest.approx(6 / one["median_s"])
    assert one["max_relative_difference"] <= 1e-6  # one device, the same program: the same numbers
    assert overhead["overhead"] == pytest.approx(one["median_s"] / unsharded["median_s"] - 1)


def test_roles_memory_runs_on_a_tiny_shape(shared_data, random_tiny, capsys):
    from benchmarks import roles_memory

    ckpt, _ = random_tiny
    roles_memory.main(["--ckpt", ckpt, "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--sizes", "4", "8"])
    small, large, ratio = json_lines(capsys.readouterr().out)
    assert (small["n"], large["n"]) == (4, 8) and small["peak_rss_mib"] > 100
    assert ratio["rss_ratio"] == pytest.approx(large["peak_rss_mib"] / small["peak_rss_mib"])


def test_input_pipeline_runs_on_a_tiny_shape(shared_data, capsys):
    import os

    from benchmarks import input_pipeline

    cores = os.sched_getaffinity(0)
    input_pipeline.main(
        ["--data", str(shared_data), "--max-documents", "3", "--batch-size", "8", "--batches", "4", "--repeat", "1"]
    )
    assert os.sched_getaffinity(0) == cores  # pinned to one core only while it measures
    prepared, delivered = json_lines(capsys.readouterr().out)
    assert prepared["documents"] == 3 and prepared["instances"] > 8
    assert prepared["tokenize_tokens_per_s"] > prepared["tokens_per_s"] > 0
    assert delivered["sequences_per_s"] == pytest.approx(4 * 8 / delivered["median_s"])


def test_step_profile_runs_on_a_tiny_shape(tmp_path, capsys):
    from benchmarks import step_profile

    step_profile.main(["--preset", "tiny", "--batch-size", "2", "--seq-len", "16", "--dtype", "float32",
                       "--repeat", "1", "--parts", "forward,step", "--trace", str(tmp_path)])  # fmt: skip
    forward, step = json_lines(capsys.readouterr().out)
    assert (forward["part"], step["part"]) == ("forward", "step")
    assert all(r["runs"] == 1 and r["median_s"] > 0 and r["compile_s"] > 0 for r in (forward, step))
    assert len(list((tmp_path / "step").rglob("*.xplane.pb"))) == 1


def test_trace_kernels_sorts_kernels_by_kind():
    from benchmarks.trace_kernels import kind

    assert kind("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT") == kind("gemm_fusion_dot_530") == "matmul"
    assert kind("input_scatter_fusion_1") == "scatter"
    assert kind("input_add_reduce_fusion_8") == "reduction fusion"
    assert kind("loop_convert_multiply_fusion_11") == "other fusion"


def test_a_stage_budget_is_cut_to_what_is_left_of_the_device_call():
    """benchmarks/call_budget.sh, which both device scripts source: a stage gets its budget or what
    is left of the call less its grace, whichever is less, and no limit without a call limit."""
    script = (f"source {ROOT / 'benchmarks' / 'call_budget.sh'}; "
              "call_start ''; call_budget 300 15; "
              "call_start 100; call_budget 300 15; call_budget 50 15; "
              "call_start 10; call_budget 300 15")  # fmt: skip
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    unlimited, cut, within, spent = (int(word) for word in result.stdout.split())
    assert unlimited == 300
    assert 84 <= cut <= 85  # 100 − 15, less a second if the clock ticked in between
    assert within == 50
    assert spent == 1


@pytest.mark.slow
def test_the_gpu_session_script_runs_at_tiny_sizes_on_the_cpu(shared_data, tmp_path):
    """benchmarks/gpu.sh, prepare then run, as on a lent GPU but tiny (BERTJAX_GPU_TINY): so that a
    typo costs seconds here, not the first call of a session's 15 minutes of device time."""
    env = os.environ | {
        "BERTJAX_GPU_TINY": "1",
        "BERTJAX_GPU_DIR": str(tmp_path / "carry"),
        "BERTJAX_GPU_WORK": str(tmp_path / "work"),
        "BERTJAX_DATA": str(shared_data),
        "PYTHON": sys.executable,
        "JAX_PLATFORMS": "cpu",
    }
    for argv in (["prepare"], ["run", str(tmp_path / "out"), "all"]):
        result = subprocess.run(["bash", "benchmarks/gpu.sh", *argv], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=1800, check=False)  # fmt: skip
        assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "out"
    stages = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()]
    assert [s["stage"] for s in stages] == [
        "6a",
        "6b-cold",
        "6b-warm",
        "6a-rbg",
        "6a-attn0",
        "8",
        "14",
        "emergence",
        "track",
    ]
    assert all(s["rc"] == 0 for s in stages), stages
    assert json.loads((out / "env.json").read_text())["devices"]
    rows = {name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()] for name in
            ("6a", "6b", "8", "14")}  # fmt: skip
    assert [row["side"] for row in rows["6b"]].count("ratio") == 2, rows["6b"]  # the cold and the warm process
    assert all(row["stages_s"] for row in rows["6b"] if row["side"] == "roles_end_to_end")
    # bertjax beside both torch baselines, in one process: a step line each, and a ratio to each.
    default = [row for row in rows["6a"] if row["dropout_rng"] == "threefry2x32"]
    assert {row["backend"] for row in default if "speedup" not in row} == {"bertjax", "torch", "torch-compile"}
    assert sorted(row["baseline"] for row in default if "speedup" in row) == ["torch", "torch-compile"]
    # Then the variants: rbg masks alone, and with attention dropout 0 beside torch.compile.
    variants = {(row["attention_dropout"], row["backend"], row.get("baseline")) for row in rows["6a"]
                if row["dropout_rng"] == "rbg"}  # fmt: skip
    assert variants == {(0.1, "bertjax", None), (0.0, "bertjax", None), (0.0, "torch-compile", None),
                        (0.0, "bertjax", "torch-compile")}, variants  # fmt: skip
    assert rows["8"]
    # The intervene section's cost: each steering's ratio to the unsteered step, in the same call.
    assert sorted(row["variant"] for row in rows["14"] if "cost" in row) == ["cls", "positional"]
    with tarfile.open(out / "emergence.tar.gz") as tar:
        names = tar.getnames()
    assert "emergence-gpu/run.json" in names and any(name.startswith("track/") for name in names), names
    # What comes back from the device machine: at most 8 files, none further down.
    assert len(list(out.iterdir())) <= 8 and all(path.is_file() for path in out.iterdir())


def test_the_emergence_seeds_script_runs_at_tiny_sizes_on_the_cpu(shared_data, tmp_path, docs_script):
    """benchmarks/emergence_seeds.sh, prepare then run, both recipes' sets (BERTJAX_SEEDS_TINY): the
    commands a lent GPU or a CPU afternoon runs, checked in seconds; each run comes back as a tarball
    with its track and its config, never its checkpoints, every run of every set scored on the one
    held-out folder prepared with the MLM data."""
    env = os.environ | {
        "BERTJAX_SEEDS_TINY": "1",
        "BERTJAX_SEEDS_DIR": str(tmp_path / "carry"),
        "BERTJAX_SEEDS_PREPARED": str(tmp_path / "prepared"),
        "BERTJAX_SEEDS_WORK": str(tmp_path / "work"),
        "BERTJAX_DATA": str(shared_data),
        "PYTHON": sys.executable,
        "JAX_PLATFORMS": "cpu",
    }
    runs = [({}, ["prepare"]), ({}, ["run", str(tmp_path / "out")]),
            ({"BERTJAX_SEEDS_SET": "pre-ln", "BERTJAX_SEEDS_SERIAL": "1"}, ["run", str(tmp_path / "out")]),
            ({"BERTJAX_SEEDS_SET": "steering", "BERTJAX_SEEDS_SERIAL": "1"}, ["run", str(tmp_path / "out")]),
            ({"BERTJAX_SEEDS_SET": "gpu-size", "BERTJAX_SEEDS_DIR": str(tmp_path / "carry-gpu")}, ["prepare"]),
            ({"BERTJAX_SEEDS_SET": "gpu-size", "BERTJAX_SEEDS_DIR": str(tmp_path / "carry-gpu"), "BERTJAX_SEEDS_SERIAL": "1",
              "BERTJAX_SEEDS_GPU_SEEDS": "0 1"}, ["run", str(tmp_path / "out")])]  # fmt: skip
    for extra, argv in runs:
        result = subprocess.run(["bash", "benchmarks/emergence_seeds.sh", *argv], cwd=ROOT, env=env | extra,
                                capture_output=True, text=True, timeout=1800, check=False)  # fmt: skip
        assert result.returncode == 0, result.stderr[-4000:]
    shared_heldout = tmp_path / "prepared" / "mlm" / "heldout-T64"
    for name in ("mlm-s0", "nsp-s0", "preln-s0"):
        with tarfile.open(tmp_path / "out" / f"{name}.tar.gz") as tar:
            names = set(tar.getnames())
            config = tar.extractfile(f"{name}/config.yaml").read().decode()
            metrics = tar.extractfile(f"{name}/metrics.jsonl").read().decode()
        for path in ("run.json", "metrics.jsonl", "track/onset.csv", "track/curve_onsets.csv", "track/sas.csv",
                     "track/track.csv", "track-holm-series/onset.csv"):  # fmt: skip
            assert f"{name}/{path}" in names, (name, path)
        assert not any("checkpoints" in n for n in names), name
        assert ("layer_norm_position: pre" in config) == (name == "preln-s0"), config
        assert ("pair_task: nsp" in config) == (name == "nsp-s0"), config
        assert f"heldout:\n  corpora: []\n  data_dir: {shared_heldout}\n" in config, config
        # The NSP run's pair metrics are not read off the MLM-only held-out set.
        assert "heldout_mlm_loss" in metrics and "heldout_nsp" not in metrics, name
    # The steering set: one seed unsteered and under each intervention, tracked from the window's
    # first step, with the held-out sums its paired comparisons need.
    for name, role in (("plain-s0", None), ("positional-s0", "next"), ("cls-s0", "cls")):
        with tarfile.open(tmp_path / "out" / f"{name}.tar.gz") as tar:
            names = set(tar.getnames())
            config = tar.extractfile(f"{name}/config.yaml").read().decode()
            steps = pd.read_csv(tar.extractfile(f"{name}/track/track.csv"))["step"].unique()
        assert f"{name}/track/events.csv" in names and any(n.startswith(f"{name}/heldout-sequences/") for n in names)
        assert ("intervene:" in config and f"role: {role}" in config) if role else "role: " not in config, config
        assert f"heldout:\n  corpora: []\n  data_dir: {shared_heldout}\n" in config, config
        assert min(steps) == 4, steps
    # What the page reads of them (docs/emergence_steering.py real --from OUT), at the tiny set's steps.
    steering = docs_script("emergence_steering")
    real = steering.RealSet(tmp_path / "committed", steps=6, from_step=4, seeds=(0,))
    assert steering.collect_real(tmp_path / "out", real) == real.runs()
    summary = steering.summarize_real(real)
    assert list(summary["run"]) == ["s0-plain", "s0-positional", "s0-cls"] and (summary["device"] == "cpu").all()
    assert summary["drop_shift"].notna().tolist() == [False, True, True]
    assert summary["loss_vs_plain"].notna().tolist() == [False, True, True]
    assert "of 1 seeds;" in steering.real_table(summary, real)
    assert [line.split(" |")[0] for line in steering.real_role_attention(real).splitlines()[2:]] == [
        "| s0-plain", "| s0-positional", "| s0-cls"
    ]  # fmt: skip
    assert not list((tmp_path / "committed").rglob("checkpoints"))
    # A run folder still training (a CPU's work folder) is skipped, not read.
    (tmp_path / "busy" / "plain-s0").mkdir(parents=True)
    assert steering.collect_real(tmp_path / "busy", steering.RealSet(tmp_path / "busy-committed", seeds=(0,))) == []
    # The gpu-size set: the GPU recipe's config at T = 128, two seeds, each with what its joint
    # intervals need (per-sequence held-out sums, the lead/lag replicates), scored on its own held-out set.
    gpu_heldout = tmp_path / "prepared" / "gpu" / "heldout-T128"
    for name in ("gpu-s0", "gpu-s1"):
        with tarfile.open(tmp_path / "out" / f"{name}.tar.gz") as tar:
            names = set(tar.getnames())
            config = tar.extractfile(f"{name}/config.yaml").read().decode()
        assert {f"{name}/track/events.csv", f"{name}/track/lead_lag_replicates.npz"} <= names, names
        assert any(n.startswith(f"{name}/heldout-sequences/") for n in names)
        assert not any("checkpoints" in n for n in names), name
        assert "max_seq_length: 128" in config and f"seed: {name[-1]}" in config, config
        assert f"heldout:\n  corpora: []\n  data_dir: {gpu_heldout}\n" in config, config


def test_cli_start_times_help_against_a_baseline_tree(capsys):
    from benchmarks import cli_start

    # The baseline is this tree too: the script needs only a directory whose commands run.
    cli_start.main(["--repeat", "1", "--commands", "analysis.ablate", "--baseline", str(ROOT)])
    this, baseline = json_lines(capsys.readouterr().out)
    assert (this["tree"], baseline["tree"]) == ("this", "baseline")
    assert this["command"] == baseline["command"] == "python -m analysis.ablate --help"
    assert this["runs"] == 1 and this["cpu_median_s"] > 0 and this["target_s"] == 1.0


def test_model_load_compares_two_trees(shared_data, capsys):
    """This tree against itself: both sides' loads of a random tiny BERT with a saved tokenizer.json,
    read without transformers, and their ratio."""
    from benchmarks import model_load

    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    model_load.main(["--baseline", str(ROOT), "--preset", "tiny", "--vocab", str(vocab), "--repeat", "1"])
    this, baseline, ratio = json_lines(capsys.readouterr().out)
    for side in (this, baseline):
        assert side["tokenizer"] == "LightTokenizer" and side["runs"] == 1
        assert side["load_s"] == pytest.approx(side["model_s"] + side["tokenizer_s"])
        assert side["load_s"] <= side["process_s"]
    assert ratio["load_ratio"] == pytest.approx(this["load_s"] / baseline["load_s"])


def test_random_run_takes_a_preset_and_sizes(shared_data, tmp_path):
    """The GPU-size recipe's shapes (8 layers × 8 heads, T = 128) with a cheap hidden size: the
    series the track's host-side benchmark scores (BENCHMARKS.md, 2026-11-28)."""
    from benchmarks.track_cache import random_run
    from bertjax.pretrained import load_config, open_checkpoint

    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    run = random_run(tmp_path / "run", vocab, (5, 9), "medium", hidden_size=16, intermediate_size=32)
    for step in (5, 9):
        config = load_config(open_checkpoint(run, step))
        assert (config.num_hidden_layers, config.num_attention_heads) == (8, 8)
        assert (config.hidden_size, config.intermediate_size, config.max_position_embeddings) == (16, 32, 128)
