"""Sieve builders against hand-written masks, and the role registry."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax.errors import UserError
from sieves.align import EncodedSequence, encode_batch
from sieves.builders import DEFAULT_ROLES, ROLES, SieveOptions, build_batch, register_role
from sieves.parse import read_conllu

CLS, SEP = 101, 102


def make_seq(
    types: list[int],
    word_ids: list[int] | None = None,
    deps: tuple[str, ...] = (),
    heads: tuple[int, ...] = (),
    num_segments: int | None = None,
) -> EncodedSequence:
    """A sequence with [CLS] first and a [SEP] closing each run of equal token types."""
    n = len(types)
    is_sep = np.array([t == n - 1 or types[t + 1] != types[t] for t in range(n)])
    is_cls = np.arange(n) == 0
    return EncodedSequence(
        input_ids=np.where(is_cls, CLS, np.where(is_sep, SEP, 1000)).astype(np.int32),
        token_type_ids=np.asarray(types, dtype=np.int32),
        special=is_cls | is_sep,
        is_cls=is_cls,
        is_sep=is_sep,
        word_ids=np.asarray(word_ids if word_ids is not None else [-1] * n, dtype=np.int32),
        word_dep=deps,
        word_head=np.asarray(heads, dtype=np.int32),
        num_segments=num_segments or len(set(types)),
        index=0,
    )


DEFAULT_OPTIONS = SieveOptions()


def masks_as_sets(role: str, seq: EncodedSequence, options: SieveOptions = DEFAULT_OPTIONS) -> dict[int, set[int]]:
    """The role's scored rows mapped to their sieves, checking that no scored row has an empty one."""
    rows, sieve = ROLES[role].build(seq, options)
    assert rows.shape == (seq.length,) and sieve.shape == (seq.length, seq.length)
    assert sieve[rows].any(axis=1).all(), "a scored row has an empty sieve"
    return {t: set(np.flatnonzero(sieve[t]).tolist()) for t in np.flatnonzero(rows).tolist()}


# [CLS] a b [SEP] c d e [SEP]
PAIR = make_seq([0, 0, 0, 0, 1, 1, 1, 1])
SINGLE = make_seq([0, 0, 0, 0, 0])  # [CLS] a b c [SEP]


def test_local_clips_at_both_ends() -> None:
    assert masks_as_sets("local", PAIR) == {
        0: {0, 1, 2}, 1: {0, 1, 2, 3}, 2: {0, 1, 2, 3, 4}, 3: {1, 2, 3, 4, 5},
        4: {2, 3, 4, 5, 6}, 5: {3, 4, 5, 6, 7}, 6: {4, 5, 6, 7}, 7: {5, 6, 7},
    }  # fmt: skip
    assert masks_as_sets("local", SINGLE, SieveOptions(window=1)) == {
        0: {0, 1}, 1: {0, 1, 2}, 2: {1, 2, 3}, 3: {2, 3, 4}, 4: {3, 4},
    }  # fmt: skip


def test_prev_and_next() -> None:
    assert masks_as_sets("prev", PAIR) == {
        1: {0}, 2: {0, 1}, 3: {1, 2}, 4: {2, 3}, 5: {3, 4}, 6: {4, 5}, 7: {5, 6},
    }  # fmt: skip
    assert masks_as_sets("next", PAIR) == {
        0: {1, 2}, 1: {2, 3}, 2: {3, 4}, 3: {4, 5}, 4: {5, 6}, 5: {6, 7}, 6: {7},
    }  # fmt: skip
    wide = SieveOptions(window=3)
    assert masks_as_sets("prev", SINGLE, wide) == {1: {0}, 2: {0, 1}, 3: {0, 1, 2}, 4: {1, 2, 3}}
    assert masks_as_sets("next", SINGLE, wide) == {0: {1, 2, 3}, 1: {2, 3, 4}, 2: {3, 4}, 3: {4}}


def test_block_uses_token_types_and_skips_specials() -> None:
    segment_a, segment_b = {1, 2}, {4, 5, 6}
    assert masks_as_sets("block", PAIR) == {
        0: segment_a, 1: segment_a, 2: segment_a, 3: segment_a,
        4: segment_b, 5: segment_b, 6: segment_b, 7: segment_b,
    }  # fmt: skip


