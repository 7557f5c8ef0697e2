"""Onset intervals: the tests of every step redone on resamples of the sequences.

The sequences a series is scored on are the same at every step, so a resample is drawn once per
task (B multinomial counts over its examples, seeded by the seed and the task's name) and applied
to every step: a replicate is the whole series as if another sample of sequences had been drawn
(paired resampling). A role's scored sequences are a subset of the task's; the resample gives each
its count, so a replicate's sample size for a role is the sum of its sequences' counts.

Each replicate is tested as the run itself is (τ, α, the test's tail, the correction in its scope),
from the per-sequence scores alone: no forward pass, so a cached re-run recomputes the intervals.
With `--test bootstrap` the replicates use Student's t tail (a bootstrap-t inside each of B
replicates would cost B² resamples); the point estimates use the bootstrap-t test.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
from scipy import special
from scipy.stats import t as stats_t

from analysis.common.changepoint import INTERVAL
from analysis.heads.scoring import TaskScores
from sieves import stats
from sieves.choices import Correction, Test


class PairedResampler:
    """B resamples of each task's examples, the same for every step of a series."""

    def __init__(self, replicates: int, seed: int):
        self.replicates = replicates
        self.seed = seed
        self._weights: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def weights(self, task: str, result: TaskScores) -> tuple[np.ndarray, np.ndarray]:
        """(the task's examples (sorted example indices), their counts [B, N]). The examples are
        those some role scored, which do not depend on the checkpoint."""
        population = np.unique(np.concatenate([np.asarray(i) for i in result.indices.values()] or [np.zeros(0)]))
        cached = self._weights.get(task)
        if cached is None or not np.array_equal(cached[0], population):
            rng = np.random.default_rng([self.seed, zlib.crc32(task.encode())])
            cached = (population, stats.resample_weights(max(len(population), 1), self.replicates, rng))
            self._weights[task] = cached
        return cached

    def pvalues(self, results: dict[str, TaskScores], tau: float, test: Test, alpha: float | None = None) -> np.ndarray:
        """[B, m] p-values of the one-sided tests of every replicate, the m tests in the order of
        `scoring.test_roles`' rows (task, role, layer, head); with `alpha` (no correction to
        come), the decisions p < α themselves, from critical values (a quantile per sample size
        instead of a tail probability per test)."""
        out = self._each_role(results, lambda w, x: replicate_pvalues(w, x, tau, test, alpha))
        return out if alpha is not None else out.astype(np.float32)

    def means(self, results: dict[str, TaskScores]) -> np.ndarray:
        """[B, m] the mean score of every replicate, in the tests' order: the trajectories whose
        event times (`analysis.heads.events`) get their intervals from these replicates."""
        return self._each_role(results, lambda w, x: stats.weighted_moments(w, x)[1]).astype(np.float32)

    def _each_role(self, results: dict[str, TaskScores], reduce) -> np.ndarray:
        """`reduce(weights [B, n], scores [n, K])` → [B, K] for every role of every task, resampled
        with the task's weights, concatenated in the tests' order."""
        blocks = []
        for task, result in results.items():
            population, weights = self.weights(task, result)
            # Roles scored on the same sequences (every positional and delimiter role) share one
            # matrix product: the cost is the resample weights times all their heads at once.
            groups: dict[bytes, list[str]] = {}
            for role in result.scores:
                groups.setdefault(np.asarray(result.indices[role]).tobytes(), []).append(role)
            reduced = {}
            for roles in groups.values():
                positions = np.searchsorted(population, np.asarray(result.indices[roles[0]]))
                chosen = weights if len(positions) == len(population) else weights[:, positions]
                xs = [np.asarray(result.scores[r], np.float64) for r in roles]
                widths = [int(np.prod(x.shape[1:])) for x in xs]
                stacked = np.concatenate([x.reshape(x.shape[0], w) for x, w in zip(xs, widths, strict=True)], axis=1)
                values = reduce(chosen, stacked)
                for role, part in zip(roles, np.split(values, np.cumsum(widths)[:-1], axis=1), strict=True):
                    reduced[role] = part
            blocks += [reduced[role] for role in result.scores]
        return np.concatenate(blocks, axis=1)


