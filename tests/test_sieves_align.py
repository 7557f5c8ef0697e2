"""Wordpiece ↔ word alignment with the real all-MiniLM-L6-v2 fast tokenizer."""

import re
from pathlib import Path

import numpy as np

from sieves.align import EncodedSequence, encode, encode_batch
from sieves.parse import Word, read_conllu


def words_of(text: str, dep: str = "dep") -> tuple[Word, ...]:
    """Words at runs of word characters and at single punctuation marks, all headed by word 0."""
    return tuple(Word(m.start(), m.end(), dep, 0) for m in re.finditer(r"\w+|[^\w\s]", text))


def pieces(tokenizer, seq: EncodedSequence) -> list[str]:
    return tokenizer.convert_ids_to_tokens(seq.input_ids.tolist())


def test_word_split_into_many_pieces(minilm_tokenizer) -> None:
    text = "electroencephalography works"
    seq = encode(minilm_tokenizer, [text], [words_of(text)])
    tokens = pieces(minilm_tokenizer, seq)
    assert len(tokens) > 5 and tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert seq.word_ids.tolist() == [-1] + [0] * (len(tokens) - 3) + [1, -1]
    assert seq.special.tolist() == [True] + [False] * (len(tokens) - 2) + [True]
    assert seq.is_cls.tolist() == [True] + [False] * (len(tokens) - 1)
    assert seq.is_sep.tolist() == [False] * (len(tokens) - 1) + [True]
    assert seq.num_segments == 1 and seq.token_type_ids.tolist() == [0] * len(tokens)
    assert seq.input_ids.dtype == np.int32 and seq.word_ids.dtype == np.int32


def test_repeated_words_map_by_offset(minilm_tokenizer) -> None:
    text = "the the the"
    seq = encode(minilm_tokenizer, [text], [words_of(text)])
    assert pieces(minilm_tokenizer, seq) == ["[CLS]", "the", "the", "the", "[SEP]"]
    assert seq.word_ids.tolist() == [-1, 0, 1, 2, -1]


def test_punctuation_and_quotes(minilm_tokenizer) -> None:
    text = '"Hello," she said.'
    words = words_of(text)
    assert [text[w.start : w.end] for w in words] == ['"', "Hello", ",", '"', "she", "said", "."]
    seq = encode(minilm_tokenizer, [text], [words])
    assert pieces(minilm_tokenizer, seq) == ["[CLS]", '"', "hello", ",", '"', "she", "said", ".", "[SEP]"]
    assert seq.word_ids.tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, -1]


def test_non_ascii_offsets_point_into_original_text(minilm_tokenizer) -> None:
    text = "naïve café Zürich"
    seq = encode(minilm_tokenizer, [text], [words_of(text)])
    assert pieces(minilm_tokenizer, seq) == ["[CLS]", "naive", "cafe", "zurich", "[SEP]"]
    assert seq.word_ids.tolist() == [-1, 0, 1, 2, -1]


def test_piece_straddling_two_words_goes_to_the_larger_overlap(minilm_tokenizer) -> None:
    text = "don't"
    words = (Word(0, 2, "aux", 1), Word(2, 5, "advmod", 1))  # spaCy's "do" + "n't"
    seq = encode(minilm_tokenizer, [text], [words])
    assert pieces(minilm_tokenizer, seq) == ["[CLS]", "don", "'", "t", "[SEP]"]
    assert seq.word_ids.tolist() == [-1, 0, 1, 1, -1]


def test_pieces_outside_every_word_and_no_parse(minilm_tokenizer) -> None:
    text = "cats , dogs"
    seq = encode(minilm_tokenizer, [text], [(Word(0, 4, "nsubj", 1), Word(7, 11, "root", 1))])
    assert seq.word_ids.tolist() == [-1, 0, -1, 1, -1]
    bare = encode(minilm_tokenizer, [text], None)
    assert bare.word_ids.tolist() == [-1] * 5 and bare.word_dep == () == bare.word_pos and bare.word_head.shape == (0,)