def test_block_is_undefined_on_single_segments() -> None:
    assert ROLES["block"].needs_pair
    assert masks_as_sets("block", SINGLE) == {}
    rows, sieves = build_batch([SINGLE], ["block"], SieveOptions(), 8)
    assert not rows.any() and not sieves.any()


def test_delimiter_roles() -> None:
    every = range(PAIR.length)
    assert masks_as_sets("cls", PAIR) == {t: {0} for t in every}
    assert masks_as_sets("sep", PAIR) == {t: {3, 7} for t in every}
    assert masks_as_sets("delimiter", PAIR) == {t: {0, 3, 7} for t in every}
    assert masks_as_sets("sep", SINGLE) == {t: {4} for t in range(SINGLE.length)}


def test_special_rows_switch() -> None:
    no_specials = SieveOptions(special_rows=False)
    for role in ("local", "prev", "next", "block", "cls", "sep", "delimiter"):
        scored = set(masks_as_sets(role, PAIR, no_specials))
        assert scored == set(masks_as_sets(role, PAIR)) - {0, 3, 7}
    assert masks_as_sets("local", PAIR, no_specials)[1] == {0, 1, 2, 3}  # specials stay keys


POSITIONAL_ROLES = ("local", "prev", "next", "block", "cls", "sep", "delimiter")


def design_table(lengths: list[int], window: int, special_rows: bool) -> dict[str, dict[int, set[int]]]:
    """docs/roles.md's sieve table, one (t, s) pair at a time, for [CLS] A [SEP] (B [SEP]) whose segments
    hold `lengths` non-special tokens: each role's scored rows (non-empty S(t)) mapped to S(t)."""
    seps = [lengths[0] + 1] if len(lengths) == 1 else [lengths[0] + 1, lengths[0] + lengths[1] + 2]
    n = seps[-1] + 1
    specials = {0, *seps}
    segment = [0 if t <= seps[0] else 1 for t in range(n)]
    two_segments = len(lengths) == 2
    row_rules = {
        "local": lambda t: True,
        "prev": lambda t: t >= 1,
        "next": lambda t: t <= n - 2,
        "block": lambda t: two_segments,
        "cls": lambda t: True,
        "sep": lambda t: True,
        "delimiter": lambda t: True,
    }
    key_rules = {
        "local": lambda t, s: abs(s - t) <= window,
        "prev": lambda t, s: t - window <= s <= t - 1,
        "next": lambda t, s: t + 1 <= s <= t + window,
        "block": lambda t, s: segment[s] == segment[t] and s not in specials,
        "cls": lambda t, s: s == 0,
        "sep": lambda t, s: s in seps,
        "delimiter": lambda t, s: s == 0 or s in seps,
    }
    table = {}
    for role in POSITIONAL_ROLES:
        table[role] = {}
        for t in range(n):
            if not row_rules[role](t) or (t in specials and not special_rows):
                continue
            sieve = {s for s in range(n) if key_rules[role](t, s)}
            if sieve:
                table[role][t] = sieve
    return table


