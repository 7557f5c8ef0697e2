"""Coreference heads (Clark et al. 2019, §4.3) on GAP (Webster et al. 2018): does the pronoun
attend more to the candidate name it refers to than to the other one?

Definitions (docs/clark.md sets them against the paper's CoNLL-2012 set-up):

- Each GAP example is read as one segment, `[CLS] text [SEP]`. Pieces belong to a character span
  when their fast-tokenizer offsets overlap it (offsets, never strings).
- Attention *from* the pronoun is the mean over its pieces' rows (`first_piece=True`: its first
  piece's row), as word-level attention is in §4.1.
- Attention *to* a candidate (`target`): `head`, the sum over the pieces of the name's head word,
  its last whitespace-separated word (the Collins head of a proper-noun phrase, which is how
  CoNLL-2012 mentions get head words); `sum`, the sum over all pieces of the name; `first`, the
  name's first piece alone.
- A head chooses the candidate it attends to more; a tie chooses neither and counts as wrong.
  Accuracy is over the examples where exactly one candidate corefers (chance 50 %), with the
  t interval of `sieves.stats` for the mean of the 0/1 outcomes.
- Baselines, on the same examples and pieces: `nearest`, the candidate whose name is fewer pieces
  away from the pronoun (a tie is wrong); `earlier`, the candidate that comes first in the text.
- Text longer than the model's positions is cut to a window of `max_length − 2` pieces that holds
  the pronoun and both names whole, as central on the pronoun as that allows; an example whose
  three mentions do not fit in one window is skipped and counted.
- Heads are chosen on GAP development and scored on GAP test.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx

from analysis.attention.options import COREF_TARGETS as TARGETS
from analysis.common.forward import compiled, padded_batches
from bertjax.errors import UserError
from sieves.align import EncodedSequence
from sieves.stats import one_sided_test

BASELINES = ("nearest", "earlier")
CHANCE = 0.5
GAP_COLUMNS = (
    "ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref", "URL",
)  # fmt: skip
HEAD_COLUMNS = (
    "layer", "head", "dev_accuracy", "test_accuracy", "test_ci_low", "test_ci_high", "test_p_chance", "dev_n", "test_n",
)  # fmt: skip
BASELINE_COLUMNS = ("baseline", "dev_accuracy", "test_accuracy", "test_ci_low", "test_ci_high", "test_n")


@dataclasses.dataclass(frozen=True)
class GapExample:
    """One GAP row; spans are character [start, end) of `text`; `label` 0 (A), 1 (B) or None
    (neither corefers)."""

    id: str
    text: str
    pronoun: tuple[int, int]
    names: tuple[str, str]
    spans: tuple[tuple[int, int], tuple[int, int]]
    label: int | None


@dataclasses.dataclass(frozen=True)
class CorefInput:
    """One encoded example: piece indices into `seq` (its [CLS] at 0)."""

    seq: EncodedSequence
    pronoun: np.ndarray  # the pronoun's pieces
    targets: tuple[np.ndarray, np.ndarray]  # the pieces attended to, per candidate (`target`)
    mentions: tuple[np.ndarray, np.ndarray]  # every piece of each name (distance baseline)
    label: int
    truncated: bool


def read_gap(path: Path, limit: int | None = None) -> list[GapExample]:
    """The first `limit` rows of a GAP TSV (all by default); a malformed row is a UserError naming it."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error})") from None
    if not rows or tuple(rows[0]) != GAP_COLUMNS:
        raise UserError(f"{path}: not a GAP file (expected the header {' '.join(GAP_COLUMNS)})")
    examples = []
    for line, row in enumerate(rows[1:] if limit is None else rows[1 : limit + 1], start=2):
        if len(row) != len(GAP_COLUMNS):
            raise UserError(f"{path}, line {line}: {len(row)} fields, expected {len(GAP_COLUMNS)}")
        field = dict(zip(GAP_COLUMNS, row, strict=True))
        text = field["Text"]
        spans = []
        for mention in ("Pronoun", "A", "B"):
            offset = field[f"{mention}-offset"]
            if not offset.isdigit():
                raise UserError(f"{path}, line {line}: {mention}-offset {offset!r} is not a character offset")
            start = int(offset)
            if text[start : start + len(field[mention])] != field[mention]:
                raise UserError(f"{path}, line {line}: {mention} {field[mention]!r} is not at offset {start} of Text")
            spans.append((start, start + len(field[mention])))
        coref = []
        for mention in ("A", "B"):
            value = field[f"{mention}-coref"].upper()
            if value not in ("TRUE", "FALSE"):
                raise UserError(f"{path}, line {line}: {mention}-coref must be TRUE or FALSE, got {value!r}")
            coref.append(value == "TRUE")
        if all(coref):
            raise UserError(f"{path}, line {line}: both A and B corefer with the pronoun")
        label = 0 if coref[0] else 1 if coref[1] else None
        examples.append(
            GapExample(field["ID"], text, spans[0], (field["A"], field["B"]), (spans[1], spans[2]), label)
        )  # fmt: skip
    return examples