def replicate_pvalues(
    weights: np.ndarray, x: np.ndarray, tau: float, test: Test, alpha: float | None = None
) -> np.ndarray:
    """p of H1: mean > τ for each resample (rows of `weights` [B, n]) of x [n, K]: the t tail
    (the z tail with `test` z), NaN where a resample has under 2 sequences or no spread, as
    `stats.one_sided_test` treats its sample. With `alpha`: the decisions p < α (bool)."""
    if x.shape[0] == 0:
        shape = (weights.shape[0], x.shape[1])
        return np.zeros(shape, bool) if alpha is not None else np.full(shape, np.nan)
    size, mean, std = stats.weighted_moments(weights, x)
    # A resample of one repeated value: its SD is rounding of the order of eps·|x|, not spread.
    untestable = (std <= 1e-12 * (np.abs(mean) + 1.0)) | (size[:, None] < 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (mean - tau) / (std / np.sqrt(size[:, None]))
        if alpha is not None:
            # Sample sizes repeat across replicates: one quantile per distinct size.
            sizes, inverse = np.unique(size, return_inverse=True)
            critical = special.ndtri(1 - alpha) if test == "z" else stats_t.ppf(1 - alpha, np.maximum(sizes - 1, 1))
            critical = np.broadcast_to(critical, sizes.shape)[inverse]
            return (t > critical[:, None]) & ~untestable
        p = special.ndtr(-t) if test == "z" else special.stdtr(size[:, None] - 1, -t)
    return np.where(untestable, np.nan, p)


def decide(pvalues: list[np.ndarray], correction: Correction, scope: str, alpha: float) -> np.ndarray:
    """held [B, S, m] from the replicates' p-values of each of S steps ([B, m] each; or their
    decisions, bool, when there is no correction), the correction applied per step or over the
    whole series, as the run's own tests."""
    if pvalues and pvalues[0].dtype == bool:
        return np.stack(pvalues, axis=1)
    if correction == "none":
        return np.stack([p < alpha for p in pvalues], axis=1)
    if scope == "series":
        m = pvalues[0].shape[1]
        adjusted = stats.adjust_pvalue_rows(np.concatenate(pvalues, axis=1), correction)
        return np.stack([adjusted[:, i * m : (i + 1) * m] < alpha for i in range(len(pvalues))], axis=1)
    return np.stack([stats.adjust_pvalue_rows(p, correction) < alpha for p in pvalues], axis=1)


def onset_index(held: np.ndarray, persistence: int) -> tuple[np.ndarray, np.ndarray]:
    """For held [..., S]: (the index of the onset, S when there is none; the number of trailing
    held steps). The onset is the first step from which the role is held at every later step,
    provided that is at least `persistence` steps."""
    steps = held.shape[-1]
    reverse = held[..., ::-1]
    trailing = np.where(reverse.all(axis=-1), steps, np.argmin(reverse, axis=-1))
    onset = np.where(trailing >= max(persistence, 1), steps - trailing, steps)
    return onset, trailing


def onset_interval_table(held: np.ndarray, rows: pd.DataFrame, steps: list[int], persistence: int) -> pd.DataFrame:
    """Per test (`rows`: task, layer, head, role of the m tests): the 5%–95% interval of the onset
    step over the replicates (onset_high empty when more than 5% have no onset: the interval then
    reaches "no onset"), the share without an onset and the share holding the role at the last step."""
    onset, trailing = onset_index(np.moveaxis(held, 1, 2), persistence)  # [B, m]
    size = len(steps)
    low = np.quantile(onset, INTERVAL[0], axis=0, method="inverted_cdf")
    high = np.quantile(onset, INTERVAL[1], axis=0, method="inverted_cdf")
    step_of = np.append(np.asarray(steps, dtype=np.float64), np.nan)
    return rows.assign(
        onset_low=pd.array(step_of[low], dtype="Int64") if size else pd.array([], dtype="Int64"),
        onset_high=pd.array(step_of[high], dtype="Int64") if size else pd.array([], dtype="Int64"),
        no_onset_share=(onset == size).mean(axis=0),
        held_at_last_share=(trailing >= 1).mean(axis=0),
    )


def replicate_counts(held: np.ndarray, rows: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """(task, role) → [B, S] the number of heads holding the role in each replicate and step."""
    out = {}
    for (task, role), index in rows.groupby(["task", "role"], sort=False).indices.items():
        out[(task, role)] = held[:, :, index].sum(axis=2)
    return out
