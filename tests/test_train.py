"""Pre-training end to end: smoke run into analysis, exact resume after SIGKILL, preemption,
corrupt checkpoints, sharding on 8 fake devices, and the one-line errors."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import bertjax
from bertjax import checkpoint as ckpt
from bertjax import cli
from bertjax.errors import UserError
from train import pretrain

ROOT = Path(__file__).resolve().parents[1]
BOOKS = ("carroll-alice.txt", "blake-poems.txt", "shakespeare-caesar.txt")


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> Path:
    """Three staged Gutenberg books (one of them Latin-1) as a folder of documents."""
    folder = tmp_path_factory.mktemp("corpus")
    for name in BOOKS:
        (folder / name).symlink_to(shared_data / "gutenberg" / name)
    return folder


def _overrides(corpus: Path, steps: int, **extra) -> list[str]:
    """A tiny run: a 1,000-piece WordPiece vocabulary trained on the corpus keeps steps fast."""
    settings = {
        "data.corpora": f"[{{name: books, source: local, path: {corpus}, kind: gutenberg}}]",
        "data.train_vocab": "true",
        "data.vocab_size": "1000",
        "data.max_seq_length": "64",
        "data.max_predictions_per_seq": "10",
        "data.segmenter": "sentencizer",
        "model.max_position_embeddings": "64",
        "train.steps": str(steps),
        "train.global_batch_size": "8",
        "train.log_every": "2",
        "optimizer.warmup_steps": "2",
        "checkpoint.every": "4",
        "checkpoint.keep": "null",
        "checkpoint.log_spaced": "0",
        **extra,
    }
    return [f"{k}={v}" for k, v in settings.items()]


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> Path:
    """Shards prepared once and shared by the runs below (data_dir=...)."""
    workdir = tmp_path_factory.mktemp("prep")
    config = bertjax_config(_overrides(corpus, 1))
    return pretrain.prepared_data(config.data, workdir / "data", None)


def bertjax_config(overrides: list[str]) -> pretrain.PretrainConfig:
    from bertjax.settings import load_config

    return load_config(pretrain.PretrainConfig, ROOT / "configs/pretrain/tiny.yaml", overrides)


def _train_command(workdir: Path, corpus: Path, prepared: Path, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "train.pretrain", "--config", str(ROOT / "configs/pretrain/tiny.yaml"),
        "--workdir", str(workdir), *_overrides(corpus, steps, data_dir=str(prepared)), *extra,
    ]  # fmt: skip


def _params(workdir: Path, step: int | None = None) -> dict[str, np.ndarray]:
    model = bertjax.from_pretrained(workdir, bertjax.BertForPreTraining, step=step)
    return {k: np.asarray(v) for k, v in ckpt.flatten_params(nnx.state(model, nnx.Param)).items()}


@pytest.fixture(scope="module")
def smoke_run(corpus, prepared, tmp_path_factory) -> Path:
    """A 12-step run saving 3 checkpoints; what it printed is in smoke.log beside the workdir."""
    workdir = tmp_path_factory.mktemp("smoke")
    # Bytes: text mode would turn the progress bar's carriage returns into newlines.
    result = subprocess.run(_train_command(workdir, corpus, prepared, 12), check=True, cwd=ROOT, timeout=600,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    (workdir.parent / "smoke.log").write_bytes(result.stdout)
    return workdir


def library_info_lines(output: str) -> list[str]:
    """The lines logged at INFO by loggers other than bertjax's own (see `cli.OWN_LOGGERS`)."""
    own = "|".join(cli.OWN_LOGGERS)
    return re.findall(rf"^.* INFO (?!(?:{own})[.:]).*$", output, flags=re.MULTILINE)


@pytest.mark.slow  # the `smoke_run` fixture pre-trains in a subprocess: ~26 s of CPU
def test_a_run_says_what_it_does_and_hides_library_info_lines(smoke_run):
    # Lines as a terminal shows them: a progress bar redraws its line after a carriage return.
    lines = (smoke_run.parent / "smoke.log").read_bytes().decode().rstrip("\n").split("\n")
    assert "INFO train.pretraining: pre-training a tiny BERT for 12 steps of 8 sequences (T = 64)" in lines[0]
    assert library_info_lines("\n".join(lines)) == []
    # The last says where the checkpoints are (issue 52: no line did).
    assert lines[-1] == f"checkpoints in {smoke_run / 'checkpoints'} (3 saved, steps 4 to 12)"
    # The first line, phase 1's, the progress bar's, one per evaluation and the last: orbax alone
    # wrote about 40 lines per checkpoint (3 here).
    assert len(lines) <= 9, "\n".join(lines)


