"""The held-out sequences' own sums at every evaluation of a bertjax pre-training run, and the
held-out curves of resampled sequence sets.

At each evaluation the run writes `heldout-sequences/step-<step:09d>.npz` (train.heldout): each
held-out sequence's summed MLM cross-entropy over its masked tokens, its correct predictions and its
masked count, the same sequences in the same order every time. A curve's interval then comes from
resampling the sequences, one resample applied to every evaluation (paired), rather than from the
residuals of a fit to the curve.
"""

from __future__ import annotations

import dataclasses
import re
import zipfile
from pathlib import Path

import numpy as np

from bertjax.errors import UserError

# Named as train.heldout writes it (analysis does not import train).
SEQUENCES_DIR = "heldout-sequences"
_FILE = re.compile(r"step-(\d{9,})\.npz")  # as written: step-{step:09d}.npz
_MLM = ("mlm_loss", "mlm_hits", "masked")
_PAIR = ("pair_loss", "pair_hits")


@dataclasses.dataclass(frozen=True, eq=False)
class HeldOutSequences:
    """`steps` [S] (sorted) of the evaluations; per evaluation and sequence, `loss` [S, N] (float64)
    the summed MLM cross-entropy and `hits` [S, N] the correct predictions; `masked` the masked
    counts, [N] when every evaluation has the same (one held-out set), else [S, N] (a second phase
    at another length is scored on other sequences). `pair_loss`, `pair_hits` [S, N]: the pair task's
    (NSP or SOP), None when the run had none."""

    steps: np.ndarray
    loss: np.ndarray
    hits: np.ndarray
    masked: np.ndarray
    pair_loss: np.ndarray | None = None
    pair_hits: np.ndarray | None = None


def read_heldout_sequences(workdir: str | Path) -> HeldOutSequences | None:
    """A run's per-sequence held-out sums, or None when it recorded none (no held-out corpora, or a
    run from before they were recorded). A file that cannot be read, or evaluations of different
    numbers of sequences, are refused with one line."""
    directory = Path(workdir) / SEQUENCES_DIR
    files = {}
    if directory.is_dir():
        for path in directory.iterdir():
            match = _FILE.fullmatch(path.name)
            if match:
                files[int(match.group(1))] = path
    if not files:
        return None
    steps = np.array(sorted(files), dtype=np.int64)
    records = [_read(files[step]) for step in steps]
    sizes = {len(record["mlm_loss"]) for record in records}
    if len(sizes) > 1:
        first = len(records[0]["mlm_loss"])
        other = next(i for i, record in enumerate(records) if len(record["mlm_loss"]) != first)
        raise UserError(
            f"{directory}: the evaluations hold different numbers of held-out sequences ({first} at step "
            f"{steps[0]}, {len(records[other]['mlm_loss'])} at step {steps[other]}); they cannot be resampled together"
        )
    pair = all(name in record for record in records for name in _PAIR)
    stacked = {name: np.stack([record[name] for record in records]) for name in _MLM + (_PAIR if pair else ())}
    masked = stacked["masked"]
    return HeldOutSequences(
        steps=steps,
        loss=stacked["mlm_loss"].astype(np.float64),
        hits=stacked["mlm_hits"].astype(np.int64),
        masked=(masked[0] if (masked == masked[0]).all() else masked).astype(np.int64),
        pair_loss=stacked["pair_loss"].astype(np.float64) if pair else None,
        pair_hits=stacked["pair_hits"].astype(np.int64) if pair else None,
    )


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in _MLM}
            arrays |= {name: stored[name] for name in _PAIR if name in stored.files}
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise UserError(f"{path}: not a readable held-out sequence file ({type(e).__name__}: {e})") from None
    sizes = {array.shape for array in arrays.values()}
    if len(sizes) != 1 or len(next(iter(sizes))) != 1:
        shapes = ", ".join(f"{name} {array.shape}" for name, array in arrays.items())
        raise UserError(f"{path}: the held-out sequence arrays are not one value per sequence ({shapes})")
    return arrays


def resampled_curves(seqs: HeldOutSequences, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The held-out MLM loss and accuracy [B, S] of each resample of the sequences (`weights`
    [B, N], e.g. `sieves.stats.resample_weights`), the same resample at every evaluation: replicate
    b's loss at evaluation s is Σ_i w_bi loss_si / Σ_i w_bi masked_si, a mean over masked tokens as
    metrics.jsonl's `heldout_mlm_loss` is (all weights 1 give it back). NaN where a replicate drew
    no masked token."""
    weights = np.asarray(weights, dtype=np.float64)
    masked = weights @ seqs.masked.T.astype(np.float64)
    if masked.ndim == 1:
        masked = masked[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return weights @ seqs.loss.T / masked, weights @ seqs.hits.T.astype(np.float64) / masked
