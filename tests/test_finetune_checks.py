"""Fine-tuning settings are checked before any data work: each bad value below was refused only
after the GLUE data was read and tokenized (or not at all: a traceback, or a setting silently
ignored). The GLUE folder given does not exist, so a check that comes after the data's reading
shows as the missing file's error instead of the setting's."""

from __future__ import annotations

import pytest

from train import finetune

REFUSED = [
    ("data.eval_batch_size=0", "error: data.eval_batch_size must be at least 1, got 0"),
    ("train.global_batch_size=0", "error: train.global_batch_size: must be an integer ≥ 1, got 0"),
    ("train.grad_accum_steps=0", "error: train.grad_accum_steps must be at least 1, got 0"),
    ("train.grad_accum_steps=3",
     "error: train.global_batch_size 32 is not divisible by grad_accum_steps × processes (3 × 1)"),
    # A ZeroDivisionError traceback at the first step.
    ("train.log_every=0", "error: train.log_every: must be an integer ≥ 1, got 0"),
    # numpy's `ValueError: expected non-negative integer` traceback when the batches were shuffled.
    ("train.seed=-1", "error: train.seed: must be an integer ≥ 0, got -1"),
    ("optimizer.name=sgd", "error: optimizer.name: 'sgd' is not lamb or adamw"),
    ("mesh.data=3", "error: mesh: data=3 × fsdp=1 does not match 1 devices"),
    ("mesh.fsdp=0", "error: mesh: data=-1 × fsdp=0 does not match 1 devices"),  # a ZeroDivisionError traceback
    # "unknown split 'foo' (--split)": a flag train.finetune does not have.
    ("data.eval_split=foo", "error: data.eval_split: 'foo' is not one of dev, validation, train (test has no labels)"),
    ("data.eval_split=test", "error: data.eval_split: 'test' is not one of dev, validation, train (test has no labels)"),
    ("data.max_train_examples=0", "error: data.max_train_examples must be at least 1, got 0"),  # "--n must be ≥ 1"
    ("dtype=float8", "error: dtype: 'float8' is not one of auto, float32, bfloat16, float16"),  # a JAX traceback
    # Ignored: train.warmup_ratio's steps replaced it whenever they rounded to 0, else a late refusal.
    ("optimizer.warmup_fraction=0.5",
     "error: train.warmup_ratio and optimizer.warmup_fraction are both set; set train.warmup_ratio=null to use warmup_fraction"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "line"), REFUSED, ids=[o for o, _ in REFUSED])
def test_a_bad_setting_is_refused_before_the_data_is_read(tiny_hf, tmp_path, cli_error, override, line):
    workdir = tmp_path / "w"
    # The files exist (train.finetune checks that before its heavy imports), but reading them fails.
    glue = tmp_path / "glue"
    (glue / "MRPC").mkdir(parents=True)
    for split in ("train", "dev"):
        (glue / "MRPC" / f"{split}.tsv").write_text("not\ta GLUE header\n")
    argv = ["--task", "mrpc", "--ckpt", str(tiny_hf), "--workdir", str(workdir), "--glue-dir", str(glue), override]
    assert cli_error(finetune.main, argv) == line
    assert list(tmp_path.iterdir()) == [glue]


def test_with_good_settings_the_missing_data_is_what_is_refused(tiny_hf, tmp_path, cli_error):
    """The control: the settings pass, and the folder that does not exist is the error."""
    argv = [
        "--task",
        "mrpc",
        "--ckpt",
        str(tiny_hf),
        "--workdir",
        str(tmp_path / "w"),
        "--glue-dir",
        str(tmp_path / "no-glue"),
    ]
    assert cli_error(finetune.main, argv).startswith("error: GLUE file not found")