def test_pair_numbers_words_globally(minilm_tokenizer) -> None:
    first, second = "Cats sleep.", "Dogs bark loudly."
    parse_a = (Word(0, 4, "nsubj", 1, "NOUN"), Word(5, 10, "root", 1, "VERB"), Word(10, 11, "punct", 1, "PUNCT"))
    parse_b = (
        Word(0, 4, "nsubj", 1, "NOUN"), Word(5, 9, "root", 1, "VERB"), Word(10, 16, "advmod", 1, "ADV"),
        Word(16, 17, "punct", 1, "PUNCT"),
    )  # fmt: skip
    seq = encode(minilm_tokenizer, [first, second], [parse_a, parse_b], index=7)
    assert pieces(minilm_tokenizer, seq) == [
        "[CLS]", "cats", "sleep", ".", "[SEP]", "dogs", "bark", "loudly", ".", "[SEP]",
    ]  # fmt: skip
    assert seq.word_ids.tolist() == [-1, 0, 1, 2, -1, 3, 4, 5, 6, -1]
    assert seq.token_type_ids.tolist() == [0] * 5 + [1] * 5
    assert seq.is_sep.tolist() == [False] * 4 + [True] + [False] * 4 + [True]
    assert seq.word_dep == ("nsubj", "root", "punct", "nsubj", "root", "advmod", "punct")
    assert seq.word_head.tolist() == [1, 1, 1, 4, 4, 4, 4]
    assert seq.word_pos == ("NOUN", "VERB", "PUNCT", "NOUN", "VERB", "ADV", "PUNCT")
    assert (seq.num_segments, seq.index) == (2, 7)


def test_truncation_keeps_word_indices(minilm_tokenizer) -> None:
    first = "a b c d e f g h"
    second = "electroencephalography is hard"
    parse_b = (Word(0, 22, "nsubj", 2), Word(23, 25, "cop", 2), Word(26, 30, "root", 2))
    seq = encode(minilm_tokenizer, [first, second], [words_of(first), parse_b], max_length=12)
    assert pieces(minilm_tokenizer, seq) == [
        "[CLS]", "a", "b", "c", "d", "e", "[SEP]", "electro", "##ence", "##pha", "##log", "[SEP]",
    ]  # fmt: skip
    # Longest-first trimmed both segments: words f, g, h, "is" and the head "hard" own no piece,
    # the cut word keeps its pieces, and every word keeps its global index and arc.
    assert seq.word_ids.tolist() == [-1, 0, 1, 2, 3, 4, -1, 8, 8, 8, 8, -1]
    assert len(seq.word_dep) == 11 and seq.word_head.tolist()[8:] == [10, 10, 10]


def test_batch_matches_single(minilm_tokenizer) -> None:
    examples = [["The cat sat."], ["A b.", "C d e."], ["naïve café"], ["x", "electroencephalography"]]
    parses = [[words_of(text) for text in example] for example in examples]
    batch = encode_batch(minilm_tokenizer, examples, parses, max_length=8, indices=[3, 5, 8, 9])
    for position, seq in enumerate(batch):
        single = encode(minilm_tokenizer, examples[position], parses[position], 8, [3, 5, 8, 9][position])
        for field in ("input_ids", "token_type_ids", "special", "is_cls", "is_sep", "word_ids", "word_head"):
            np.testing.assert_array_equal(getattr(seq, field), getattr(single, field))
        for field in ("word_dep", "word_pos", "num_segments", "index"):
            assert getattr(seq, field) == getattr(single, field)


def test_gold_trees_align_every_piece_inside_its_word(minilm_tokenizer, ud_english_ewt: Path) -> None:
    sentences = read_conllu(ud_english_ewt / "en_ewt-ud-dev.conllu", limit=300)
    texts = [[text] for text, _ in sentences]
    seqs = encode_batch(minilm_tokenizer, texts, [[words] for _, words in sentences])
    for (text, words), seq in zip(sentences, seqs, strict=True):
        encoding = minilm_tokenizer(text, truncation=True, max_length=128, return_offsets_mapping=True)
        offsets = encoding["offset_mapping"]
        for piece, word_id in enumerate(seq.word_ids.tolist()):
            if seq.special[piece]:
                assert word_id == -1
                continue
            start, end = offsets[piece]
            word = words[word_id]
            assert word.start < end and start < word.end
