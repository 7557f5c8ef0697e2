"""The sieves for any tokenizer: the delimiter roles follow the tokenizer's own class and separator
tokens, the segments come from the separators (RoBERTa and ModernBERT have no token-type ids), and
word alignment holds for byte-level BPE pieces (`Ġword`). Tiny byte-level BPE tokenizers in
RoBERTa's layout (`<s> A </s></s> B </s>`) and ModernBERT's (`[CLS] A [SEP] B [SEP]`, token types
all 0) are trained here on MRPC's text with the `tokenizers` library. The models of those families
are not part of this test: it scores planted attention through the sieve kernel."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bertjax import glue
from sieves import align, stats
from sieves.align import EncodedSequence, encode_batch
from sieves.builders import SieveOptions, build_batch
from sieves.kernel import sieve_scores
from sieves.parse import Word

N_PAIRS = 40
ROLES = ("block", "cls", "sep", "delimiter")


@pytest.fixture(scope="module")
def pairs(shared_data) -> list[tuple[str, str]]:
    examples = glue.load_glue("mrpc", "dev", shared_data / "glue", 400)
    # ASCII text: each byte-level piece then decodes to whole characters, which the reference
    # alignment below reads the pieces by.
    return [e.segments for e in examples if all(s.isascii() for s in e.segments)][:N_PAIRS]


def train_bpe(directory: Path, texts: list[str], layout: str, trim_offsets: bool = True):
    """A byte-level BPE tokenizer of 600 tokens in RoBERTa's or ModernBERT's layout, saved as
    tokenizer.json + tokenizer_config.json and loaded as transformers loads a hub checkpoint's."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import AutoTokenizer

    if layout == "roberta":
        special = {"cls_token": "<s>", "sep_token": "</s>", "bos_token": "<s>", "eos_token": "</s>",
                   "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"}  # fmt: skip
        names = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    else:
        special = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                   "mask_token": "[MASK]"}  # fmt: skip
        names = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    bpe = ByteLevelBPETokenizer(trim_offsets=trim_offsets)
    bpe.train_from_iterator(texts, vocab_size=600, min_frequency=2, special_tokens=names)
    cls, sep = (bpe.token_to_id(special[k]) for k in ("cls_token", "sep_token"))
    if layout == "roberta":
        bpe._tokenizer.post_processor = processors.RobertaProcessing(
            (special["sep_token"], sep), (special["cls_token"], cls), trim_offsets=trim_offsets
        )
    else:  # no token-type ids: B's pieces are type 0 too
        bpe._tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
        )
    directory.mkdir(parents=True)
    bpe.save(str(directory / "tokenizer.json"))
    tokenizer_class = "RobertaTokenizer" if layout == "roberta" else "PreTrainedTokenizerFast"
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": tokenizer_class, "trim_offsets": trim_offsets, **special})
    )
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert tokenizer.is_fast and len(tokenizer) == 600
    return tokenizer


def whitespace_words(text: str) -> tuple[Word, ...]:
    return tuple(Word(m.start(), m.end(), "dep", i) for i, m in enumerate(re.finditer(r"\S+", text)))


def encoded(tokenizer, pairs, max_length: int = 256) -> list[EncodedSequence]:
    parses = [tuple(whitespace_words(s) for s in pair) for pair in pairs]
    return encode_batch(tokenizer, pairs, parses, max_length)


@pytest.fixture(scope="module")
def roberta(tmp_path_factory, pairs):
    texts = [s for pair in pairs for s in pair]
    return train_bpe(tmp_path_factory.mktemp("roberta") / "tok", texts, "roberta")


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory, pairs):
    texts = [s for pair in pairs for s in pair]
    return train_bpe(tmp_path_factory.mktemp("modernbert") / "tok", texts, "modernbert")


# -- the layouts: delimiter tokens and segments --------------------------------------------------


