"""`train.dropout_rng`: the generator of pre-training's dropout masks. rbg (XLA's RngBitGenerator)
draws other masks than JAX's default threefry2x32, deterministically given the seed; a resume under
the other generator is refused, and a run recorded before the setting existed resumes as threefry."""

from __future__ import annotations

import pytest

from benchmarks.train_step import BertjaxStep, make_batch
from bertjax.config import preset
from bertjax.errors import UserError
from bertjax.settings import load_config
from train.checkpoints import setting_changes
from train.config import PretrainConfig


def _losses(dropout_rng: str, workdir) -> list[float]:
    """The loss of two compiled pre-training steps from the same init and batch (dropout on)."""
    config = preset("tiny", max_position_embeddings=64)
    step = BertjaxStep(config, make_batch(config, 4, 32, seed=0), workdir, dropout_rng)
    losses = []
    try:
        for _ in range(2):
            step()
            losses.append(step.loss())
    finally:
        step.close()
    return losses


def test_rbg_draws_other_dropout_masks_and_the_same_ones_again(tmp_path):
    threefry = _losses("threefry2x32", tmp_path / "a")
    assert _losses("threefry2x32", tmp_path / "b") == threefry
    rbg = _losses("rbg", tmp_path / "c")
    assert _losses("rbg", tmp_path / "d") == rbg
    # Same init, batch and seed: only the masks differ, so the first loss already does. A trainer
    # that ignored the setting (the planted bug) would give threefry's losses here.
    assert rbg[0] != threefry[0]


def test_a_resume_under_the_other_generator_is_refused_and_an_old_run_is_threefry():
    old_run = {"train": {"seed": 0}}
    assert setting_changes(old_run, {"train": {"seed": 0, "dropout_rng": "threefry2x32"}}) == []
    assert setting_changes(old_run, {"train": {"seed": 0, "dropout_rng": "rbg"}}) == [
        "train.dropout_rng: 'threefry2x32' vs 'rbg'"
    ]


def test_an_unknown_generator_is_one_line():
    with pytest.raises(UserError, match="dropout_rng"):
        load_config(PretrainConfig, None, ["train.dropout_rng=philox"])