def test_the_last_line_names_the_checkpoints_saved(tmp_path):
    from train.checkpoints import saved_line

    directory = tmp_path / ckpt.CHECKPOINTS
    assert saved_line(tmp_path) == f"no checkpoint saved in {directory}"
    (directory / "30" / ckpt.META).mkdir(parents=True)
    (directory / "7.orbax-checkpoint-tmp-1").mkdir()  # a partial save is no step
    assert saved_line(tmp_path) == f"checkpoints in {directory} (1 saved, step 30)"
    for step in (100, 4):
        (directory / str(step) / ckpt.META).mkdir(parents=True)
    assert saved_line(tmp_path) == f"checkpoints in {directory} (3 saved, steps 4 to 100)"


@pytest.mark.slow  # a pre-training subprocess: ~17 s of CPU
def test_verbose_shows_library_info_lines(corpus, prepared, tmp_path):
    command = _train_command(tmp_path / "run", corpus, prepared, 2, "checkpoint.every=1", "--verbose")
    result = subprocess.run(command, check=True, cwd=ROOT, timeout=600, capture_output=True, text=True)
    shown = library_info_lines(result.stderr)
    assert any(" INFO absl: " in line for line in shown), result.stderr  # orbax's
    assert any(" INFO jax." in line for line in shown), result.stderr  # jax's backend probing


