"""Pre-training settings are checked before any data work (phase 2's included), and a two-phase run
with a trained vocabulary runs end to end; the micro config here is `configs/pretrain/synthetic.yaml`
cut down to seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

MICRO = """\
model: {{preset: tiny, hidden_size: 64, max_position_embeddings: 32, hidden_dropout_prob: 0.0, attention_probs_dropout_prob: 0.0}}
data:
  corpora:
    - {{name: synthetic, source: local, path: {text}, kind: plain}}
  train_vocab: true
  vocab_size: 160
  max_seq_length: 32
  max_predictions_per_seq: 5
  segmenter: sentencizer
  short_seq_prob: 0.0
train: {{steps: 4, global_batch_size: 8, seed: 0, log_every: 1}}
optimizer: {{name: adamw, learning_rate: 2.0e-3, warmup_steps: 1}}
checkpoint: {{every: 2, keep: 2}}
"""
PHASE2 = "phase2: {steps: 2, max_seq_length: 32, max_predictions_per_seq: 5, global_batch_size: 8, learning_rate: 1.0e-3, warmup_steps: 1}\n"  # fmt: skip


def write_micro(directory: Path, phase2: bool = False) -> Path:
    """micro.yaml (micro2.yaml with `phase2`) over a small synthetic text, in `directory`."""
    from train import synthetic

    text = directory / "text"
    if not text.exists():
        synthetic.write(text, words=64, successors=2, tokens=6000, seed=0, heldout_tokens=1000)
    config = directory / ("micro2.yaml" if phase2 else "micro.yaml")
    config.write_text(MICRO.format(text=text / "train.txt") + (PHASE2 if phase2 else ""))
    return config


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    return write_micro(tmp_path_factory.mktemp("micro"))


@pytest.fixture(scope="module")
def micro2(micro) -> Path:
    return write_micro(micro.parent, phase2=True)


def _refused(cli_error, config: Path, workdir: Path, *overrides: str) -> str:
    """The one line of a run refused in a workdir the user made (kept, so that it shows what the
    run wrote before refusing: nothing)."""
    from train import pretrain

    workdir.mkdir()
    message = cli_error(pretrain.main, ["--config", str(config), "--workdir", str(workdir), *overrides])
    assert list(workdir.iterdir()) == [], "data was prepared before the refusal"
    return message


def test_probe_roles_the_probe_set_cannot_hold_are_refused_before_data_work(micro, tmp_path, cli_error):
    """Probe 4.3: `block` on single sentences was refused only after the shards were prepared."""
    singles = tmp_path / "singles.txt"
    singles.write_text("The cat sat.\nA dog ran.\nBirds sing.\nIt rains.\n")
    message = _refused(cli_error, micro, tmp_path / "w", f"probe.task=text:{singles}", "probe.roles=[block]",
                       "probe.max_length=32")  # fmt: skip
    assert message == f"error: probe.roles: block need sentence pairs, and text:{singles} has none"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # Probe 4.7
        (["model.layer_norm_position=middle"], "layer_norm_position 'middle' is not one of"),
        # Probe 4.10: refused only once phase 1 had trained
        (["phase2.max_seq_length=64"], "phase2.max_seq_length 64 exceeds model.max_position_embeddings 32"),
        # Probe 4.11: accepted, "phase 2: steps 4 → 1"
        (["phase2.max_seq_length=16", "phase2.steps=-3"], "phase2.steps must be at least 1, got -3"),
        (["phase2.global_batch_size=0"], "phase2.global_batch_size must be at least 1, got 0"),
        (
            ["phase2.max_predictions_per_seq=40"],
            "phase2.max_predictions_per_seq: must be in [1, phase2.max_seq_length 32], got 40",
        ),
        (["phase2.learning_rate=nan"], "phase2.learning_rate: must be a finite number ≥ 0, got nan"),
        (["data.max_seq_length=64"], "data.max_seq_length 64 exceeds model.max_position_embeddings 32"),
        # Found while re-checking issue 42. A JAX traceback once the data was prepared:
        (["model.dtype=float8"], "model.dtype: 'float8' is not one of auto, float32, bfloat16, float16"),
        # Trained on without a word (b1 = 2 diverges; a negative eps or decay turns the update
        # around; a NaN clipping norm makes every update NaN):
        (["optimizer.b1=2"], "optimizer.b1: must be in [0, 1), got 2"),
        (["optimizer.eps=-1"], "optimizer.eps: must be a finite number ≥ 0, got -1"),
        (["optimizer.weight_decay=-1"], "optimizer.weight_decay: must be a finite number ≥ 0, got -1"),
        (["optimizer.max_grad_norm=nan"], "optimizer.max_grad_norm: must be a finite number ≥ 0, got nan"),
        (["optimizer.decay_power=-1"], "optimizer.decay_power: must be a finite number ≥ 0, got -1"),
        (["heldout.batch_size=0"], "heldout.batch_size: must be an integer ≥ 1, got 0"),
        (["heldout.sequences=0"], "heldout.sequences: must be an integer ≥ 1, got 0"),
        # A TypeError traceback (found by mypy): a local held-out corpus without its path.
        (["heldout.corpora=[{name: held}]"], "heldout.corpora.0.path: a local corpus needs a path"),
        (["train.log_every=0"], "train.log_every: must be an integer ≥ 1, got 0"),
        (["train.seed=-1"], "train.seed: must be an integer ≥ 0, got -1"),
        (["mesh.fsdp=0"], "mesh: data=-1 × fsdp=0 does not match 1 devices"),  # a ZeroDivisionError traceback
        # Accepted and ignored:
        (["checkpoint.log_spaced=-1"], "checkpoint.log_spaced: must be an integer ≥ 0, got -1"),
        (["checkpoint.steps=[-5]"], "checkpoint.steps: steps are integers ≥ 0, got -5"),
        # A numpy ValueError traceback at the second save, after the data was prepared:
        (["checkpoint.keep=-1"], "checkpoint.keep: must be an integer ≥ 0 or null (all), got -1"),
    ],
)
def test_settings_are_refused_before_any_data_work(micro2, tmp_path, cli_error, overrides, expected):
    message = _refused(cli_error, micro2, tmp_path / "w", *overrides)
    assert message.startswith(f"error: {expected}"), message


@pytest.mark.slow
def test_two_phases_at_one_length_with_a_trained_vocabulary_run_end_to_end(micro2, tmp_path):
    """Probe 4.9 (a regression): phase 2 got phase 1's trained vocabulary as its `vocab_file`, so
    the shards both phases share were refused ("prepared with other data settings … delete it")."""
    import bertjax
    from bertjax import cli
    from train import pretrain

    workdir = tmp_path / "w"
    cli.run(pretrain.main, ["--config", str(micro2), "--workdir", str(workdir)])
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == 6  # 4 steps of phase 1, then 2 of phase 2
    assert sorted(p.name for p in workdir.glob("data-*")) == ["data-T32"]  # one set of shards
    vocab = (workdir / "data-T32" / "vocab.txt").read_text().splitlines()
    assert len(bertjax.load_tokenizer(workdir)) == len(vocab)
    assert bertjax.from_pretrained(workdir, step=6).config.vocab_size == len(vocab)


def test_a_negative_synthetic_seed_is_one_line(tmp_path, cli_error):
    """Probe 4.17: `ValueError: expected non-negative integer` from numpy."""
    from train import synthetic

    assert (
        cli_error(synthetic.main, ["--out", str(tmp_path / "syn"), "--seed", "-1"])
        == "error: --seed must be ≥ 0, got -1"
    )
    assert list(tmp_path.iterdir()) == []
