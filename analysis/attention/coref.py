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
- Which mentions of a candidate count (`mentions`): `all` (default), Clark et al.'s reading: a
  head is right when the mention it attends to most is one of the antecedent's mentions, so a
  candidate scores its most-attended mention (the maximum over its mentions, never their sum,
  which would favour the candidate named more often). Its mentions are the marked occurrence and
  every other occurrence of its exact name in the text at word boundaries (GAP marks one
  occurrence per name and has no coreference chains, so the name's string is what the data
  allows); `marked`, the marked occurrence only. An occurrence is left out when it overlaps the pronoun, the other
  candidate's marked occurrence or an occurrence of the other candidate's longer name ("Bo" inside
  "Bo Ng" is Bo Ng's), when both candidates have the same name (it could be either), and when it
  is cut by the window below.
- A head chooses the candidate it attends to more; a tie chooses neither and counts as wrong.
  Accuracy is over the examples where exactly one candidate corefers (chance 50 %), with the
  t interval of `sieves.stats` for the mean of the 0/1 outcomes.
- Baselines, on the same examples and counted occurrences: `nearest`, the candidate with an
  occurrence fewer pieces away from the pronoun (a tie is wrong); `earlier`, the candidate that
  comes first in the text.
- Text longer than the model's positions is cut to a window of `max_length − 2` pieces that holds
  the pronoun and both marked names whole, as central on the pronoun as that allows; an example
  whose three marked mentions do not fit in one window is skipped and counted.
- Heads are chosen on GAP development and scored on GAP test.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx

from analysis.attention.options import COREF_MENTIONS as MENTIONS
from analysis.attention.options import COREF_TARGETS as TARGETS
from analysis.common.finite import check_finite
from analysis.common.forward import compiled, padded_batches
from bertjax import runinfo
from bertjax.errors import UserError
from bertjax.model import Model
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
T = TypeVar("T")


def per_candidate(values: Iterable[T]) -> tuple[T, T]:
    """`values`, one per candidate: exactly two."""
    first, second = values
    return first, second


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
    mentions: tuple[np.ndarray, np.ndarray]  # every piece of each marked name
    label: int
    truncated: bool
    # Per candidate and counted mention (the marked one first): every piece of the mention (the
    # baselines), and the pieces attended to (`target`).
    occurrences: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]
    attended: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]
    id: str  # the GAP row's ID

    @property
    def targets(self) -> tuple[np.ndarray, np.ndarray]:
        """Every piece attended to, per candidate (its mentions' together)."""
        return per_candidate(np.concatenate(mentions) for mentions in self.attended)


def mention_span(path: Path, line: int, text: str, mention: str, field: dict[str, str]) -> tuple[int, int]:
    """Character [start, end) of a GAP row's `mention` (Pronoun, A or B): its text at its offset, and
    a whole word there (not the "he" of a "the": its pieces would be another word's)."""
    offset, name = field[f"{mention}-offset"], field[mention]
    if not (offset.isascii() and offset.isdigit()):  # isdigit alone takes '²', which int() refuses
        raise UserError(f"{path}, line {line}: {mention}-offset {offset!r} is not a character offset")
    start = int(offset)
    end = start + len(name)
    if not name.strip() or text[start:end] != name:
        raise UserError(f"{path}, line {line}: {mention} {name!r} is not at offset {start} of Text")
    if (start > 0 and text[start - 1].isalnum() and name[0].isalnum()) or (
        end < len(text) and text[end].isalnum() and name[-1].isalnum()
    ):
        raise UserError(f"{path}, line {line}: {mention} {name!r} at offset {start} is not a whole word of Text")
    return start, end


def read_gap(path: Path, limit: int | None = None) -> list[GapExample]:
    """The first `limit` rows of a GAP TSV (all by default); a malformed row is a UserError naming it."""
    try:
        # Read once: run.json's sha256 is of the bytes parsed (`runinfo.read_input`).
        with io.StringIO(runinfo.read_input(path).decode("utf-8"), newline="") as f:
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
        spans = [mention_span(path, line, text, mention, field) for mention in ("Pronoun", "A", "B")]
        for (first, a), (second, b) in itertools.combinations(zip(("Pronoun", "A", "B"), spans, strict=True), 2):
            if a[0] < b[1] and b[0] < a[1]:  # one mention twice would score as a candidate against itself
                raise UserError(
                    f"{path}, line {line}: {first} and {second} overlap (characters {a[0]}–{a[1]} and {b[0]}–{b[1]})"
                )
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