@pytest.mark.slow  # the `smoke_run` fixture, when run alone
def test_pretraining_writes_checkpoints_metrics_and_run_info(smoke_run):
    steps = sorted(int(p.name) for p in (smoke_run / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [4, 8, 12]
    lines = (smoke_run / "metrics.jsonl").read_text().splitlines()
    import json

    records = [json.loads(line) for line in lines]
    assert records[-1]["step"] == 12
    for key in (
        "loss",
        "mlm_accuracy",
        "nsp_accuracy",
        "learning_rate",
        "grad_norm",
        "tokens_per_s",
        "sequences_per_s",
    ):
        assert np.isfinite(records[-1][key]), key
    assert (smoke_run / "config.yaml").is_file() and (smoke_run / "run.json").is_file()
    assert list((smoke_run / "tensorboard").iterdir())


@pytest.mark.slow  # the `smoke_run` fixture, when run alone
def test_analysis_runs_on_a_pretraining_checkpoint(smoke_run, shared_data, tmp_path):
    from analysis import roles

    out = tmp_path / "roles"
    roles.main(["--ckpt", str(smoke_run), "--step", "8", "--task", "mrpc", "--glue-dir", str(shared_data / "glue"),
                "--n", "8", "--batch-size", "8", "--out", str(out), "--no-figures", "--cache-dir", str(tmp_path / "c")])  # fmt: skip
    import json

    run = json.loads((out / "run.json").read_text())
    assert run["checkpoint"]["kind"] == "orbax" and run["checkpoint"]["step"] == 8
    assert (out / "roles.csv").is_file()


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(corpus, prepared, smoke_run, tmp_path):
    workdir = tmp_path / "killed"
    process = subprocess.Popen(_train_command(workdir, corpus, prepared, 12), cwd=ROOT)
    deadline = time.time() + 300
    while not (workdir / "checkpoints" / "8").is_dir():
        assert process.poll() is None and time.time() < deadline, "the run ended before step 8"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (workdir / "checkpoints" / "12").exists(), "killed too late to test a resume"
    subprocess.run(_train_command(workdir, corpus, prepared, 12), check=True, cwd=ROOT, timeout=600)
    uninterrupted, resumed = _params(smoke_run), _params(workdir)
    for key in uninterrupted:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_143(corpus, prepared, tmp_path):
    """A preempted run saves after the step it is in, then ends as any terminated command does."""
    workdir = tmp_path / "preempted"
    process = subprocess.Popen(_train_command(workdir, corpus, prepared, 400), cwd=ROOT)
    deadline = time.time() + 300
    while not (workdir / "checkpoints" / "4").is_dir():
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert 4 <= saved < 400
    assert bertjax.from_pretrained(workdir, step=saved) is not None


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(smoke_run, corpus, prepared, tmp_path, caplog):
    import shutil

    workdir = tmp_path / "corrupt"
    shutil.copytree(smoke_run, workdir, symlinks=True)
    (workdir / "corrupt_checkpoints" / "12").mkdir(parents=True)  # set aside by an earlier run: kept
    for file in (workdir / "checkpoints" / "12" / "params").rglob("*"):
        if file.is_file() and file.stat().st_size > 0:
            file.write_bytes(b"\0" * 7)  # truncated, garbage
    config = bertjax_config(_overrides(corpus, 12, data_dir=str(prepared)))
    caplog.set_level("ERROR")
    pretrain.run(config, workdir)
    assert "checkpoint step 12 is corrupt or partial" in caplog.text
    assert sorted(p.name for p in (workdir / "corrupt_checkpoints").iterdir()) == ["12", "12.1"]
    assert (workdir / "corrupt_checkpoints" / "12.1" / "params").is_dir()
    resumed = _params(workdir)  # re-trained 8 → 12 from the good step-8 checkpoint
    for key, value in _params(smoke_run).items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)


def test_non_finite_loss_names_the_step(corpus, prepared, tmp_path, cli_error):
    argv = ["--config", str(ROOT / "configs/pretrain/tiny.yaml"), "--workdir", str(tmp_path / "nan"),
            *_overrides(corpus, 6, data_dir=str(prepared)), "optimizer.learning_rate=3e38", "optimizer.warmup_steps=0", "checkpoint.steps=[1]"]  # fmt: skip
    # A finite rate that overflows the first update (a non-finite rate is refused before training).
    message = cli_error(pretrain.main, argv)
    assert message == "error: non-finite loss or update at step 1; stopping (no checkpoint was written)"
    assert not (tmp_path / "nan" / "checkpoints" / "1").exists()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown_key", "unknown config key 'train.stepz'"),
        ("missing_vocab", "does-not-exist.txt: vocab_file does not exist"),
        ("empty_corpus", "has no text"),
        (
            "other_shape",
            "step 12 was trained with other settings (model.preset: 'tiny' vs 'mini'; train.steps: 12 vs 2)",
        ),
        (
            "other_optimizer",
            "step 12 was trained with other settings (train.steps: 12 vs 2; optimizer.name: 'lamb' vs 'adamw')",
        ),
        ("empty_batch", "train.global_batch_size: must be an integer ≥ 1, got 0"),
    ],
)
def test_bad_input_gives_one_line(case, expected, corpus, prepared, smoke_run, tmp_path, cli_error):
    workdir = tmp_path / "work"
    overrides = _overrides(corpus, 2)
    if case == "unknown_key":
        overrides.append("train.stepz=3")
    elif case == "missing_vocab":
        overrides += ["data.train_vocab=false", f"data.vocab_file={tmp_path / 'does-not-exist.txt'}"]
    elif case == "empty_corpus":
        (tmp_path / "empty").mkdir()
        overrides.append(f"data.corpora=[{{name: e, source: local, path: {tmp_path / 'empty'}, kind: plain}}]")
    elif case == "other_shape":
        import shutil

        shutil.copytree(smoke_run / "checkpoints", workdir / "checkpoints")
        overrides += [f"data_dir={prepared}", "model.preset=mini"]
    elif case == "other_optimizer":
        import shutil

        shutil.copytree(smoke_run / "checkpoints", workdir / "checkpoints")
        overrides += [f"data_dir={prepared}", "optimizer.name=adamw"]
    elif case == "empty_batch":  # refused with the settings, before any data is read
        overrides += [f"data_dir={prepared}", "train.global_batch_size=0"]
    argv = ["--config", str(ROOT / "configs/pretrain/tiny.yaml"), "--workdir", str(workdir), *overrides]
    message = cli_error(pretrain.main, argv)
    assert message.startswith("error: ") and expected in message, message
    assert not (workdir / "corrupt_checkpoints").exists()


def test_shards_prepared_with_other_data_settings_are_refused(corpus, prepared):
    """A workdir's shards are reused only under the settings they were made with: whole-word
    masking asked for later would otherwise train on the old, token-masked shards."""
    config = bertjax_config(_overrides(corpus, 1)).data
    assert pretrain.prepared_data(dataclasses.replace(config, segment_workers=2), prepared, None) == prepared
    with pytest.raises(UserError, match=r"prepared with other data settings \(max_predictions_per_seq: 10 vs 12; "
                                        r"whole_word_mask: False vs True\)"):  # fmt: skip
        pretrain.prepared_data(
            dataclasses.replace(config, whole_word_mask=True, max_predictions_per_seq=12), prepared, None
        )