def span_pieces(offsets: np.ndarray, start: int, end: int) -> np.ndarray:
    """Indices of the pieces (offsets [n, 2], character [start, end) each) overlapping [start, end)."""
    return np.flatnonzero((offsets[:, 0] < end) & (start < offsets[:, 1]) & (offsets[:, 1] > offsets[:, 0]))


def target_span(name: str, span: tuple[int, int], target: str) -> tuple[int, int]:
    """The characters a candidate is attended through: its head (last) word for `head`, else all of it
    (`first` then takes the first piece of that span)."""
    if target != "head":
        return span
    last = re.search(r"\S+\s*$", name)
    return (span[0] + last.start(), span[1]) if last else span


def window(length: int, width: int, lo: int, hi: int, centre: int) -> int | None:
    """Start of a `width`-piece window of [0, length) that holds pieces lo … hi, centred on
    `centre` as far as that allows; None when lo … hi is wider than `width`."""
    if hi - lo + 1 > width:
        return None
    start = max(hi - width + 1, min(lo, centre - width // 2))
    return int(min(max(start, 0), length - width)) if length > width else 0


def encode_gap(
    tokenizer, examples: Sequence[GapExample], max_length: int, target: str = "head"
) -> tuple[list[CorefInput], dict[str, int]]:
    """Encode the examples where exactly one candidate corefers; (inputs, counts of what was
    read, left out because neither corefers, cut to a window, skipped as too long)."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    counts = {"rows": len(examples), "neither": 0, "truncated": 0, "skipped_too_long": 0, "scored": 0}
    scored = [e for e in examples if e.label is not None]
    counts["neither"] = len(examples) - len(scored)
    if not scored:
        return [], counts
    encoded = tokenizer(
        [e.text for e in scored], add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False
    )
    width = max_length - 2
    inputs = []
    for example, ids, offsets in zip(scored, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
        pronoun = span_pieces(offsets, *example.pronoun)
        mentions = [span_pieces(offsets, *span) for span in example.spans]
        targets = [
            span_pieces(offsets, *target_span(name, span, target))
            for name, span in zip(example.names, example.spans, strict=True)
        ]
        if target == "first":
            targets = [t[:1] for t in targets]
        if not pronoun.size or not all(m.size for m in mentions):
            raise UserError(f"GAP {example.id}: a mention covers no wordpiece of the text")
        every = np.concatenate([pronoun, *mentions])
        start = window(len(ids), width, int(every.min()), int(every.max()), int(pronoun[0]))
        if start is None:
            counts["skipped_too_long"] += 1
            continue
        stop = min(start + width, len(ids))
        counts["truncated"] += int(stop - start < len(ids))
        # +1: [CLS] comes first.
        shift = lambda pieces, start=start: pieces - start + 1
        body = np.asarray(ids[start:stop], np.int32)
        input_ids = np.concatenate([[tokenizer.cls_token_id], body, [tokenizer.sep_token_id]]).astype(np.int32)
        special = np.zeros(len(input_ids), bool)
        special[[0, -1]] = True
        seq = EncodedSequence(
            input_ids=input_ids, token_type_ids=np.zeros_like(input_ids), special=special,
            is_cls=special & (np.arange(len(input_ids)) == 0), is_sep=special & (np.arange(len(input_ids)) > 0),
            word_ids=np.full(len(input_ids), -1, np.int32), word_dep=(), word_head=np.zeros(0, np.int32),
            num_segments=1, index=len(inputs),
        )  # fmt: skip
        inputs.append(
            CorefInput(
                seq, shift(pronoun), tuple(map(shift, targets)), tuple(map(shift, mentions)), example.label,
                stop - start < len(ids),
            )
        )  # fmt: skip
    counts["scored"] = len(inputs)
    return inputs, counts


def pronoun_weights(item: CorefInput, length: int, first_piece: bool = False) -> np.ndarray:
    """float32 [length]: the weights of the query rows that make the pronoun's attention."""
    weights = np.zeros(length, np.float32)
    rows = item.pronoun[:1] if first_piece else item.pronoun
    weights[rows] = 1.0 / len(rows)
    return weights


def candidate_attention(attention: jax.Array, from_weights: jax.Array, to_masks: jax.Array) -> jax.Array:
    """attention [B, L, H, T, T], from_weights [B, T], to_masks [B, 2, T] → [B, L, H, 2]: each
    head's attention from the pronoun to each candidate."""
    return jnp.einsum("bt,blhts,bcs->blhc", from_weights, attention, to_masks, precision=jax.lax.Precision.HIGHEST)


def make_candidate_attention_fn(model: nnx.Module):
    """A jitted forward returning `candidate_attention` of each batch."""
    run, (state,) = compiled(_jit_candidate_attention, model)
    return lambda *arrays: run(state, *arrays)


def _jit_candidate_attention(graphdef):
    @jax.jit
    def run(state, input_ids, attention_mask, token_type_ids, from_weights, to_masks):
        out = nnx.merge(graphdef, state)(input_ids, attention_mask, token_type_ids, output_attentions=True)
        return candidate_attention(jnp.stack(out.attentions, axis=1), from_weights, to_masks)

    return run


def candidate_scores(
    run, inputs: Sequence[CorefInput], batch_size: int, max_length: int, first_piece: bool = False, desc: str = "GAP"
) -> np.ndarray:
    """[N, L, H, 2] attention from each input's pronoun to its two candidates, streamed by batch."""
    scores: list[np.ndarray | None] = [None] * len(inputs)
    for chunk, arrays in padded_batches([item.seq for item in inputs], batch_size, max_length, desc):
        length = arrays["input_ids"].shape[1]
        from_weights = np.zeros((batch_size, length), np.float32)
        to_masks = np.zeros((batch_size, 2, length), np.float32)
        for b, seq in enumerate(chunk):
            item = inputs[seq.index]
            from_weights[b] = pronoun_weights(item, length, first_piece)
            for c in range(2):
                to_masks[b, c, item.targets[c]] = 1.0
        out = np.asarray(
            run(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], from_weights, to_masks)
        )
        for b, seq in enumerate(chunk):
            scores[seq.index] = out[b]
    return np.stack(scores) if scores else np.zeros((0, 0, 0, 2), np.float32)


def correct_choices(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """scores [N, ..., 2], labels int [N] → bool [N, ...]: the head attends strictly more to the
    candidate that corefers."""
    labels = labels.reshape((-1,) + (1,) * (scores.ndim - 2))
    right = np.take_along_axis(scores, labels[..., None], axis=-1)[..., 0]
    wrong = np.take_along_axis(scores, 1 - labels[..., None], axis=-1)[..., 0]
    return right > wrong


def baseline_correct(inputs: Sequence[CorefInput]) -> dict[str, np.ndarray]:
    """bool [N] per baseline: whether it chooses the candidate that corefers."""

    def distance(item: CorefInput, c: int) -> int:
        mention, pronoun = item.mentions[c], item.pronoun
        return int(max(mention.min() - pronoun.max(), pronoun.min() - mention.max(), 0))

    labels = np.array([item.label for item in inputs], np.int64)
    nearest = np.array([[-distance(item, c) for c in range(2)] for item in inputs], np.float64).reshape(-1, 2)
    earlier = np.array([[-item.mentions[c].min() for c in range(2)] for item in inputs], np.float64).reshape(-1, 2)
    return {"nearest": correct_choices(nearest, labels), "earlier": correct_choices(earlier, labels)}


def accuracy(correct: np.ndarray) -> dict[str, np.ndarray]:
    """Over axis 0 of 0/1 outcomes: accuracy, the 95 % t interval of the mean, the one-sided p of
    accuracy > 50 %, and n."""
    result = one_sided_test(np.asarray(correct, np.float64), CHANCE)
    return {"accuracy": result.mean, "ci_low": result.ci_low, "ci_high": result.ci_high,
            "p_chance": result.p_value, "n": result.n}  # fmt: skip


def head_table(dev_correct: np.ndarray, test_correct: np.ndarray) -> pd.DataFrame:
    """One row per head (layer-major): dev and test accuracy, the test CI, p against chance, n."""
    layers, heads = dev_correct.shape[1:]
    dev, test = accuracy(dev_correct), accuracy(test_correct)
    return pd.DataFrame(
        {
            "layer": np.repeat(np.arange(layers), heads),
            "head": np.tile(np.arange(heads), layers),
            "dev_accuracy": dev["accuracy"].ravel(),
            "test_accuracy": test["accuracy"].ravel(),
            "test_ci_low": test["ci_low"].ravel(),
            "test_ci_high": test["ci_high"].ravel(),
            "test_p_chance": test["p_chance"].ravel(),
            "dev_n": dev["n"].ravel(),
            "test_n": test["n"].ravel(),
        },
        columns=list(HEAD_COLUMNS),
    )


def best_per_layer(table: pd.DataFrame) -> pd.DataFrame:
    """Per layer, the head best on dev (the first on a tie), with its test numbers."""
    return table.loc[table.groupby("layer", sort=True)["dev_accuracy"].idxmax()].reset_index(drop=True)


def best_head(table: pd.DataFrame) -> pd.Series:
    """The head best on dev over all layers (the first on a tie)."""
    return table.loc[table["dev_accuracy"].idxmax()]


def baseline_table(dev: dict[str, np.ndarray], test: dict[str, np.ndarray]) -> pd.DataFrame:
    rows = []
    for name in BASELINES:
        d, t = accuracy(dev[name]), accuracy(test[name])
        rows.append({"baseline": name, "dev_accuracy": float(d["accuracy"]), "test_accuracy": float(t["accuracy"]),
                     "test_ci_low": float(t["ci_low"]), "test_ci_high": float(t["ci_high"]), "test_n": int(t["n"])})  # fmt: skip
    return pd.DataFrame(rows, columns=list(BASELINE_COLUMNS))


def format_summary(table: pd.DataFrame, baselines: pd.DataFrame) -> str:
    best = best_head(table)
    lines = [
        "coreference heads on GAP (head chosen on dev; accuracy on test, 95% CI; chance 50%)",
        f"best head {int(best['layer'])}-{int(best['head'])}: {100 * best['test_accuracy']:.1f}% "
        f"[{100 * best['test_ci_low']:.1f}, {100 * best['test_ci_high']:.1f}] (dev {100 * best['dev_accuracy']:.1f}%, "
        f"n = {int(best['test_n'])})",
    ]
    for row in baselines.itertuples():
        lines.append(
            f"{row.baseline:<9} baseline: {100 * row.test_accuracy:.1f}% [{100 * row.test_ci_low:.1f}, "
            f"{100 * row.test_ci_high:.1f}]"
        )
    return "\n".join(lines)