def test_roberta_pairs_mark_their_own_delimiters_and_segments(roberta, pairs):
    open_id, close_id = roberta.convert_tokens_to_ids(["<s>", "</s>"])
    for seq in encoded(roberta, pairs):
        ids = seq.input_ids
        closes = np.flatnonzero(ids == close_id)
        # <s> A </s></s> B </s>: three </s>, the first two adjacent.
        assert ids[0] == open_id and len(closes) == 3 and closes[1] == closes[0] + 1 and closes[2] == seq.length - 1
        assert np.flatnonzero(seq.is_cls).tolist() == [0]
        assert np.flatnonzero(seq.is_sep).tolist() == closes.tolist()
        assert not seq.token_type_ids.any()  # RoBERTa's model input: no token types
        expected = np.r_[np.zeros(closes[0] + 1, int), np.ones(seq.length - closes[0] - 1, int)]
        np.testing.assert_array_equal(seq.segments, expected)


def test_modernbert_pairs_mark_cls_and_sep_and_segments_without_token_types(modernbert, pairs):
    cls_id, sep_id = modernbert.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    for seq in encoded(modernbert, pairs):
        seps = np.flatnonzero(seq.input_ids == sep_id)
        assert seq.input_ids[0] == cls_id and len(seps) == 2 and not seq.token_type_ids.any()
        assert np.flatnonzero(seq.is_cls).tolist() == [0] and np.flatnonzero(seq.is_sep).tolist() == seps.tolist()
        np.testing.assert_array_equal(seq.segments, np.arange(seq.length) > seps[0])


def test_bert_segments_are_its_token_type_ids(minilm_tokenizer, pairs):
    for seq in encoded(minilm_tokenizer, pairs, 128):
        np.testing.assert_array_equal(seq.segments, seq.token_type_ids)


# -- word alignment of byte-level pieces ---------------------------------------------------------


def reference_word_ids(tokenizer, seq: EncodedSequence, pairs_text: tuple[str, ...]) -> np.ndarray:
    """Word of each piece read from the pieces' own text, not their offsets: each segment is the
    concatenation of its pieces decoded (Ġ is a space), and a piece belongs to the whitespace word
    holding its first non-space character."""
    expected = np.full(seq.length, -1)
    tokens = tokenizer.convert_ids_to_tokens(seq.input_ids.tolist())
    special = set(tokenizer.all_special_tokens)
    first_word, position = 0, 0
    segment = -1
    for t, token in enumerate(tokens):
        if token in special:
            if t > 0 and tokens[t - 1] not in special:  # a segment ended
                first_word += len(whitespace_words(pairs_text[segment]))
            continue
        if t == 0 or tokens[t - 1] in special:  # a segment starts
            segment, position = segment + 1, 0
        text = tokenizer.convert_tokens_to_string([token])
        stripped = len(text) - len(text.lstrip())
        if stripped < len(text):
            words = whitespace_words(pairs_text[segment])
            char = position + stripped
            expected[t] = first_word + next(i for i, w in enumerate(words) if w.start <= char < w.end)
        position += len(text)
    return expected


@pytest.mark.parametrize("trim_offsets", [True, False], ids=["trimmed", "untrimmed"])
def test_byte_level_pieces_align_to_their_words(trim_offsets, pairs, tmp_path):
    tokenizer = train_bpe(tmp_path / "tok", [s for p in pairs for s in p], "roberta", trim_offsets)
    # Untrimmed, a `Ġword` piece's offsets start at its space; trimmed, at the word.
    text = pairs[0][0]
    spans = tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    assert any(text[a] == " " for a, b in spans if b > a) == (not trim_offsets)
    for seq, pair in zip(encoded(tokenizer, pairs), pairs, strict=True):
        np.testing.assert_array_equal(seq.word_ids, reference_word_ids(tokenizer, seq, pair))


def test_the_alignment_reference_catches_pieces_one_character_off(roberta, pairs):
    """The planted defect: offsets one character late (the piece `Ġword` read as starting at its
    space, then shifted) give other words, which the reference comparison must catch."""
    pair = pairs[0]
    batch = roberta(*[[s] for s in pair], return_offsets_mapping=True, return_token_type_ids=True)
    shifted = [(a + 1, b + 1) if b > a else (a, b) for a, b in batch["offset_mapping"][0]]
    wrong = align._align(batch["input_ids"][0], batch["token_type_ids"][0], shifted, batch.sequence_ids(0),
                         [whitespace_words(s) for s in pair], 2, 0, roberta.cls_token_id, roberta.sep_token_id)  # fmt: skip
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(wrong.word_ids, reference_word_ids(roberta, wrong, pair))