@st.composite
def positional_layouts(draw) -> tuple[list[int], SieveOptions, int]:
    lengths = draw(st.lists(st.integers(0, 7), min_size=1, max_size=2))
    n = sum(lengths) + len(lengths) + 1
    options = SieveOptions(window=draw(st.integers(1, n + 2)), special_rows=draw(st.booleans()))
    return lengths, options, n + draw(st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(positional_layouts())
def test_positional_roles_match_the_design_table(layout: tuple[list[int], SieveOptions, int]) -> None:
    """Every positional and delimiter role, on random one- and two-segment layouts (segments of 0 or
    1 token, windows wider than the sequence, padding), equals docs/roles.md's table read pair by pair,
    and the roles fit together as the table implies."""
    lengths, options, padded = layout
    types = [0] * (lengths[0] + 2) + [1] * (lengths[1] + 1 if len(lengths) == 2 else 0)
    seq = make_seq(types, num_segments=len(lengths))
    n = seq.length
    rows, sieves = build_batch([seq], POSITIONAL_ROLES, options, length=padded)
    expected = design_table(lengths, options.window, options.special_rows)
    built = {}
    for r, role in enumerate(POSITIONAL_ROLES):
        built[role] = sieves[r, 0, :n, :n]
        scored = np.flatnonzero(rows[r, 0]).tolist()
        assert {t: set(np.flatnonzero(sieves[r, 0, t]).tolist()) for t in scored} == expected[role], role
        assert sieves[r, 0, rows[r, 0]].any(axis=1).all(), role
        assert not rows[r, 0, n:].any() and not sieves[r, 0, n:].any() and not sieves[r, 0, :, n:].any(), role
    itself = np.eye(n, dtype=bool)
    np.testing.assert_array_equal(built["prev"] | itself | built["next"], built["local"])
    np.testing.assert_array_equal(built["cls"] | built["sep"], built["delimiter"])
    assert not built["block"][:, seq.special].any()


# [CLS] she ate red app ##les quick ##ly . [SEP]
#   words: 0 she(nsubj→1) 1 ate(root) 2 red(amod→3) 3 apples(dobj→1) 4 quickly(advmod→1)
#          5 .(punct→1)
SENTENCE = make_seq(
    [0] * 10,
    word_ids=[-1, 0, 1, 2, 3, 3, 4, 4, 5, -1],
    deps=("nsubj", "root", "amod", "dobj", "advmod", "punct"),
    heads=(1, 1, 3, 1, 1, 1),
)


def test_relations() -> None:
    assert masks_as_sets("nsubj", SENTENCE) == {1: {2}}
    assert masks_as_sets("dobj", SENTENCE) == {4: {2}, 5: {2}}
    assert masks_as_sets("amod", SENTENCE) == {3: {4, 5}}
    assert masks_as_sets("advmod", SENTENCE) == {6: {2}, 7: {2}}
    assert masks_as_sets("syntactic", SENTENCE) == {1: {2}, 3: {4, 5}, 4: {2}, 5: {2}, 6: {2}, 7: {2}}
    assert all(ROLES[r].needs_parse for r in ("nsubj", "dobj", "amod", "advmod", "syntactic"))


def test_relations_need_both_words_and_a_distinct_head() -> None:
    # Truncated after "red": "apples" (amod head; dobj word) owns no piece. "ate" is tagged advmod
    # but heads itself, so it is no row either.
    truncated = make_seq(
        [0] * 5,
        word_ids=[-1, 0, 1, 2, -1],
        deps=("nsubj", "advmod", "amod", "dobj", "advmod", "punct"),
        heads=(1, 1, 3, 1, 1, 1),
    )
    assert masks_as_sets("nsubj", truncated) == {1: {2}}
    assert masks_as_sets("amod", truncated) == {}
    assert masks_as_sets("dobj", truncated) == {}
    assert masks_as_sets("advmod", truncated) == {}
    assert masks_as_sets("syntactic", truncated) == {1: {2}}
    assert masks_as_sets("syntactic", PAIR) == {}  # no parse at all


def test_pair_relations_stay_within_their_words() -> None:
    # [CLS] dogs bark [SEP] cats [SEP]: global words 0 dogs(nsubj→1) 1 bark 2 cats(nsubj→2: root)
    seq = make_seq([0, 0, 0, 0, 1, 1], word_ids=[-1, 0, 1, -1, 2, -1], deps=("nsubj", "root", "nsubj"), heads=(1, 1, 2))
    assert masks_as_sets("nsubj", seq) == {1: {2}}


def test_build_batch_pads_and_orders_roles() -> None:
    roles = ["local", "block", "nsubj"]
    rows, sieves = build_batch([PAIR, SENTENCE, SINGLE], roles, SieveOptions(), length=12)
    assert rows.shape == (3, 3, 12) and sieves.shape == (3, 3, 12, 12)
    assert rows.dtype == bool and sieves.dtype == bool
    for r, role in enumerate(roles):
        for b, seq in enumerate([PAIR, SENTENCE, SINGLE]):
            expected_rows, expected_sieve = ROLES[role].build(seq, SieveOptions())
            np.testing.assert_array_equal(rows[r, b, : seq.length], expected_rows)
            np.testing.assert_array_equal(sieves[r, b, : seq.length, : seq.length], expected_sieve)
            assert not rows[r, b, seq.length :].any()
            assert not sieves[r, b, seq.length :].any() and not sieves[r, b, :, seq.length :].any()
    with pytest.raises(ValueError, match="more than length"):
        build_batch([SENTENCE], ["local"], SieveOptions(), length=8)
    with pytest.raises(UserError, match="unknown role 'nope'"):
        build_batch([SENTENCE], ["nope"], SieveOptions(), length=12)


def test_build_batch_drops_rows_with_empty_sieves() -> None:
    # A two-segment input whose segment A lost every piece: [CLS] [SEP] b [SEP].
    seq = make_seq([0, 0, 1, 1])
    rows, _ = build_batch([seq], ["block"], SieveOptions(), length=4)
    assert rows[0, 0].tolist() == [False, False, True, True]


def test_registry() -> None:
    assert DEFAULT_ROLES == (
        "local", "prev", "next", "block", "cls", "sep", "delimiter",
        "nsubj", "dobj", "amod", "advmod", "syntactic",
    )  # fmt: skip
    assert set(DEFAULT_ROLES) <= set(ROLES)
    assert {name: ROLES[name].coarse for name in DEFAULT_ROLES} == {
        "local": "local", "prev": "local", "next": "local", "block": "block",
        "cls": "delimiter", "sep": "delimiter", "delimiter": "delimiter",
        "nsubj": "syntactic", "dobj": "syntactic", "amod": "syntactic", "advmod": "syntactic",
        "syntactic": "syntactic",
    }  # fmt: skip
    assert [name for name in DEFAULT_ROLES if ROLES[name].needs_pair] == ["block"]


def test_a_new_role_is_one_builder_and_a_name() -> None:
    @register_role("self", coarse="local")
    def self_sieve(seq, options):
        return np.ones(seq.length, dtype=bool), np.eye(seq.length, dtype=bool)

    try:
        assert masks_as_sets("self", SINGLE) == {t: {t} for t in range(5)}
        rows, _ = build_batch([SINGLE], ["self", "local"], SieveOptions(), 6)
        assert rows[0, 0, :5].all()
        with pytest.raises(ValueError, match="already registered"):
            register_role("self", coarse="local")(self_sieve)
    finally:
        del ROLES["self"]


def test_window_must_be_positive() -> None:
    with pytest.raises(UserError, match="window"):
        SieveOptions(window=0)


def test_real_sequences_have_non_empty_sieves(minilm_tokenizer, ud_english_ewt: Path) -> None:
    sentences = read_conllu(ud_english_ewt / "en_ewt-ud-dev.conllu", limit=40)
    pairs = [[sentences[i][0], sentences[i + 1][0]] for i in range(0, 40, 2)]
    parses = [[sentences[i][1], sentences[i + 1][1]] for i in range(0, 40, 2)]
    seqs = encode_batch(minilm_tokenizer, pairs, parses, max_length=24)
    rows, _ = build_batch(seqs, DEFAULT_ROLES, SieveOptions(), length=24)
    for r, role in enumerate(DEFAULT_ROLES):
        for b, seq in enumerate(seqs):
            built_rows, built_sieve = ROLES[role].build(seq, SieveOptions())
            assert built_sieve[built_rows].any(axis=1).all(), (role, b)
            np.testing.assert_array_equal(rows[r, b, : seq.length], built_rows)
    assert rows[DEFAULT_ROLES.index("syntactic")].any()
    assert (rows[DEFAULT_ROLES.index("syntactic")] == rows[7:11].any(axis=0)).all()


def _one_at_a_time(seqs, roles, options, length):
    """The slow, obvious reference of `build_batch`: each role's one-sequence builder, sequence by
    sequence, written into the padded arrays."""
    rows = np.zeros((len(roles), len(seqs), length), dtype=bool)
    sieves = np.zeros((len(roles), len(seqs), length, length), dtype=bool)
    for r, role in enumerate(roles):
        for b, seq in enumerate(seqs):
            seq_rows, seq_sieve = ROLES[role].build(seq, options)
            sieves[r, b, : seq.length, : seq.length] = seq_sieve
            rows[r, b, : seq.length] = seq_rows & seq_sieve.any(axis=1)
    return rows, sieves


def _real_batches(minilm_tokenizer, ud_english_ewt: Path):
    """Pairs and single sentences of UD English-EWT with their gold parses, at a length that cuts
    some (truncated words own no piece), in batches mixing lengths and segment counts; and a pair
    whose segment A lost every piece, a pair without a parse, and the hand-made sequences above."""
    sentences = read_conllu(ud_english_ewt / "en_ewt-ud-dev.conllu", limit=60)
    pairs = encode_batch(
        minilm_tokenizer,
        [[sentences[i][0], sentences[i + 1][0]] for i in range(0, 40, 2)],
        [[sentences[i][1], sentences[i + 1][1]] for i in range(0, 40, 2)],
        max_length=40,
    )
    singles = encode_batch(minilm_tokenizer, [[s[0]] for s in sentences[40:]], [[s[1]] for s in sentences[40:]], 40)
    unparsed = encode_batch(minilm_tokenizer, [[sentences[0][0], sentences[1][0]]], None, max_length=40)
    made = [
        PAIR,
        SINGLE,
        make_seq([0, 0, 1, 1]),
        make_seq([0, 0, 0, 0, 1, 1], [-1, 0, 1, -1, 2, -1], ("nsubj",) * 3, (1, 1, 2)),
    ]
    return [pairs[:7], pairs[7:] + singles[:3], singles[3:], unparsed + made]


@pytest.mark.parametrize("window", [1, 2, 3])
@pytest.mark.parametrize("special_rows", [True, False])
@pytest.mark.parametrize("first_sep_in_b", [True, False])
def test_batch_builders_give_the_one_sequence_builders_masks(
    minilm_tokenizer, ud_english_ewt: Path, window, special_rows, first_sep_in_b
) -> None:
    options = SieveOptions(window, special_rows, first_sep_in_b)
    assert all(ROLES[role].batch is not None for role in DEFAULT_ROLES)
    for seqs in _real_batches(minilm_tokenizer, ud_english_ewt):
        length = max(seq.length for seq in seqs) + 3  # padding past every sequence
        found, expected = (
            build_batch(seqs, DEFAULT_ROLES, options, length),
            _one_at_a_time(seqs, DEFAULT_ROLES, options, length),
        )
        np.testing.assert_array_equal(found[0], expected[0])
        np.testing.assert_array_equal(found[1], expected[1])


@pytest.mark.parametrize("role", ["prev", "block", "nsubj"])
def test_a_planted_batch_builder_defect_is_caught(minilm_tokenizer, ud_english_ewt: Path, role, monkeypatch) -> None:
    # Each defect is one a batch builder could plausibly make: prev's window taking the token
    # itself, block's separator columns kept, a relation's sieve not cut to its rows.
    import dataclasses

    correct = ROLES[role].batch

    def planted(padded, options):
        rows, sieve = correct(padded, options)
        if role == "prev":
            return rows, sieve | (padded.pairs & np.eye(padded.length, dtype=bool))
        if role == "block":
            return rows, sieve | (padded.pairs & padded.is_sep[:, None, :])
        word_ids, head, _, _ = padded.arcs
        return rows, padded.pairs & (word_ids[:, None, :] == head[:, :, None])

    monkeypatch.setitem(ROLES, role, dataclasses.replace(ROLES[role], batch=planted))
    options = SieveOptions()
    mismatched = False
    for seqs in _real_batches(minilm_tokenizer, ud_english_ewt):
        length = max(seq.length for seq in seqs)
        found, expected = build_batch(seqs, [role], options, length), _one_at_a_time(seqs, [role], options, length)
        mismatched |= not (np.array_equal(found[0], expected[0]) and np.array_equal(found[1], expected[1]))
    assert mismatched
