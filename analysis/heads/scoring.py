"""Sieve bias scores (Pande et al. 2021) of every head for every role, and their tests.

Per batch, one jitted function runs the model forward with attention *and* the sieve-bias kernel,
so attention never leaves the device and memory does not grow with the number of sequences; the
per-sequence scores are gathered in file order and tested one-sided against τ.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx

from analysis.common.finite import check_finite, silent_heads, warn_undefined
from analysis.common.forward import DataParallel, Devices, compiled, padded_batches, padded_lengths
from analysis.heads.config import RolesConfig
from bertjax import distributed
from bertjax.model import Model
from bertjax.readings import attention_rows
from sieves import stats
from sieves.align import EncodedSequence
from sieves.builders import SieveOptions, arc_row_weights, build_batch, present_roles
from sieves.kernel import REFERENCE_LENGTH, sieve_scores

log = logging.getLogger(__name__)

# The batch axis of each scorer input: input_ids, attention_mask, token_type_ids [B, T]; rows and
# row weights [R, B, T]; sieves [R, B, T, T].
SCORER_BATCH_AXES = (0, 0, 0, 1, 1, 1)


@dataclasses.dataclass
class TaskScores:
    """Per-sequence scores of one task: role → ([n_f, L, H] scores, [n_f] example indices)."""

    scores: dict[str, np.ndarray]
    indices: dict[str, np.ndarray]
    absent: list[str]
    n_sequences: int


def entropy_roles(config: RolesConfig) -> tuple[bool, ...]:
    """Per role of `config.roles`: scored as β · row entropy (`--block-score entropy`)."""
    return tuple(role == "block" and config.block_score == "entropy" for role in config.roles)


def reference_length(config: RolesConfig) -> int | None:
    """The kernel's `reference_length` for `--score`: None for β, the fixed chance level's length
    for `share`."""
    return REFERENCE_LENGTH if config.score == "share" else None


def convert_score(results: dict[str, TaskScores], lengths: dict[str, np.ndarray], to: str) -> dict[str, TaskScores]:
    """Per-sequence scores under the other `--score` (`to`: beta or share), from the same attention:
    each sequence's scores times n / N (share → β) or N / n (β → share), n its real tokens
    (`lengths[task][example index]`), N `REFERENCE_LENGTH`. Exact up to rounding for every kernel
    variant: the two scores divide each row's mass by n or by N and are otherwise the same sums."""
    if to not in ("beta", "share"):
        raise ValueError(f"convert_score: to must be beta or share, got {to!r}")
    out = {}
    for task, result in results.items():
        converted = {}
        for role, scores in result.scores.items():
            n = np.asarray(lengths[task], np.float64)[result.indices[role]]
            factor = REFERENCE_LENGTH / n if to == "share" else n / REFERENCE_LENGTH
            converted[role] = (scores * factor[:, None, None]).astype(scores.dtype)
        out[task] = dataclasses.replace(result, scores=converted)
    return out


def make_scorer(
    model: Model,
    entropy: tuple[bool, ...] = (),
    devices: Devices | None = None,
    readings: tuple[str, ...] = ("weights",),
    reference: int | None = None,
) -> DataParallel:
    """One jitted function: forward pass with attentions, then β for every role/layer/head
    (times the row entropy for the roles `entropy` marks); data parallel over `devices`.
    `readings` (`analysis.common.flags.attention_readings`): β of each from the same forward
    pass; with more than one, the scores gain a leading reading axis. `reference`
    (`reference_length(config)`): score the share against that length's chance level instead."""
    # One compiled function per architecture: tracking a run compiles once.
    score, (state,) = compiled(_jit_scorer, model, static=(readings,))
    return DataParallel(
        score, state, devices, SCORER_BATCH_AXES, {"entropy_roles": entropy, "reference_length": reference}
    )


def _jit_scorer(graphdef, readings):
    @partial(jax.jit, static_argnames=("entropy_roles", "reference_length"))
    def score(state, input_ids, attention_mask, token_type_ids, rows, sieves, row_weights=None, entropy_roles=(),
              reference_length=None):  # fmt: skip
        out = nnx.merge(graphdef, state)(
            input_ids, attention_mask, token_type_ids, output_attentions=True, attention_norms="norms" in readings
        )
        real = attention_mask.astype(bool)
        scored, silent = [], []
        for reading in readings:
            attentions, key_weights = attention_rows(out, reading)
            scored.append(
                sieve_scores(attentions, real, rows, sieves, row_weights, entropy_roles, key_weights, reference_length)
            )
            silent.append(silent_heads(attentions, key_weights, real))
        if len(scored) == 1:
            return (*scored[0], silent[0])
        # The counts are the masks', the same for every reading.
        return jnp.stack([scores for scores, _ in scored]), scored[0][1], jnp.stack(silent)

    return score