# -- planted heads on RoBERTa-layout MRPC pairs --------------------------------------------------


PLANTED = ("close", "open", "block", "uniform")


def planted_attention(seq: EncodedSequence, close_id: int, open_id: int) -> np.ndarray:
    """[H, n, n]: a head on every `</s>`, one on `<s>`, one on the content of its row's segment
    (read from the token ids: A between `<s>` and the first `</s>`, B after the second), uniform."""
    n, ids = seq.length, seq.input_ids
    closes = np.flatnonzero(ids == close_id)
    content = (ids != close_id) & (ids != open_id)
    positions = np.arange(n)
    in_b = positions > closes[0]  # the row's segment: `</s>` closing A is A's
    same = np.where(in_b[:, None], content & (positions > closes[1]), content & (positions < closes[0]))
    heads = [np.broadcast_to(ids == close_id, (n, n)), np.broadcast_to(ids == open_id, (n, n)), same, np.ones((n, n))]
    return np.stack([h / h.sum(-1, keepdims=True) for h in np.asarray(heads, float)])


def planted_scores(seqs: list[EncodedSequence], close_id: int, open_id: int) -> tuple[np.ndarray, np.ndarray]:
    length = max(s.length for s in seqs)
    attention = np.zeros((1, len(seqs), len(PLANTED), length, length), np.float32)
    real = np.zeros((len(seqs), length), bool)
    for b, seq in enumerate(seqs):
        attention[0, b, :, : seq.length, : seq.length] = planted_attention(seq, close_id, open_id)
        real[b, : seq.length] = True
    rows, sieves = build_batch(seqs, ROLES, SieveOptions(), length)
    scores, counts = sieve_scores(attention, real, rows, sieves)
    return np.asarray(scores)[:, :, 0], np.asarray(counts)  # [R, B, H], [R, B]


def expected_block(seq: EncodedSequence, close_id: int, open_id: int) -> float:
    """The perfect block head's mean β over all rows: n / |S(t)|, S(t) the content of t's segment."""
    ids, n = seq.input_ids, seq.length
    closes = np.flatnonzero(ids == close_id)
    content = (ids != close_id) & (ids != open_id)
    size_a, size_b = content[: closes[0]].sum(), content[closes[1] :].sum()
    rows_a = closes[0] + 1
    return float((rows_a * n / size_a + (n - rows_a) * n / size_b) / n)


def test_a_head_on_close_tokens_holds_sep_and_the_segments_are_the_separators(roberta, pairs, monkeypatch):
    seqs = encoded(roberta, pairs, 128)
    close_id, open_id = roberta.convert_tokens_to_ids(["</s>", "<s>"])
    scores, counts = planted_scores(seqs, close_id, open_id)
    assert (counts > 0).all()
    assigned = {
        head: {role for r, role in enumerate(ROLES)
               if stats.assign(stats.one_sided_test(scores[r, :, h], 3.0, axis=0).p_value, 0.05)}
        for h, head in enumerate(PLANTED)
    }  # fmt: skip
    assert assigned == {"close": {"sep", "delimiter"}, "open": {"cls", "delimiter"}, "block": set(), "uniform": set()}
    # Exactly: β = n / |S(t)| on every row, so the mean is n / 3 (three </s>), n (one <s>), n / 4
    # (both) and 1 (uniform). float32 sums of ≤ 128 terms, then a mean over ≤ 128 rows: relative
    # error ≤ ~3 · 128 · 2⁻²⁴ ≈ 2.3e-5, hence rtol 1e-4 (a wrong sieve is off by O(1)).
    n = np.array([s.length for s in seqs], float)
    sep, cls, delimiter, block = (ROLES.index(r) for r in ("sep", "cls", "delimiter", "block"))
    np.testing.assert_allclose(scores[sep, :, PLANTED.index("close")], n / 3, rtol=1e-4)
    np.testing.assert_allclose(scores[cls, :, PLANTED.index("open")], n, rtol=1e-4)
    np.testing.assert_allclose(scores[delimiter, :, PLANTED.index("close")], n / 4, rtol=1e-4)
    np.testing.assert_allclose(scores[:, :, PLANTED.index("uniform")], 1, rtol=1e-4)
    block_expected = [expected_block(s, close_id, open_id) for s in seqs]
    np.testing.assert_allclose(scores[block, :, PLANTED.index("block")], block_expected, rtol=1e-4)

    # The planted defect: segments read from RoBERTa's token-type ids (all 0) make `block` the
    # whole sequence, and the perfect block head scores about 1 instead.
    monkeypatch.setattr(EncodedSequence, "segments", property(lambda s: s.token_type_ids))
    wrong, _ = planted_scores(seqs, close_id, open_id)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(wrong[block, :, PLANTED.index("block")], block_expected, rtol=1e-4)