def name_occurrences(example: GapExample) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Per candidate, the character spans of its counted mentions (module docstring, `all`): the
    marked one first, then every other word-bounded occurrence of its exact name, in text order."""
    found = [
        [m.span() for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", example.text)] if name else []
        for name in example.names
    ]
    overlaps = lambda a, b: a[0] < b[1] and b[0] < a[1]
    result = []
    for c in range(2):
        marked, other_marked = example.spans[c], example.spans[1 - c]
        others = [] if example.names[c] == example.names[1 - c] else found[c]
        longer = found[1 - c] if len(example.names[1 - c]) > len(example.names[c]) else []
        kept = [
            span
            for span in others
            if not overlaps(span, marked)
            and not overlaps(span, other_marked)
            and not overlaps(span, example.pronoun)
            and not any(overlaps(span, other) for other in longer)
        ]
        result.append([marked, *kept])
    return result[0], result[1]


def window(length: int, width: int, lo: int, hi: int, centre: int) -> int | None:
    """Start of a `width`-piece window of [0, length) that holds pieces lo … hi, centred on
    `centre` as far as that allows; None when lo … hi is wider than `width`."""
    if hi - lo + 1 > width:
        return None
    start = max(hi - width + 1, min(lo, centre - width // 2))
    return int(min(max(start, 0), length - width)) if length > width else 0


def encode_gap(
    tokenizer, examples: Sequence[GapExample], max_length: int, target: str = "head", mentions: str = "all"
) -> tuple[list[CorefInput], dict[str, int]]:
    """Encode the examples where exactly one candidate corefers; (inputs, counts of what was
    read, left out because neither corefers, cut to a window, skipped as too long, scored, the
    unmarked occurrences counted and those cut by the window, and the scored examples whose
    coreferring candidate has an unmarked occurrence counted)."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if mentions not in MENTIONS:
        raise ValueError(f"mentions must be one of {MENTIONS}, got {mentions!r}")
    counts = {"rows": len(examples), "neither": 0, "truncated": 0, "skipped_too_long": 0, "scored": 0,
              "other_mentions": 0, "other_mentions_cut": 0, "antecedent_repeated": 0}  # fmt: skip
    scored = [e for e in examples if e.label is not None]
    counts["neither"] = len(examples) - len(scored)
    if not scored:
        return [], counts
    encoded = tokenizer(
        [e.text for e in scored], add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False
    )
    width = max_length - 2
    inputs: list[CorefInput] = []
    for example, ids, offsets in zip(scored, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        assert example.label is not None  # `scored` holds the labelled rows only
        offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
        pronoun = span_pieces(offsets, *example.pronoun)
        spans = name_occurrences(example) if mentions == "all" else ([example.spans[0]], [example.spans[1]])
        # Per candidate and occurrence (the marked one first): all its pieces, and those attended to.
        pieces = [[span_pieces(offsets, *span) for span in candidate] for candidate in spans]
        aimed = [
            [span_pieces(offsets, *target_span(name, span, target)) for span in candidate]
            for name, candidate in zip(example.names, spans, strict=True)
        ]
        if target == "first":
            aimed = [[t[:1] for t in candidate] for candidate in aimed]
        marked = [candidate[0] for candidate in pieces]
        if not pronoun.size or not all(m.size for m in marked):
            raise UserError(f"GAP {example.id}: a mention covers no wordpiece of the text")
        every = np.concatenate([pronoun, *marked])
        start = window(len(ids), width, int(every.min()), int(every.max()), int(pronoun[0]))
        if start is None:
            counts["skipped_too_long"] += 1
            continue
        stop = min(start + width, len(ids))
        counts["truncated"] += int(stop - start < len(ids))
        # An unmarked occurrence counts only when the window holds it whole (and it has a piece).
        inside = [
            [k == 0 or bool(p.size > 0 and p.min() >= start and p.max() < stop) for k, p in enumerate(candidate)]
            for candidate in pieces
        ]
        kept = [sum(flags) - 1 for flags in inside]
        counts["other_mentions"] += sum(kept)
        counts["other_mentions_cut"] += sum(len(flags) - 1 for flags in inside) - sum(kept)
        counts["antecedent_repeated"] += int(kept[example.label] > 0)
        occurrences = [
            [(p, t) for p, t, keep in zip(*candidate, strict=True) if keep]
            for candidate in zip(pieces, aimed, inside, strict=True)
        ]
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
                seq, shift(pronoun), tuple(map(shift, marked)), example.label, stop - start < len(ids),
                per_candidate(tuple(shift(p) for p, _ in o) for o in occurrences),
                per_candidate(tuple(shift(t) for _, t in o) for o in occurrences), example.id,
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


def candidate_attention(
    attention: jax.Array, from_weights: jax.Array, to_masks: jax.Array, owners: jax.Array
) -> jax.Array:
    """attention [B, L, H, T, T], from_weights [B, T], to_masks [B, K, T] (one row per mention),
    owners int [B, K] (the mention's candidate, 0 or 1; −1 for padding) → [B, L, H, 2]: each
    head's attention from the pronoun to each candidate's most-attended mention (−inf for a
    candidate without a mention)."""
    per_mention = jnp.einsum(
        "bt,blhts,bks->blhk", from_weights, attention, to_masks, precision=jax.lax.Precision.HIGHEST
    )
    owned = owners[:, None, None, None, :] == jnp.arange(2)[:, None]  # [B, 1, 1, 2, K]
    return jnp.where(owned, per_mention[..., None, :], -jnp.inf).max(axis=-1)


def make_candidate_attention_fn(model: Model):
    """A jitted forward returning `candidate_attention` of each batch."""
    run, (state,) = compiled(_jit_candidate_attention, model)
    return lambda *arrays: run(state, *arrays)


def _jit_candidate_attention(graphdef):
    @jax.jit
    def run(state, input_ids, attention_mask, token_type_ids, from_weights, to_masks, owners):
        out = nnx.merge(graphdef, state)(input_ids, attention_mask, token_type_ids, output_attentions=True)
        return candidate_attention(jnp.stack(out.attentions, axis=1), from_weights, to_masks, owners)

    return run


def mention_masks(items: Sequence[CorefInput], length: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(to_masks float32 [rows, K, length], owners int32 [rows, K]) of `items` (padding rows after
    them own no mention); K is the most mentions of an item rounded up to a power of two, so the
    forward compiles for a few K only."""
    most = max((sum(len(a) for a in item.attended) for item in items), default=2)
    width = 1 << (most - 1).bit_length()
    to_masks = np.zeros((rows, width, length), np.float32)
    owners = np.full((rows, width), -1, np.int32)
    for b, item in enumerate(items):
        k = 0
        for c, mentions in enumerate(item.attended):
            for pieces in mentions:
                to_masks[b, k, pieces] = 1.0
                owners[b, k] = c
                k += 1
    return to_masks, owners


def candidate_scores(
    run,
    inputs: Sequence[CorefInput],
    batch_size: int,
    max_length: int,
    first_piece: bool = False,
    desc: str = "GAP",
    allowed: bool = False,
) -> np.ndarray:
    """[N, L, H, 2] attention from each input's pronoun to its two candidates, streamed by batch.
    One that is not finite stops the run (`finite.check_finite`, `allowed` its): a NaN chooses
    neither candidate and would count as a wrong head. (Every candidate keeps its marked mention,
    so −inf, no mention, cannot come back.)"""
    scores: dict[int, np.ndarray] = {}
    for chunk, arrays in padded_batches([item.seq for item in inputs], batch_size, max_length, desc):
        length = arrays["input_ids"].shape[1]
        items = [inputs[seq.index] for seq in chunk]
        from_weights = np.zeros((batch_size, length), np.float32)
        for b, item in enumerate(items):
            from_weights[b] = pronoun_weights(item, length, first_piece)
        to_masks, owners = mention_masks(items, length, batch_size)
        out = np.asarray(
            run(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], from_weights, to_masks, owners)
        )
        for b, seq in enumerate(chunk):
            check_finite(np.moveaxis(out[b], -1, 0), "the attention from the pronoun to a candidate",
                         f"{desc}, example {inputs[seq.index].id}", allowed=allowed)  # fmt: skip
            scores[seq.index] = out[b]
    return np.stack([scores[i] for i in range(len(inputs))]) if inputs else np.zeros((0, 0, 0, 2), np.float32)


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
        pronoun = item.pronoun
        return min(
            int(max(mention.min() - pronoun.max(), pronoun.min() - mention.max(), 0)) for mention in item.occurrences[c]
        )

    def first(item: CorefInput, c: int) -> int:
        return min(int(mention.min()) for mention in item.occurrences[c])

    labels = np.array([item.label for item in inputs], np.int64)
    nearest = np.array([[-distance(item, c) for c in range(2)] for item in inputs], np.float64).reshape(-1, 2)
    earlier = np.array([[-first(item, c) for c in range(2)] for item in inputs], np.float64).reshape(-1, 2)
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