def test_a_checkpoint_without_recorded_settings_is_still_checked_for_shape_and_optimizer(tmp_path):
    """check_resumable names changed settings where a checkpoint records them; where it does not,
    restore_latest still refuses another model shape or another optimizer's state."""
    from train.checkpoints import OPT_SIGNATURE, CheckpointConfig, Checkpointer, check_resumable

    params = {"w": np.zeros(2, np.float32)}
    saved = {"param_shapes": {"w": [[2], "float32"]}, OPT_SIGNATURE: "adamw"}
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(every=1, keep=None, log_spaced=0), 10)
    checkpointer.save(1, params, {"m": params["w"]}, {"step": 1}, saved)
    check_resumable(tmp_path, {"train": {"seed": 1}})  # nothing recorded: nothing to compare
    for meta, message in (({**saved, "param_shapes": {"w": [[3], "float32"]}}, "another model shape"),
                          ({**saved, OPT_SIGNATURE: "lamb"}, "the state of another optimizer")):  # fmt: skip
        with pytest.raises(UserError, match=message):
            checkpointer.restore_latest(params, {"m": params["w"]}, meta)
    checkpointer.close()


def test_a_later_phase_keeps_the_steps_an_earlier_phase_kept(tmp_path):
    from train.checkpoints import CheckpointConfig, Checkpointer

    params, meta = {"w": np.zeros(2, np.float32)}, {"param_shapes": {}}
    config = CheckpointConfig(every=100, keep=1, log_spaced=6)

    def phase(total, first_step, saves):
        checkpointer = Checkpointer(tmp_path, config, total, first_step=first_step)
        for step in saves:
            if checkpointer.should_save(step):
                checkpointer.save(step, params, {"m": params["w"]}, {"step": step}, meta)
        kept = checkpointer.steps()
        checkpointer.close()
        return kept

    assert phase(300, 0, range(1, 301)) == [1, 3, 10, 31, 96, 300]
    # Phase 2's own log-spaced steps over 1…310 would be 1, 3, 10, 31, 97, 310.
    assert phase(310, 300, range(301, 311)) == [1, 3, 10, 31, 96, 300, 310]


SHARDED_CHECK = r"""
import sys, jax, numpy as np
from pathlib import Path
from bertjax import sharding
from train.checkpoints import CheckpointConfig
from train.data import PretrainingData
from train.losses import pretraining_loss
from train.optim import OptimizerConfig
from train.pretrain import ModelSettings, model_config
from train.trainer import LoopConfig, Trainer
from bertjax.model import BertForPreTraining

assert jax.device_count() == 8
data_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
sharding.MIN_SHARDED_BYTES = 0  # the tiny model's arrays are KBs: split them anyway, to test the split
config = model_config(ModelSettings(max_position_embeddings=64), 1000)

def train(devices, data, fsdp, name):
    trainer = Trainer(workdir=work / name, model_config=config, model_cls=BertForPreTraining, loss_fn=pretraining_loss,
                      optimizer=OptimizerConfig(warmup_steps=1), loop=LoopConfig(steps=3, global_batch_size=8, grad_accum_steps=2),
                      checkpoint=CheckpointConfig(every=0), mesh=sharding.make_mesh(sharding.MeshConfig(data, fsdp), devices),
                      run_config={}, tokenizer="tokenizer")
    state, _ = trainer.restore_or_init()
    batches = PretrainingData(data_dir, 8, seed=0)
    key = jax.random.key(0)
    for _ in range(3):
        state, _ = trainer._step_fn(state, sharding.global_batch(next(batches), trainer.mesh), key)
    sharded = [s.spec for s in jax.tree.leaves(jax.tree.map(lambda x: x.sharding, state["params"]))]
    return jax.device_get(state["params"]), sharded

from bertjax.errors import UserError
try:
    Trainer(workdir=work / "uneven", model_config=config, model_cls=BertForPreTraining, loss_fn=pretraining_loss,
            optimizer=OptimizerConfig(), loop=LoopConfig(steps=1, global_batch_size=12), checkpoint=CheckpointConfig(),
            mesh=sharding.make_mesh(sharding.MeshConfig()), run_config={}, tokenizer="tokenizer")
    raise AssertionError("a batch of 12 over 8 devices was accepted")
except UserError as e:
    assert "train.global_batch_size 12 must be a positive multiple of the 8 devices" in str(e), e

single, _ = train(jax.devices()[:1], 1, 1, "single")
multi, specs = train(jax.devices(), 2, 4, "multi")
assert any("fsdp" in str(s) for s in specs), "nothing was sharded over fsdp"
worst = max(float(np.max(np.abs(single[k] - multi[k]))) for k in single)
assert worst <= 1e-5, worst
print("max abs diff", worst)
"""