def test_a_tokenizer_without_cls_and_sep_names_uses_its_begin_and_end_tokens(pairs, tmp_path):
    """A GPT-style BPE tokenizer names only bos/eos: those are its delimiters."""
    tokenizer = train_bpe(tmp_path / "tok", [s for p in pairs for s in p], "roberta")
    tokenizer.cls_token = tokenizer.sep_token = None
    assert tokenizer.cls_token_id is None and tokenizer.sep_token_id is None
    seq = encoded(tokenizer, pairs[:1])[0]
    assert np.flatnonzero(seq.is_cls).tolist() == [0] and seq.is_sep.sum() == 3


def test_an_unnamed_tokenizer_of_a_roberta_checkpoint_is_not_read_as_bert(tmp_path):
    """roberta-base's tokenizer_config.json names no class: the model's type decides, as for
    AutoTokenizer (BertTokenizerFast over a BPE tokenizer.json would have no [CLS] or [SEP])."""
    from transformers import AutoTokenizer, BertTokenizerFast

    from bertjax import pretrained

    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    assert pretrained._tokenizer_class(tmp_path) is AutoTokenizer
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert pretrained._tokenizer_class(tmp_path) is BertTokenizerFast


# -- end to end: a RoBERTa model with a planted `</s>` head ----------------------------------------


def planted_roberta(directory: Path, tokenizer) -> Path:
    """A tiny random RoBERTa (transformers' RobertaForMaskedLM, saved as a hub checkpoint is) whose
    layer 0 head 0 attends to `</s>` only: its query is a constant, its key reads one embedding
    dimension, and `</s>`'s word embedding is large in that dimension alone. Beside it, `tokenizer`."""
    import torch
    import transformers

    close = tokenizer.convert_tokens_to_ids("</s>")
    config = transformers.RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=close,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.RobertaForMaskedLM(config)
    with torch.no_grad():
        model.roberta.embeddings.word_embeddings.weight[close] = torch.nn.functional.one_hot(torch.tensor(1), 32)
        attention = model.roberta.encoder.layer[0].attention.self
        attention.query.weight[:16] = 0
        attention.query.bias[:16] = torch.nn.functional.one_hot(torch.tensor(0), 16)
        attention.key.weight[:16] = 0
        attention.key.bias[:16] = 0
        # After the embedding LayerNorm `</s>` is ~5.6 in dimension 1 and any other token ~N(0, 1):
        # scores 40 · 5.6 / 4 = 56 against ~N(0, 10), so the head's mass off `</s>` is < e^-20.
        attention.key.weight[0, 1] = 40.0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_roberta_heads_planted_close_attention_holds_sep_on_mrpc(roberta, shared_data, tmp_path):
    import pandas as pd

    from analysis import roles as roles_cli

    ckpt = planted_roberta(tmp_path / "roberta", roberta)
    out = tmp_path / "roles"
    roles_cli.main(["--ckpt", str(ckpt), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "40",
                    "--roles", "block,cls,sep,delimiter", "--no-figures", "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / "roles.csv").set_index(["layer", "head", "role"])
    held = set(table[table["assigned"]].loc[(0, 0)].index)
    assert held == {"sep", "delimiter"}, held
    # β of a head on every `</s>` alone is n / 3 on each row (three `</s>` in a pair).
    assert table.loc[(0, 0, "sep"), "mean"] > 10 and table.loc[(0, 0, "cls"), "mean"] < 0.01