def scored_batches(
    scorer: DataParallel, seqs: Sequence[EncodedSequence], present: Sequence[str], config: RolesConfig, desc: str
) -> Iterator[tuple[list[EncodedSequence], tuple[np.ndarray, ...]]]:
    """Each length-sorted batch and what `scorer(input_ids, attention_mask, token_type_ids, rows,
    sieves)` returns for it (with the row weights appended under `--syntactic-average arcs`), on
    the host. The masks hold every role of `config.roles`, in that order, and are empty for roles
    not `present`. One batch is kept in flight: the next batch's masks are built on the host while
    the device computes the one before (dispatch does not wait for the result)."""
    options = SieveOptions(config.window, config.special_rows, config.block_first_sep == "b")
    # The same role count for every task, so single-segment tasks (no `block`) reuse the pair
    # tasks' compiled shapes: an empty role costs a sliver of β, a recompile costs seconds (on a
    # GPU, most of a cold run).
    slots = [config.roles.index(role) for role in present]
    size = scorer.rows(config.batch_size)
    scorer.compile_ahead(
        scorer_inputs(len(config.roles), size, length, config.syntactic_average == "arcs")
        for length in padded_lengths(seqs, config.batch_size, config.max_length)
    )
    in_flight = None
    for chunk, arrays in padded_batches(seqs, config.batch_size, config.max_length, desc, size):
        length = arrays["input_ids"].shape[1]
        built_rows, built_sieves = build_batch(chunk, present, options, length)
        rows = np.zeros((len(config.roles), size, length), bool)
        sieves = np.zeros((len(config.roles), size, length, length), bool)
        rows[slots, : len(chunk)], sieves[slots, : len(chunk)] = built_rows, built_sieves
        extra: tuple[np.ndarray, ...] = ()
        if config.syntactic_average == "arcs":
            weights = np.ones((len(config.roles), size, length), np.float32)
            weights[slots, : len(chunk)] = arc_row_weights(chunk, present, length)
            extra = (weights,)
        outputs = scorer(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], rows, sieves, *extra)
        if in_flight is not None:
            yield in_flight[0], tuple(np.asarray(x) for x in in_flight[1])
        in_flight = chunk, outputs
    if in_flight is not None:
        yield in_flight[0], tuple(np.asarray(x) for x in in_flight[1])


def scorer_inputs(roles: int, rows: int, length: int, row_weights: bool) -> tuple[np.ndarray, ...]:
    """Host arrays of the shapes and types a scorer call takes for a batch of `rows` × `length`
    (values unused: what `DataParallel.compile_ahead` compiles for)."""
    ids = np.zeros((rows, length), np.int32)
    masks = (np.zeros((roles, rows, length), bool), np.zeros((roles, rows, length, length), bool))
    return ids, ids, ids, *masks, *((np.ones((roles, rows, length), np.float32),) if row_weights else ())


class ScoreCollector:
    """Per-sequence scores gathered batch by batch, returned in file order as `TaskScores`."""

    def __init__(self, roles: Sequence[str], present: Sequence[str]):
        self.slots = {role: list(roles).index(role) for role in present}
        self.present = list(present)
        self.scores: dict[str, list[np.ndarray]] = {r: [] for r in present}
        self.indices: dict[str, list[np.ndarray]] = {r: [] for r in present}
        # [L, H] from the first batch on (a 0-d False broadcasts to it): undefined in some sequence
        self.silent: np.ndarray = np.zeros((), bool)

    def add(
        self,
        chunk: Sequence[EncodedSequence],
        scores: np.ndarray,
        counts: np.ndarray,
        silent: np.ndarray,
        desc: str,
        allowed: bool = False,
    ) -> None:
        """scores [R, B, L, H], counts [R, B] and `finite.silent_heads` [L, B, H] of a padded batch
        whose first rows are `chunk`, one slot per role of `roles`. A score that is not finite
        where a head is not silent stops the run (`finite.check_finite`; `allowed` its)."""
        silent = np.moveaxis(silent[:, : len(chunk)], 1, 0)  # [B, L, H]
        scored = (counts[:, : len(chunk)] > 0)[..., None, None]
        for r, b in np.argwhere((~np.isfinite(scores[:, : len(chunk)]) & scored & ~silent).any(axis=(2, 3)))[:1]:
            check_finite(scores[r, b], "β", f"{desc}, example {chunk[b].index}", silent[b], allowed)
        self.silent = self.silent | silent.any(axis=0)
        index = np.array([s.index for s in chunk])
        for role, r in self.slots.items():
            kept = counts[r, : len(chunk)] > 0
            self.scores[role].append(scores[r, : len(chunk)][kept])
            self.indices[role].append(index[kept])

    def result(self, absent: list[str], n_sequences: int) -> TaskScores:
        merged, merged_index = {}, {}
        for role in self.present:
            index = np.concatenate(self.indices[role])
            order = np.argsort(index, kind="stable")  # back to file order
            merged[role] = np.concatenate(self.scores[role])[order]
            merged_index[role] = index[order]
        return TaskScores(merged, merged_index, absent, n_sequences)