@pytest.mark.slow
def test_sharded_step_equals_single_device_step(prepared, tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", SHARDED_CHECK, str(prepared), str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "max abs diff" in result.stdout


def test_log_spaced_steps():
    from train.checkpoints import log_spaced_steps

    assert log_spaced_steps(6, 300) == [1, 3, 10, 31, 96, 300]
    assert log_spaced_steps(0, 300) == [] and log_spaced_steps(3, 1) == [1]
    assert jax.device_count() >= 1


def test_flops_and_mfu_follow_the_design_convention():
    """6·N + 12·L·T·d training FLOPs per token, N counted as HF counts BertForPreTraining's
    parameters (the tied decoder once), and MFU against every device's peak together."""
    import torch
    import transformers

    from bertjax.model import BertForPreTraining
    from train.metrics import flops_per_token, throughput

    def count(config):
        abstract = nnx.eval_shape(lambda: BertForPreTraining(config, rngs=nnx.Rngs(0)))
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))

    base = bertjax.preset("base")
    assert count(base) == 110_106_428  # bert-base-uncased's BertForPreTraining
    tiny = bertjax.preset("tiny")
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**tiny.to_hf_dict("BertForPreTraining")))
    assert count(tiny) == hf.num_parameters()
    assert flops_per_token(base, 110_106_428, 128) == 6 * 110_106_428 + 12 * 12 * 128 * 768
    rates = throughput(10, 2.0, 256, tokens=10 * 256 * 128, flops=4e15, peak=989e12, devices=2)
    # float64 products and quotients of a few exact inputs: approx's rel 1e-6 is ~10⁹ ulps.
    assert rates == pytest.approx(
        {"steps_per_s": 5.0, "sequences_per_s": 1280.0, "tokens_per_s": 163_840.0, "mfu": 4e15 / 2.0 / (2 * 989e12)}
    )
    assert "mfu" not in throughput(1, 1.0, 1, tokens=1, flops=1, peak=None, devices=1)


def test_probe_and_heldout_settings_may_change_on_a_resume_the_recipe_may_not():
    """A run from before probes existed (no `probe` section recorded) resumes with probes on; a
    recipe option (what is trained) may not change."""
    from train.checkpoints import setting_changes

    before = {"train": {"steps": 10}, "model": {"layer_norm_position": "post"}}
    now = {**before, "probe": {"task": "mrpc", "every": 200}, "heldout": {"sequences": 8}}
    assert setting_changes(before, now) == []
    changed = setting_changes(before, {**now, "model": {"layer_norm_position": "pre"}})
    assert len(changed) == 1 and "model.layer_norm_position" in changed[0]


@pytest.mark.slow  # two 2-step runs in this process: ~15 s of CPU
def test_matmul_precision_is_recorded_and_float32_trains_as_the_default_on_a_cpu(corpus, prepared, tmp_path):
    """`model.matmul_precision` lands in run.json and config.yaml; on a CPU, where JAX's default is
    true float32, `float32` trains bit for bit as `default` (every run before the setting)."""
    import json

    params = {}
    for precision in ("default", "float32"):
        workdir = tmp_path / precision
        pretrain.main(["--config", str(ROOT / "configs/pretrain/tiny.yaml"), "--workdir", str(workdir),
                       *_overrides(corpus, 2, data_dir=str(prepared), **{"model.matmul_precision": precision})])  # fmt: skip
        assert json.loads((workdir / "run.json").read_text())["config"]["model"]["matmul_precision"] == precision
        assert f"matmul_precision: {precision}" in (workdir / "config.yaml").read_text()
        params[precision] = _params(workdir)
    for name, value in params["default"].items():
        np.testing.assert_array_equal(params["float32"][name], value, err_msg=name, strict=True)


