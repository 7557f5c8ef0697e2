"""The reader of a run's per-sequence held-out sums (`heldout-sequences/`) and the held-out curves
of resampled sequences; the files of a real run are tested in test_heldout.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.common.heldout import SEQUENCES_DIR, HeldOutSequences, read_heldout_sequences, resampled_curves
from bertjax.errors import UserError
from sieves.stats import resample_weights


def _write(workdir: Path, step: int, n: int = 5, seed: int = 0, pair: bool = False, masked=None) -> dict:
    rng = np.random.default_rng([step, seed])
    masked = rng.integers(1, 10, n) if masked is None else np.asarray(masked)
    arrays = {
        "mlm_loss": (rng.uniform(0, 6, n) * masked).astype(np.float32),  # 0 for a sequence with none masked
        "mlm_hits": rng.integers(0, masked + 1).astype(np.int32),
        "masked": masked.astype(np.int32),
    }
    if pair:
        arrays["pair_loss"] = rng.uniform(0, 2, n).astype(np.float32)
        arrays["pair_hits"] = rng.integers(0, 2, n).astype(np.int32)
    (workdir / SEQUENCES_DIR).mkdir(exist_ok=True)
    np.savez_compressed(workdir / SEQUENCES_DIR / f"step-{step:09d}.npz", **arrays)
    return arrays


def test_a_run_that_recorded_no_sequences_reads_as_none(tmp_path):
    assert read_heldout_sequences(tmp_path) is None
    (tmp_path / SEQUENCES_DIR).mkdir()
    assert read_heldout_sequences(tmp_path) is None
    (tmp_path / SEQUENCES_DIR / ".step-000000003.npz.x1y2.tmp").write_bytes(b"half")  # a killed write's temporary
    assert read_heldout_sequences(tmp_path) is None


def test_evaluations_are_read_in_step_order_one_row_each(tmp_path):
    masked = [3, 9, 1, 4, 7]
    written = {step: _write(tmp_path, step, masked=masked) for step in (100, 7, 1000000)}
    seqs = read_heldout_sequences(tmp_path)
    assert seqs.steps.tolist() == [7, 100, 1000000]
    for row, step in enumerate(seqs.steps):
        np.testing.assert_array_equal(seqs.loss[row], written[step]["mlm_loss"])
        np.testing.assert_array_equal(seqs.hits[row], written[step]["mlm_hits"])
    assert seqs.loss.dtype == np.float64 and seqs.masked.tolist() == masked
    assert seqs.pair_loss is None and seqs.pair_hits is None


def test_masked_counts_that_differ_between_evaluations_are_kept_per_evaluation(tmp_path):
    """A second phase at another sequence length is scored on other sequences."""
    first, second = _write(tmp_path, 1, pair=True), _write(tmp_path, 2, seed=1, pair=True)
    seqs = read_heldout_sequences(tmp_path)
    np.testing.assert_array_equal(seqs.masked, [first["masked"], second["masked"]])
    np.testing.assert_array_equal(seqs.pair_hits, [first["pair_hits"], second["pair_hits"]])
    _write(tmp_path, 3)  # without the pair task's sums: none are read
    assert read_heldout_sequences(tmp_path).pair_loss is None


def test_a_torn_or_foreign_file_is_one_line_naming_it(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 2)
    torn = tmp_path / SEQUENCES_DIR / "step-000000002.npz"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    with pytest.raises(UserError, match=r"step-000000002\.npz: not a readable held-out sequence file") as error:
        read_heldout_sequences(tmp_path)
    assert "\n" not in str(error.value)
    np.savez(torn, mlm_loss=np.zeros(5, np.float32), masked=np.ones(5, np.int32))
    with pytest.raises(UserError, match=r"step-000000002\.npz: not a readable .*KeyError"):
        read_heldout_sequences(tmp_path)
    np.savez(torn, mlm_loss=np.zeros(5, np.float32), mlm_hits=np.zeros(4, np.int32), masked=np.ones(5, np.int32))
    with pytest.raises(UserError, match=r"step-000000002\.npz: the held-out sequence arrays are not one value"):
        read_heldout_sequences(tmp_path)


def test_evaluations_of_different_numbers_of_sequences_are_refused(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 5)
    _write(tmp_path, 9, n=6)
    with pytest.raises(UserError, match=r"different numbers of held-out sequences \(5 at step 1, 6 at step 9\)"):
        read_heldout_sequences(tmp_path)


def _slow_curves(seqs: HeldOutSequences, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each replicate, each evaluation: the resampled sequences' masked tokens, pooled."""
    (b, n), s = weights.shape, len(seqs.steps)
    loss, accuracy = np.empty((b, s)), np.empty((b, s))
    for r in range(b):
        for t in range(s):
            masked = seqs.masked if seqs.masked.ndim == 1 else seqs.masked[t]
            total = sum(weights[r, i] * masked[i] for i in range(n))
            loss[r, t] = sum(weights[r, i] * seqs.loss[t, i] for i in range(n)) / total
            accuracy[r, t] = sum(weights[r, i] * seqs.hits[t, i] for i in range(n)) / total
    return loss, accuracy


@pytest.mark.parametrize("per_step_masked", [False, True])
def test_resampled_curves_equal_the_pooled_resampled_tokens(tmp_path, per_step_masked):
    n = 7
    for step in (1, 4, 16, 64):
        masked = None if per_step_masked else np.arange(1, n + 1)
        _write(tmp_path, step, n=n, seed=step if per_step_masked else 0, masked=masked)
    seqs = read_heldout_sequences(tmp_path)
    assert seqs.masked.ndim == (2 if per_step_masked else 1)
    weights = resample_weights(n, 50, np.random.default_rng(0))
    loss, accuracy = resampled_curves(seqs, weights)
    slow_loss, slow_accuracy = _slow_curves(seqs, weights)
    # float64 sums of n non-negative products, two orders: ≤ 2n float64 roundoffs apart.
    rtol = 2 * n * 2.0**-53
    np.testing.assert_allclose(loss, slow_loss, rtol=rtol)
    np.testing.assert_allclose(accuracy, slow_accuracy, rtol=rtol)
    # A planted bug, the unweighted masked count as the denominator, is far outside that.
    planted = weights @ seqs.loss.T / (seqs.masked.sum(axis=-1))
    assert np.abs(planted / slow_loss - 1).max() > 1e6 * rtol
    # All weights 1: the pooled mean over every masked token, as metrics.jsonl's.
    ones, _ = resampled_curves(seqs, np.ones((1, n)))
    np.testing.assert_allclose(ones[0], seqs.loss.sum(axis=1) / np.broadcast_to(seqs.masked, seqs.loss.shape).sum(axis=1),
                               rtol=rtol)  # fmt: skip


def test_a_replicate_that_drew_no_masked_token_is_nan(tmp_path):
    _write(tmp_path, 1, n=3, masked=[0, 2, 3])
    loss, accuracy = resampled_curves(read_heldout_sequences(tmp_path), np.array([[3.0, 0, 0], [1, 1, 1]]))
    assert np.isnan(loss[0, 0]) and np.isnan(accuracy[0, 0]) and np.isfinite(loss[1, 0])