def score_task(scorer: DataParallel, seqs: Sequence[EncodedSequence], config: RolesConfig, desc: str) -> TaskScores:
    (result,) = score_task_readings(scorer, seqs, config, desc, 1)
    return result


def score_task_readings(
    scorer: DataParallel, seqs: Sequence[EncodedSequence], config: RolesConfig, desc: str, readings: int
) -> list[TaskScores]:
    """One `TaskScores` per reading of a scorer made with `readings` of them."""
    present, absent = present_roles((seq.num_segments for seq in seqs), config.roles)
    collectors = [ScoreCollector(config.roles, present) for _ in range(readings)]
    for chunk, (scores, counts, silent) in scored_batches(scorer, seqs, present, config, desc):
        for collector, reading_scores, reading_silent in zip(
            collectors, *((scores, silent) if readings > 1 else ([scores], [silent])), strict=True
        ):
            collector.add(chunk, reading_scores, counts, reading_silent, desc, config.allow_nonfinite)
    for collector in collectors:
        warn_undefined(collector.silent, desc, "their scores are")
    return [collector.result(absent, len(seqs)) for collector in collectors]


def test_roles(results: dict[str, TaskScores], config: RolesConfig) -> tuple[pd.DataFrame, float]:
    """One row per (task, layer, head, role) with the test of H0: mean β ≤ τ."""
    if config.tau == "auto":
        tau = float(stats.tau_auto(s for r in results.values() for s in r.scores.values()))
    else:
        tau = config.tau
    frames = []
    for task, result in results.items():
        for role, scores in result.scores.items():
            test = stats.one_sided_test(
                scores, tau, axis=0, test=config.test, alpha=config.alpha,
                replicates=config.bootstrap, seed=config.bootstrap_seed,
            )  # fmt: skip
            layers, heads = np.meshgrid(np.arange(scores.shape[1]), np.arange(scores.shape[2]), indexing="ij")
            frames.append(
                pd.DataFrame(
                    {
                        "task": task,
                        "layer": layers.ravel(),
                        "head": heads.ravel(),
                        "role": role,
                        "n": test.n.ravel(),
                        "mean": test.mean.ravel(),
                        "std": test.std.ravel(),
                        "ci_low": test.ci_low.ravel(),
                        "ci_high": test.ci_high.ravel(),
                        "lower_bound": test.lower_bound.ravel(),
                        "t": test.statistic.ravel(),
                        "p_value": test.p_value.ravel(),
                    }
                )
            )
    table = pd.concat(frames, ignore_index=True)
    table["p_adjusted"] = stats.adjust_pvalues(table["p_value"].to_numpy(), config.correction)
    table["assigned"] = stats.assign(table["p_adjusted"].to_numpy(), config.alpha)
    return table, tau


def score_arrays(results: dict[str, TaskScores]) -> dict[str, np.ndarray]:
    """scores.npz's arrays: `task/role` the per-sequence scores [n, L, H], `task/role/index` their
    example indices."""
    arrays = {}
    for task, result in results.items():
        for role, scores in result.scores.items():
            arrays[f"{task}/{role}"] = scores
            arrays[f"{task}/{role}/index"] = result.indices[role]
    return arrays


def gather_scores(results: dict[str, TaskScores], n_sequences: dict[str, int]) -> dict[str, TaskScores]:
    """Every process's `results` (each from its contiguous share of each task's sequences) as one,
    in file order, with each task's whole sequence count; unchanged in a one-process run."""
    if jax.process_count() == 1:
        return results
    gathered = {}
    for task, result in results.items():
        scores, indices = distributed.gather_tree((result.scores, result.indices))
        # A tree's dicts come back with sorted keys; the tables keep the roles' order.
        order = list(result.scores)
        gathered[task] = TaskScores({r: scores[r] for r in order}, {r: indices[r] for r in order}, result.absent,
                                    n_sequences[task])  # fmt: skip
    return gathered


def score_sequences(
    scorer, sequences: dict[str, list[EncodedSequence]], config: RolesConfig, timings: dict[str, float]
) -> dict[str, TaskScores]:
    (results,) = score_readings(scorer, sequences, config, timings, ("one",)).values()
    return results


def score_readings(
    scorer,
    sequences: dict[str, list[EncodedSequence]],
    config: RolesConfig,
    timings: dict[str, float],
    readings: tuple[str, ...],
) -> dict[str, dict[str, TaskScores]]:
    """{reading: {task: TaskScores}} from a scorer made with `readings`."""
    results: dict[str, dict[str, TaskScores]] = {reading: {} for reading in readings}
    for task, seqs in sequences.items():
        clock = time.perf_counter()
        scored = score_task_readings(scorer, seqs, config, f"{task} β", len(readings))
        for reading, result in zip(readings, scored, strict=True):
            results[reading][task] = result
        timings[f"{task}/score"] = time.perf_counter() - clock
    return results