def test_a_run_recorded_before_matmul_precision_resumes_at_default_only():
    from train.checkpoints import setting_changes

    before = {"model": {"dtype": "float32"}}
    assert setting_changes(before, {"model": {"dtype": "float32", "matmul_precision": "default"}}) == []
    changed = setting_changes(before, {"model": {"dtype": "float32", "matmul_precision": "float32"}})
    assert changed == ["model.matmul_precision: 'default' vs 'float32'"]
    assert setting_changes({"dtype": "auto"}, {"dtype": "auto", "matmul_precision": "default"}) == []


@pytest.mark.parametrize(
    "precision,expected", [("default", None), ("float32", "highest"), ("bfloat16", "BF16_BF16_F32")]
)
def test_the_trainer_runs_under_its_matmul_precision(precision, expected, monkeypatch):
    """Everything `Trainer.run` calls (the step, the evaluations, the probes) is traced under the
    run's precision, jit keying its cache on it; "default" leaves JAX's own."""
    from train.trainer import Trainer

    seen = []
    monkeypatch.setattr(Trainer, "_run", lambda self, make_data, **hooks: seen.append(jax.config.jax_default_matmul_precision))  # fmt: skip
    trainer = object.__new__(Trainer)
    trainer.matmul_precision = precision
    trainer.run(None, evaluate=None)
    assert seen == [expected] and jax.config.jax_default_matmul_precision is None


def test_an_unknown_matmul_precision_is_one_line():
    with pytest.raises(
        UserError, match=r"^model.matmul_precision: 'tf16' is not one of default, float32, tf32, bfloat16$"
    ):
        bertjax_config(["model.matmul_precision=tf16"])


@pytest.mark.slow  # prepares and trains two phases: ~21 s of CPU
def test_phase_two_tokenises_with_phase_ones_trained_vocabulary(shared_data, tmp_path):
    """BERT's two-phase recipe on a vocabulary trained from the corpora: phase 2 (T = 64) reads
    phase 1's vocab.txt, not a vocabulary trained again (another numbering, or other tokens,
    under the embeddings phase 1 trained), and both phases train."""
    import json

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes((shared_data / "gutenberg" / "blake-poems.txt").read_bytes()[:20000])
    config = tmp_path / "two-phase.yaml"
    config.write_text(
        (ROOT / "configs/pretrain/tiny.yaml").read_text()
        + "\nphase2: {steps: 2, max_seq_length: 64, max_predictions_per_seq: 10, global_batch_size: 8, warmup_steps: 0}\n"
    )
    workdir = tmp_path / "work"
    pretrain.main([
        "--config", str(config), "--workdir", str(workdir),
        f"data.corpora=[{{name: books, source: local, path: {corpus}, kind: gutenberg}}]", "data.train_vocab=true",
        "data.vocab_size=300", "data.max_seq_length=32", "data.max_predictions_per_seq=5",
        "data.segmenter=sentencizer", "model.max_position_embeddings=64", "model.num_hidden_layers=1",
        "model.hidden_size=32", "model.num_attention_heads=2", "train.steps=2", "train.global_batch_size=8",
        "checkpoint.every=0", "checkpoint.log_spaced=0",
    ])  # fmt: skip
    first, second = workdir / "data-T32", workdir / "data-T64"
    assert (second / "vocab.txt").read_bytes() == (first / "vocab.txt").read_bytes()
    meta = json.loads((second / "meta.json").read_text())
    assert meta["config"]["train_vocab"] is False and meta["config"]["vocab_file"] == str(
        (first / "vocab.txt").resolve()
    )
    assert json.loads((workdir / "run.json").read_text())["phase"] == 2
    assert (workdir / "checkpoints" / "4").is_dir()  # phase 2's last step: 2 + 2


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs" / "pretrain").glob("*.yaml")))
def test_pretrain_configs_find_the_staged_data_through_bertjax_data(name, monkeypatch, tmp_path):
    from bertjax.settings import load_config

    def paths() -> list[str]:
        config = load_config(pretrain.PretrainConfig, ROOT / "configs" / "pretrain" / name)
        return [c.path or "" for c in [*config.data.corpora, *config.heldout.corpora]] + [config.data.vocab_file or ""]

    monkeypatch.delenv("BERTJAX_DATA", raising=False)
    default = paths()
    monkeypatch.setenv("BERTJAX_DATA", str(tmp_path))
    # Every staged path moves under BERTJAX_DATA; any other path stays as written.
    assert paths() == [
        f"{tmp_path}/{p.removeprefix('../shared/data/')}" if p.startswith("../shared/data/") else p for p in default
    ]
