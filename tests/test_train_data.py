"""Pre-training data: corpora, NSP instances, masking, preparation and the training iterator."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax import cli
from bertjax.errors import UserError
from train import config as train_config
from train import corpora
from train.corpora import (
    CorpusConfig,
    SentenceSegmenter,
    corpus_files,
    iter_documents,
    mix,
    read_text,
    strip_gutenberg,
)
from train.data import PretrainingData
from train.instances import (
    MaskingSpec,
    TokenizedDocument,
    create_instances,
    create_instances_from_document,
    mask_batch,
    truncate_pair,
    truncated_lengths,
)
from train.prepare import PrepareConfig, main, prepare, validate, vocab_source_file


def binomial_ok(hits: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(hits - n * p) <= sigmas * np.sqrt(n * p * (1 - p)) + 1


# --- fixtures -----------------------------------------------------------------------------------

SUBJECTS = [
    "The farmer",
    "A sailor",
    "My neighbour",
    "The old king",
    "Her brother",
    "The doctor",
    "A young student",
    "The captain",
    "An unaffable merchant",
]
VERBS = ["carried", "painted", "found", "repaired", "described", "admired", "forgot", "borrowed"]
OBJECTS = [
    "a wooden boat",
    "the broken clock",
    "an unaffable cat",
    "the silver lantern",
    "a heavy basket",
    "the quiet garden",
    "a strange letter",
    "the tallest tower",
]
TAILS = [
    "before dawn",
    "in the rain",
    "after supper",
    "without complaint",
    "near the harbour",
    "on Tuesday",
    "with great reluctance",
]


def handmade_text(d: int, sentences: int = 40) -> str:
    out = []
    for i in range(sentences):
        k = d * 7 + i
        out.append(f"{SUBJECTS[k % 9]} {VERBS[(k * 3) % 8]} {OBJECTS[(k * 5 + d) % 8]} {TAILS[k % 7]}.")
        if i % 5 == 4:
            out.append("\n\n")
    return " ".join(out)


@pytest.fixture(scope="module")
def vocab_file(shared_data: Path) -> Path:
    return shared_data / "vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="module")
def handmade_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("handmade")
    for d in range(8):
        (root / f"doc-{d:02d}.txt").write_text(handmade_text(d))
    (root / "README.txt").write_text("This folder holds a handmade corpus. It is not a document.\n")
    return root


def handmade_config(handmade_dir: Path, vocab_file: Path, **kw) -> PrepareConfig:
    return PrepareConfig(
        corpora=[CorpusConfig(name="handmade", path=str(handmade_dir))],
        vocab_file=str(vocab_file),
        dupe_factor=5,
        shard_size=100,
        **kw,
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, handmade_dir: Path, vocab_file: Path) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "data"
    prepare(handmade_config(handmade_dir, vocab_file), out)
    return out


@pytest.fixture(scope="module")
def prepared_static(tmp_path_factory, handmade_dir: Path, vocab_file: Path) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "static"
    config = handmade_config(handmade_dir, vocab_file, masking="static", whole_word_mask=True, segmenter="sentencizer")
    prepare(config, out)
    return out


@pytest.fixture(scope="module")
def gutenberg_prepared(tmp_path_factory, shared_data: Path, vocab_file: Path) -> Path:
    src = tmp_path_factory.mktemp("gutenberg")
    for name in ("shakespeare-caesar.txt", "chesterton-ball.txt", "blake-poems.txt", "README"):
        shutil.copy(shared_data / "gutenberg" / name, src / name)
    out = tmp_path_factory.mktemp("prepared") / "gutenberg"
    config = PrepareConfig(
        corpora=[CorpusConfig(name="gutenberg", path=str(src), kind="gutenberg")],
        vocab_file=str(vocab_file),
    )
    prepare(config, out)
    return out


def load_shards(out: Path) -> dict[str, np.ndarray]:
    meta = json.loads((out / "meta.json").read_text())
    names = [p.name for p in (out / meta["shards"][0]["name"]).glob("*.npy")]
    return {n[:-4]: np.concatenate([np.load(out / s["name"] / n) for s in meta["shards"]]) for n in names}


# --- corpora ------------------------------------------------------------------------------------


def test_read_text_decodes_latin1_and_normalises_newlines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes("C\u00e6sar\r\nsays\rhi".encode("latin-1"))
    (tmp_path / "b.txt").write_bytes("\ufeffna\u00efve\r\n".encode("utf-8"))
    assert read_text(tmp_path / "a.txt") == "C\u00e6sar\nsays\nhi"
    assert read_text(tmp_path / "b.txt") == "na\u00efve\n"


def test_real_gutenberg_latin1_crlf_and_readme(shared_data: Path) -> None:
    folder = shared_data / "gutenberg"
    files = corpus_files(folder)
    assert len(files) == 15 and all(p.name != "README" for p in files)
    caesar = read_text(folder / "shakespeare-caesar.txt")
    assert "C\u00e6sar, my Lord" in caesar
    moby = list(iter_documents(CorpusConfig(path=str(folder / "melville-moby_dick.txt"), kind="gutenberg")))
    assert len(moby) == 1 and moby[0][0] == "[Moby Dick by Herman Melville 1851]"
    assert not any("\r" in p for p in moby[0])


def test_strip_gutenberg_modern_and_old_markers() -> None:
    modern = (
        "The Project Gutenberg EBook of X\nlicence blah\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\nProduced by Y\n\nBody line one.\n\n"
        "Body line two.\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nmore licence\n"
    )
    assert strip_gutenberg(modern) == "Produced by Y\n\nBody line one.\n\nBody line two.\n"
    old = (
        "small print text\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n"
        "Chapter 1.\nIt began.\n\nEnd of the Project Gutenberg Etext of X\n"
    )
    assert strip_gutenberg(old) == "\nChapter 1.\nIt began.\n\n"
    assert strip_gutenberg("No markers.\n") == "No markers.\n"


def test_real_gutenberg_footer_is_stripped(shared_data: Path) -> None:
    path = shared_data / "gutenberg" / "chesterton-ball.txt"
    (doc,) = iter_documents(CorpusConfig(path=str(path), kind="gutenberg"))
    text = " ".join(doc)
    assert "Project Gutenberg" not in text and "SMALL PRINT" not in text
    assert doc[0] == "[The Ball and The Cross by G.K. Chesterton 1909]"


def test_wikitext_articles(shared_data: Path) -> None:
    path = shared_data / "wikitext" / "wikitext-2-raw" / "wiki.valid.raw"
    docs = list(iter_documents(CorpusConfig(path=str(path), kind="wikitext")))
    headings = [
        line for line in path.read_text().split("\n") if line.startswith(" = ") and not line.startswith(" = = ")
    ]
    assert len(docs) == len(headings) == 60
    assert docs[0][0].startswith("Homarus gammarus , known as the European lobster")
    paragraphs = [p for d in docs for p in d]
    assert all(p and p == p.strip() for p in paragraphs)
    assert not any(p.startswith("=") or " @-@ " in p or " @,@ " in p for p in paragraphs)


def test_plain_file_holds_blank_line_separated_documents(tmp_path: Path) -> None:
    path = tmp_path / "docs.txt"
    path.write_text("First doc, line one.\nLine two.\n\n \n\nSecond doc.\n")
    docs = list(iter_documents(CorpusConfig(path=str(path))))
    assert docs == [["First doc, line one.", "Line two."], ["Second doc."]]


def test_empty_corpus_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text(" \n\n \n")
    for path in (tmp_path / "empty", tmp_path / "blank.txt", tmp_path / "missing"):
        with pytest.raises(UserError, match=str(path)):
            list(iter_documents(CorpusConfig(path=str(path))))


def test_mix_is_deterministic_and_follows_weights() -> None:
    def streams():
        return [[[f"a{i}"] for i in range(3000)], [[f"b{i}"] for i in range(3000)]]

    first = list(mix(streams(), [3, 1], np.random.default_rng(0), "first_exhausted"))
    assert first == list(mix(streams(), [3, 1], np.random.default_rng(0), "first_exhausted"))
    share_a = sum(d[0][0] == "a" for d in first) / len(first)
    assert len(first) < 4100 and binomial_ok(round(share_a * len(first)), len(first), 0.75)
    everything = list(mix(streams(), [3, 1], np.random.default_rng(1), "all_exhausted"))
    assert sorted(d[0] for d in everything) == sorted(d[0] for s in streams() for d in s)


def test_hub_failure_says_use_a_local_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wikimedia/wikipedia' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match="path="):
        list(iter_documents(train_config.WIKIPEDIA))


def test_hub_corpora_stream_records(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []
    records = {
        "wikimedia/wikipedia": [{"text": "Anarchism is a philosophy.\nHistory\n\nIt is old."}, {"text": "  "}],
        "manu/project_gutenberg": [
            {
                "text": "licence\n*** START OF THE PROJECT GUTENBERG EBOOK"
                " X ***\nCall me\nIshmael.\n\n*** END OF THE "
                "PROJECT GUTENBERG EBOOK X ***\nlicence"
            }
        ],
    }

    def load_dataset(hub_id, config=None, *, split, streaming):
        calls.append((hub_id, config, split, streaming))
        return iter(records[hub_id])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert list(iter_documents(train_config.WIKIPEDIA)) == [["Anarchism is a philosophy.", "History", "It is old."]]
    assert list(iter_documents(train_config.GUTENBERG)) == [["Call me Ishmael."]]
    assert calls == [
        ("wikimedia/wikipedia", "20231101.en", "train", True),
        ("manu/project_gutenberg", None, "en", True),
    ]
    bad_field = dataclasses.replace(train_config.WIKIPEDIA, text_field="body")
    with pytest.raises(UserError, match="text_field"):
        list(iter_documents(bad_field))


def test_long_paragraphs_are_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpora, "MAX_CHUNK_CHARS", 50)
    text = " ".join(f"Sentence number {i} is short." for i in range(40))
    (sentences,) = SentenceSegmenter("sentencizer").segment([[text]])
    assert " ".join(sentences) == text
    assert all(len(s) <= 50 for s in sentences)


def test_parallel_segmentation_equals_serial(handmade_dir: Path) -> None:
    docs = list(iter_documents(CorpusConfig(path=str(handmade_dir))))
    serial = list(SentenceSegmenter("sentencizer").segment(docs))
    assert list(SentenceSegmenter("sentencizer", workers=2).segment(docs)) == serial
    assert len(serial) == 8 and sum(map(len, serial)) == 8 * 40


def test_senter_keeps_quoted_dialogue_together() -> None:
    segmenter = SentenceSegmenter("senter")
    (sentences,) = segmenter.segment([['"Will you read the letter?" cried Harriet. "Pray do."']])
    assert sentences[0] == '"Will you read the letter?" cried Harriet.'


# --- instances ----------------------------------------------------------------------------------


def original_truncate(a: list, b: list, max_num_tokens: int, rng) -> tuple[list, list]:
    """BERT's `truncate_seq_pair`, verbatim but for the generator."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_num_tokens:
        trunc = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()
    return a, b


def test_truncation_matches_the_original() -> None:
    rng = np.random.default_rng(0)
    for la in range(40):
        for lb in range(1, 40):
            for m in (2, 7, 30, 61):
                a, b = original_truncate(list(range(la)), list(range(lb)), m, rng)
                assert truncated_lengths(la, lb, m) == (len(a), len(b))
    fronts = []
    for _ in range(2000):
        a, _ = truncate_pair(np.arange(100), np.arange(10), 50, rng)
        assert len(a) == 40 and np.all(np.diff(a) == 1)
        fronts.append(a[0])
    # Not a float bound: the front is uniform on 0..60 (SD 17.6), so the mean of 2,000 draws has a
    # standard error of 0.39 and 1.0 is 2.5 of them; always-from-the-front or -back is 30 off.
    assert abs(np.mean(fronts) - 30) < 1.0


def original_instances(docs, index, max_seq_length, short_seq_prob, rng, short_seq_per):
    """BERT's `create_instances_from_document` on lists, with the same generator calls."""
    document = docs[index]
    max_num_tokens = max_seq_length - 3

    def draw():
        if rng.random() < short_seq_prob:
            return int(rng.integers(2, max_num_tokens + 1))
        return max_num_tokens

    target = draw()
    instances, chunk, length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random = True
                target_b = target - len(a)
                for _ in range(10):
                    r = int(rng.integers(0, len(docs)))
                    if r != index:
                        break
                b = []
                for j in range(int(rng.integers(0, len(docs[r]))), len(docs[r])):
                    b.extend(docs[r][j])
                    if len(b) >= target_b:
                        break
                i -= len(chunk) - a_end
            else:
                is_random = False
                b = [t for s in chunk[a_end:] for t in s]
            ta, tb = truncate_pair(np.array(a), np.array(b), max_num_tokens, rng)
            instances.append((ta.tolist(), tb.tolist(), is_random))
            if short_seq_per == "instance":
                target = draw()
            chunk, length = [], 0
        i += 1
    return instances


@pytest.mark.parametrize("short_seq_per", ["instance", "document"])
def test_instances_equal_the_original_algorithm(short_seq_per: str) -> None:
    gen = np.random.default_rng(7)
    docs = [
        [list(gen.integers(5, 900, size=gen.integers(1, 40))) for _ in range(gen.integers(1, 30))] for _ in range(12)
    ]
    tokenized = [TokenizedDocument.from_sentences(d) for d in docs]
    for seed in range(5):
        for index in range(len(docs)):
            fast = create_instances_from_document(tokenized, index, 64, 0.3, np.random.default_rng(seed), short_seq_per)
            slow = original_instances(docs, index, 64, 0.3, np.random.default_rng(seed), short_seq_per)
            assert [(a.tolist(), b.tolist(), r) for a, b, r in fast] == slow


def numbered_documents(n_docs: int, n_sentences: int, width: int) -> list[TokenizedDocument]:
    """Sentence s of document d is `width` copies of the id 1000·d + s + 10."""
    return [
        TokenizedDocument.from_sentences([[1000 * d + s + 10] * width for s in range(n_sentences)])
        for d in range(n_docs)
    ]


def test_pairs_are_continuations_or_random_and_use_every_sentence_once() -> None:
    # 3-token sentences and a target of 63 (T = 66): no pair is ever truncated.
    docs = numbered_documents(6, 200, 3)
    inst = create_instances(docs, 66, 0.0, np.random.default_rng(3), cls_id=1, sep_id=2, pad_id=0)
    used = {d: [] for d in range(6)}
    for row, length, label in zip(inst.input_ids, inst.lengths, inst.nsp_labels, strict=True):
        seps = np.flatnonzero(row == 2)
        a, b = row[1 : seps[0]][::3], row[seps[0] + 1 : seps[1]][::3]
        assert seps[1] == length - 1 and np.all(row[length:] == 0)
        assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)
        used[a[0] // 1000].extend(a % 1000)
        if label:
            assert b[0] // 1000 != a[0] // 1000
        else:
            assert b[0] == a[-1] + 1
            used[a[0] // 1000].extend(b % 1000)
    for d in range(6):
        assert sorted(used[d]) == list(range(10, 210))


def test_nsp_balance_lengths_and_short_share() -> None:
    t = 128
    docs = numbered_documents(20, 60_000, 1)
    inst = create_instances(docs, t, 0.1, np.random.default_rng(0), cls_id=1, sep_id=2, pad_id=0)
    n = len(inst)
    assert n > 10_000
    assert binomial_ok(int(inst.nsp_labels.sum()), n, 0.5)
    assert inst.lengths.max() <= t
    assert np.all(inst.input_ids[np.arange(n), inst.lengths - 1] == 2)
    assert np.all(inst.token_type_ids[:, 0] == 0)
    first_sep = np.argmax(inst.input_ids == 2, axis=1)
    assert np.all(inst.token_type_ids.sum(1) == inst.lengths - first_sep - 1)
    # A short target (uniform in [2, 125]) is 125 itself with probability 1/124.
    short = int((inst.lengths < t).sum())
    assert binomial_ok(short, n, 0.1 * (1 - 1 / 124))


# --- masking ------------------------------------------------------------------------------------

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOY_VOCAB = SPECIALS + [f"w{i}" for i in range(500)] + [f"##p{i}" for i in range(100)]
PIECES = np.arange(505, 605)


def toy_batch(b: int, t: int, rng, subword_share: float = 0.0, full: bool = False):
    """Rows `[CLS] A [SEP] B [SEP]` of random words (and `##` pieces), padded."""
    ids = rng.integers(5, 505, size=(b, t))
    pieces = rng.random((b, t)) < subword_share
    ids[pieces] = rng.choice(PIECES, size=int(pieces.sum()))
    lengths = np.full(b, t) if full else rng.integers(6, t + 1, size=b)
    sep_a = rng.integers(2, lengths - 2)
    ids[:, 0] = 2
    ids[np.arange(b), sep_a] = 3
    ids[np.arange(b), lengths - 1] = 3
    ids[np.arange(t) >= lengths[:, None]] = 0
    return ids.astype(np.int32), lengths


def check_masking_invariants(ids, lengths, spec, out) -> np.ndarray:
    """Invariants every masking obeys; returns the number of predictions per row."""
    b, t = ids.shape
    w = out["masked_weights"] > 0
    count = w.sum(1)
    maskable = (np.arange(t) < lengths[:, None]) & ~np.isin(ids, spec.special_ids)
    n = maskable.sum(1)
    budget = np.minimum(spec.max_predictions, np.maximum(1, np.rint(n * spec.masked_lm_prob)))
    assert np.all(count <= budget)
    assert np.all(w[:, :-1] >= w[:, 1:])  # real predictions first
    pos = out["masked_positions"]
    assert np.all(np.where(w[:, 1:], np.diff(pos, axis=1) > 0, True))
    assert np.all(pos[~w] == 0) and np.all(out["masked_ids"][~w] == 0)
    rows = np.broadcast_to(np.arange(b)[:, None], pos.shape)
    assert np.all(maskable[rows[w], pos[w]])  # never [CLS], [SEP] or padding
    assert np.all(out["masked_ids"][w] == ids[rows[w], pos[w]])
    changed = out["input_ids"] != ids
    selected = np.zeros_like(changed)
    selected[rows[w], pos[w]] = True
    assert not np.any(changed & ~selected)
    return count


def test_masking_proportions_and_80_10_10() -> None:
    rng = np.random.default_rng(0)
    spec = MaskingSpec.from_vocab(TOY_VOCAB)
    ids, lengths = toy_batch(8000, 128, rng)
    out = mask_batch(ids, lengths, spec, np.random.default_rng(1))
    count = check_masking_invariants(ids, lengths, spec, out)
    n = ((np.arange(128) < lengths[:, None]) & ~np.isin(ids, spec.special_ids)).sum(1)
    assert np.array_equal(count, np.minimum(20, np.maximum(1, np.rint(0.15 * n))))
    uncapped = np.rint(0.15 * n) < 20
    # Not a float bound: rint(0.15·n) moves each sequence's share by ≤ 0.5/n; over these lengths the
    # pooled share stays within 0.005 of 15%, and a 10% or 20% rate is 10× further.
    assert abs(count[uncapped].sum() / n[uncapped].sum() - 0.15) < 0.005
    w = out["masked_weights"] > 0
    new = np.take_along_axis(out["input_ids"], out["masked_positions"], 1)[w]
    labels = out["masked_ids"][w]
    total = int(w.sum())
    as_mask = int((new == spec.mask_id).sum())
    kept = int((new == labels).sum())
    v = len(TOY_VOCAB)  # a random id is [MASK] or the original one with probability 1/v each
    assert binomial_ok(as_mask, total, 0.8 + 0.1 / v)
    assert binomial_ok(kept, total, 0.1 + 0.1 / v)
    assert binomial_ok(total - as_mask - kept, total, 0.1 - 0.2 / v)


def test_masking_is_capped_at_max_predictions() -> None:
    spec = MaskingSpec.from_vocab(TOY_VOCAB, max_predictions=20)
    ids, lengths = toy_batch(200, 512, np.random.default_rng(0), full=True)
    out = mask_batch(ids, lengths, spec, np.random.default_rng(0))
    assert out["masked_positions"].shape == (200, 20)
    assert np.all(check_masking_invariants(ids, lengths, spec, out) == 20)


def word_spans(row: np.ndarray, length: int, spec: MaskingSpec) -> list[list[int]]:
    """Slow twin of the word grouping: a `##` piece joins the word just before it."""
    words: list[list[int]] = []
    previous_maskable = False
    for i in range(length):
        maskable = row[i] not in spec.special_ids
        if maskable and previous_maskable and spec.subword[row[i]]:
            words[-1].append(i)
        elif maskable:
            words.append([i])
        previous_maskable = maskable
    return words


def test_whole_word_masking_masks_whole_words_greedily() -> None:
    spec = MaskingSpec.from_vocab(TOY_VOCAB, whole_word=True)
    ids, lengths = toy_batch(1000, 128, np.random.default_rng(0), subword_share=0.4)
    out = mask_batch(ids, lengths, spec, np.random.default_rng(1))
    count = check_masking_invariants(ids, lengths, spec, out)
    full = 0
    for r in range(len(ids)):
        chosen = set(out["masked_positions"][r][out["masked_weights"][r] > 0].tolist())
        words = word_spans(ids[r], lengths[r], spec)
        n = sum(map(len, words))
        budget = min(20, max(1, round(0.15 * n)))
        for word in words:
            taken = [i in chosen for i in word]
            assert all(taken) or not any(taken)
            # The original's greedy pass skips only words that no longer fit.
            if not any(taken):
                assert len(word) > budget - count[r]
        full += count[r] == budget
    assert full > 0.8 * len(ids)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 6),
    t=st.integers(6, 40),
    seed=st.integers(0, 10_000),
    whole_word=st.booleans(),
    prob=st.floats(0.05, 0.9),
    p=st.integers(1, 12),
)
def test_masking_invariants_hold_for_any_batch(b, t, seed, whole_word, prob, p) -> None:
    spec = MaskingSpec.from_vocab(TOY_VOCAB, prob, p, whole_word)
    ids, lengths = toy_batch(b, t, np.random.default_rng(seed), subword_share=0.3)
    out = mask_batch(ids, lengths, spec, np.random.default_rng(seed + 1))
    count = check_masking_invariants(ids, lengths, spec, out)
    if not whole_word:  # whole words can all be longer than a budget of one
        assert np.all(count >= 1)


# --- preparation --------------------------------------------------------------------------------


def test_prepare_writes_shards_and_meta(prepared: Path, vocab_file: Path) -> None:
    meta = json.loads((prepared / "meta.json").read_text())
    assert meta["counts"]["documents"] == 8  # README.txt skipped
    assert (prepared / "vocab.txt").read_bytes() == vocab_file.read_bytes()
    assert meta["special_ids"] == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    assert meta["throughput"]["tokens_per_s"] > 0 and meta["corpora"][0]["files"][0]["sha256"]
    assert len(meta["shards"]) > 1
    assert sum(s["count"] for s in meta["shards"]) == meta["counts"]["instances"]
    arrays = load_shards(prepared)
    assert set(arrays) == {"input_ids", "token_type_ids", "lengths", "nsp_labels"}
    assert arrays["input_ids"].dtype == np.uint16 and arrays["input_ids"].shape[1] == 128
    assert arrays["token_type_ids"].dtype == np.int8 and arrays["lengths"].dtype == np.int16
    assert np.all(arrays["input_ids"][:, 0] == 101) and arrays["lengths"].max() <= 128
    n = len(arrays["lengths"])
    assert binomial_ok(int(arrays["nsp_labels"].sum()), n, 0.5, sigmas=4.5)
    assert not list(prepared.parent.glob(".*tmp*"))


def test_prepared_gutenberg(gutenberg_prepared: Path) -> None:
    meta = json.loads((gutenberg_prepared / "meta.json").read_text())
    assert meta["counts"]["documents"] == 3
    assert meta["segmenter"]["name"].endswith(":senter")
    arrays = load_shards(gutenberg_prepared)
    n = len(arrays["lengths"])
    assert n > 1000 and arrays["lengths"].max() <= 128
    # Single-sentence chunks always take a random B (as in the original), hence a little over 1/2.
    assert 0.47 < arrays["nsp_labels"].mean() < 0.58
    vocab = (gutenberg_prepared / "vocab.txt").read_text().splitlines()
    tokens = {vocab[i] for i in np.unique(arrays["input_ids"])}
    assert {"caesar", "turnbull", "lamb"} <= tokens  # one from each book
    files = sorted(Path(f["path"]).name for f in meta["corpora"][0]["files"])
    assert files == ["blake-poems.txt", "chesterton-ball.txt", "shakespeare-caesar.txt"]
    assert "gutenberg" not in tokens


def test_special_token_strings_in_the_text_stay_text(tmp_path: Path, vocab_file: Path) -> None:
    """A book that writes "[SEP]" or "[PAD]" must not put a separator or padding inside a segment."""
    (tmp_path / "docs").mkdir()
    for d in range(2):
        sentences = [f"Sentence {k} of file {d} writes [SEP] and [PAD] and [MASK] and [CLS] as text." for k in range(6)]
        (tmp_path / "docs" / f"{d}.txt").write_text(" ".join(sentences) + "\n")
    config = PrepareConfig(corpora=[CorpusConfig(path=str(tmp_path / "docs"))], vocab_file=str(vocab_file),
                           segmenter="sentencizer")  # fmt: skip
    prepare(config, tmp_path / "out")
    arrays = load_shards(tmp_path / "out")
    assert len(arrays["lengths"]) > 0
    for ids, length in zip(arrays["input_ids"], arrays["lengths"], strict=True):
        real = ids[:length].astype(int)  # dynamic masking: the shards hold the unmasked tokens
        assert real[0] == 101 and (real == 101).sum() == 1 and (real == 102).sum() == 2 and real[-1] == 102
        assert not np.isin(real, [0, 100, 103]).any()


def test_unequal_weights_that_cannot_set_proportions_are_warned_about(tmp_path: Path, vocab_file: Path, caplog) -> None:
    two = [
        CorpusConfig(name="a", path=str(tmp_path), weight=1.0),
        CorpusConfig(name="b", path=str(tmp_path), weight=0.2),
    ]
    for overrides, warned in [({}, True), ({"max_documents": 10}, False), ({"mix_stop": "first_exhausted"}, False),
                             ({"corpora": [dataclasses.replace(c, weight=1.0) for c in two]}, False)]:  # fmt: skip
        caplog.clear()
        validate(PrepareConfig(**{"corpora": two, "vocab_file": str(vocab_file), **overrides}))
        assert ("only order the mixed stream" in caplog.text) == warned, overrides
        assert ("a=1, b=0.2" in caplog.text) == warned


def test_vocab_file_is_a_path_or_a_hub_model(tmp_path: Path, vocab_file: Path, monkeypatch) -> None:
    import huggingface_hub

    fetched = []
    monkeypatch.setattr(
        huggingface_hub, "hf_hub_download", lambda repo, name: fetched.append((repo, name)) or str(vocab_file)
    )
    assert vocab_source_file(str(vocab_file)) == vocab_file and not fetched
    assert vocab_source_file("google-bert/bert-base-uncased") == vocab_file
    assert fetched == [("google-bert/bert-base-uncased", "vocab.txt")]
    corpus = [CorpusConfig(path=str(tmp_path))]
    validate(PrepareConfig(corpora=corpus, vocab_file="google-bert/bert-base-uncased"))
    with pytest.raises(UserError, match="vocab_file does not exist"):
        validate(PrepareConfig(corpora=corpus, vocab_file=str(tmp_path / "nowhere" / "vocab.txt")))

    def offline(repo, name):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(UserError, match="google-bert/bert-base-uncased: not a local path, and the hub download failed"):
        vocab_source_file("google-bert/bert-base-uncased")


def test_no_pool_holds_a_single_document(tmp_path: Path, vocab_file: Path) -> None:
    """Pools of ~2 documents, and a third left alone at the end: it joins the pool before it, so
    no random-next B comes from its A's own document (each document has a word of its own)."""
    words = ["alpha", "bravo", "charlie"]
    (tmp_path / "docs").mkdir()
    for d, word in enumerate(words):
        (tmp_path / "docs" / f"{d}.txt").write_text(" ".join(f"{word} {i} went home." for i in range(40)))
    config = PrepareConfig(corpora=[CorpusConfig(path=str(tmp_path / "docs"))], vocab_file=str(vocab_file),
                           segmenter="sentencizer", pool_tokens=300, max_seq_length=32)  # fmt: skip
    prepare(config, tmp_path / "out")
    arrays = load_shards(tmp_path / "out")
    vocab = (tmp_path / "out" / "vocab.txt").read_text().splitlines()
    source = {vocab.index(w): w for w in words}
    random_next = 0
    for ids, types, label in zip(arrays["input_ids"], arrays["token_type_ids"], arrays["nsp_labels"], strict=True):
        a, b = ({source[i] for i in ids[types == k] if i in source} for k in (0, 1))
        if label:
            random_next += 1
            assert a.isdisjoint(b), (a, b)
    assert random_next > 10


def test_pools_keep_every_document_in_order_and_none_alone() -> None:
    """`_pools` at every pool size: the documents in their order, each pool of two or more, every
    pool but the last of at least `pool_tokens` tokens."""
    from train.prepare import _pools

    docs = [TokenizedDocument.from_sentences([list(range(n))]) for n in (5, 1, 7, 3, 2, 9, 4)]
    for pool_tokens in (1, 6, 10, 12, 31, 100):
        pools = list(_pools(iter(docs), pool_tokens))
        assert [id(d) for pool in pools for d in pool] == [id(d) for d in docs], pool_tokens
        assert all(len(pool) >= 2 for pool in pools), (pool_tokens, [len(p) for p in pools])
        assert all(sum(len(d.ids) for d in pool) >= pool_tokens for pool in pools[:-1]), pool_tokens
    assert len(list(_pools(iter(docs), 6))) > 2  # small pools: the cases above are not all one pool


def test_a_phase_2_that_would_share_phase_1_shards_is_refused_before_training(tmp_path: Path) -> None:
    """At phase 1's max_seq_length phase 2 prepares into phase 1's directory: with another
    prediction cap its shards were refused only once phase 1 had trained."""
    from train import pretrain

    config = pretrain.PretrainConfig(phase2=pretrain.Phase2Config(max_seq_length=128))
    with pytest.raises(UserError, match=r"phase2.max_predictions_per_seq: 80 is not data.max_predictions_per_seq 20, "
                                        r"but both phases prepare into .*data-T128"):  # fmt: skip
        pretrain.run(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_prepare_empty_corpus_leaves_nothing(tmp_path: Path, vocab_file: Path) -> None:
    (tmp_path / "empty").mkdir()
    config = PrepareConfig(corpora=[CorpusConfig(path=str(tmp_path / "empty"))], vocab_file=str(vocab_file))
    with pytest.raises(UserError, match="empty"):
        prepare(config, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_train_vocab(tmp_path: Path, handmade_dir: Path) -> None:
    config = PrepareConfig(
        corpora=[CorpusConfig(path=str(handmade_dir))], train_vocab=True, vocab_size=150, segmenter="sentencizer"
    )
    meta = prepare(config, tmp_path / "out")
    vocab = (tmp_path / "out" / "vocab.txt").read_text().splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # Ids in a fixed order, not the trainer's hash-map order (another in every process): word
    # starts, then continuations, shortest first, then by code point.
    rest = [(token.startswith("##"), len(token.removeprefix("##")), token.removeprefix("##")) for token in vocab[5:]]
    assert rest == sorted(rest) and rest[0][:2] == (False, 1) and rest[-1][0]
    assert meta["vocab_size"] == len(vocab) <= 150 and meta["vocab_source"]["trained"]
    assert meta["counts"]["instances"] > 0


def test_cli(tmp_path: Path, handmade_dir: Path, vocab_file: Path, capsys) -> None:
    yaml = tmp_path / "prepare.yaml"
    yaml.write_text(
        f"corpora:\n  - name: hand\n    path: {handmade_dir}\nvocab_file: {vocab_file}\nsegmenter: sentencizer\n"
    )

    def run(*argv: str) -> int:
        with pytest.raises(SystemExit) as exit_info:
            cli.run(main, ["--config", str(yaml), *argv])
            raise SystemExit(0)
        return exit_info.value.code

    assert run("--out", str(tmp_path / "a"), "max_seq_length=64") == 0
    assert json.loads((tmp_path / "a" / "meta.json").read_text())["max_seq_length"] == 64
    assert "tokens/s" in capsys.readouterr().err  # throughput is logged
    assert run("--out", str(tmp_path / "b"), "corpora.0.bogus=1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and "bogus" in err[-1]
    assert run("--out", str(tmp_path / "a")) == 2
    assert "not empty" in capsys.readouterr().err
    assert run("--out", str(tmp_path / "c"), "masking=sometimes") == 2
    assert "masking" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


# --- the training iterator ----------------------------------------------------------------------


def take(data: PretrainingData, k: int) -> list[dict[str, np.ndarray]]:
    return [next(data) for _ in range(k)]


def same(xs: list[dict], ys: list[dict]) -> bool:
    return len(xs) == len(ys) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(xs, ys, strict=False)
    )


def test_iterator_batches(prepared: Path) -> None:
    data = PretrainingData(prepared, 16, seed=0)
    batch = next(data)
    assert batch["input_ids"].shape == (16, 128) and batch["masked_positions"].shape == (16, 20)
    assert {k: v.dtype for k, v in batch.items()} == {
        "input_ids": np.int32,
        "token_type_ids": np.int32,
        "attention_mask": np.int32,
        "masked_positions": np.int32,
        "masked_ids": np.int32,
        "masked_weights": np.float32,
        "nsp_labels": np.int32,
    }
    assert np.all(batch["masked_ids"][batch["masked_weights"] > 0] > 103)
    assert np.all(
        batch["attention_mask"].sum(1) == batch["token_type_ids"].sum(1) + np.argmax(batch["token_type_ids"], 1)
    )


def test_iterator_is_deterministic(prepared: Path) -> None:
    assert same(take(PretrainingData(prepared, 8, seed=3), 4), take(PretrainingData(prepared, 8, seed=3), 4))
    assert not same(take(PretrainingData(prepared, 8, seed=3), 4), take(PretrainingData(prepared, 8, seed=4), 4))
    one_epoch = PretrainingData(prepared, 8, seed=3, epochs=1)
    assert len(list(one_epoch)) == one_epoch.batches_per_epoch == one_epoch.num_examples // 8


def test_iterator_resumes_exactly(prepared: Path) -> None:
    data = PretrainingData(prepared, 8, seed=5)
    k = data.batches_per_epoch - 2
    take(data, k)
    position = json.loads(json.dumps(data.position))
    assert position == {"epoch": 0, "index": k}
    following = take(data, 5)  # crosses into epoch 1
    assert data.position["epoch"] == 1
    assert same(take(PretrainingData(prepared, 8, seed=5, position=position), 5), following)
    with pytest.raises(UserError, match="position"):
        PretrainingData(prepared, 8, seed=5, position={"epoch": 0})


def test_iterator_masks_afresh_each_epoch(prepared: Path, prepared_static: Path) -> None:
    for out, static in ((prepared, False), (prepared_static, True)):
        data = PretrainingData(out, 8, seed=1)
        assert data.static == static
        example = data.examples(0, 0)[0]
        index = next(i for i in range(data.batches_per_epoch) if example in data.examples(1, i))
        row = int(np.flatnonzero(data.examples(1, index) == example)[0])
        first, second = data.batch(0, 0), data.batch(1, index)
        same_mask = np.array_equal(first["masked_positions"][0], second["masked_positions"][row])
        assert same_mask == static


def test_static_masking_shards(prepared_static: Path) -> None:
    arrays = load_shards(prepared_static)
    positions = arrays["masked_positions"]
    assert positions.shape[1] == 20 and positions.dtype == np.int16
    batch = next(PretrainingData(prepared_static, 32))
    w = batch["masked_weights"] > 0
    assert np.all(w.sum(1) >= 1)
    assert np.all(batch["masked_positions"][~w] == 0)
    # Whole words: put the labels back, then every masked piece's neighbours within the word are
    # masked too ("unaffable" is una ##ffa ##ble).
    vocab = (prepared_static / "vocab.txt").read_text().splitlines()
    subword = np.array([t.startswith("##") for t in vocab])
    rows = np.broadcast_to(np.arange(32)[:, None], w.shape)
    original = batch["input_ids"].copy()
    original[rows[w], batch["masked_positions"][w]] = batch["masked_ids"][w]
    masked = np.zeros_like(original, dtype=bool)
    masked[rows[w], batch["masked_positions"][w]] = True
    joins = subword[original[:, 1:]] & (original[:, :-1] != 102)  # piece i+1 continues piece i
    assert np.any(joins & masked[:, 1:])
    assert np.array_equal((masked[:, :-1] != masked[:, 1:]) & joins, np.zeros_like(joins))


def test_iterator_hosts_read_disjoint_slices(prepared: Path) -> None:
    whole = PretrainingData(prepared, 8, seed=2)
    hosts = [PretrainingData(prepared, 8, seed=2, process_index=i, process_count=2) for i in range(2)]
    for index in range(3):
        parts = [h.examples(0, index) for h in hosts]
        assert len(parts[0]) == len(parts[1]) == 4 and not set(parts[0]) & set(parts[1])
        assert np.array_equal(np.concatenate(parts), whole.examples(0, index))
    with pytest.raises(UserError, match="global_batch_size"):
        PretrainingData(prepared, 7, process_count=2)


@pytest.mark.parametrize("pair_task", ["sop", "none"])
def test_sop_and_mlm_only_pairs_are_continuations(pair_task: str) -> None:
    """SOP: B follows A or, swapped, precedes it (label 1), about half each; MLM only: B always
    follows A. A one-sentence chunk takes a random B (label 1) under every task, as the original."""
    docs = numbered_documents(6, 200, 3)
    inst = create_instances(docs, 66, 0.0, np.random.default_rng(3), cls_id=1, sep_id=2, pad_id=0, pair_task=pair_task)
    swapped = 0
    for row, label in zip(inst.input_ids, inst.nsp_labels, strict=True):
        seps = np.flatnonzero(row == 2)
        a, b = row[1 : seps[0]][::3], row[seps[0] + 1 : seps[1]][::3]
        if a[0] // 1000 != b[0] // 1000:  # a random B: only a chunk of one sentence takes one
            assert label == 1 and len(a) == 1
        elif b[0] == a[-1] + 1:
            assert label == 0
        else:
            assert pair_task == "sop" and label == 1 and a[0] == b[-1] + 1
            swapped += 1
    if pair_task == "sop":
        assert 0.4 < swapped / len(inst) < 0.6
    else:
        assert swapped == 0


def test_wikiextractor_articles(tmp_path: Path) -> None:
    (tmp_path / "AA").mkdir()
    (tmp_path / "AA" / "wiki_00").write_text(
        '<doc id="1" url="http://x?curid=1" title="Ada">\nAda\n\nAda was a mathematician.\nShe wrote notes.\n</doc>\n'
        '<doc id="2" url="http://x?curid=2" title="Empty">\nEmpty\n\n</doc>\n'
        '<doc id="3" url="http://x?curid=3" title="B &amp; C">\nB & C\n\nHistory.\nIt   began.  \n</doc>\n'
    )
    docs = list(corpora.iter_documents(CorpusConfig(path=str(tmp_path), kind="wikiextractor")))
    assert docs == [["Ada was a mathematician.", "She wrote notes."], ["History.", "It began."]]


def test_real_wikiextractor_extract(shared_data: Path) -> None:
    """The staged extract: every `<doc>` becomes an article, no markup reaches the text."""
    folder = shared_data / "wikipedia" / "AC"
    config = CorpusConfig(path=str(folder), kind="wikiextractor")
    docs = list(corpora.iter_documents(config))
    opened = sum((f.read_text().count("<doc ")) for f in corpora.corpus_files(folder))
    # Articles with no text after their title (about 1 in 200 here) are dropped.
    assert 0.99 * opened <= len(docs) <= opened
    assert not any("<doc" in p or "</doc>" in p for d in docs for p in d)
    assert docs[0][0].startswith('Margaret "Maggie" Keenan-Bolger (born December 2, 1983')


LICENCE_PHRASES = ("project gutenberg license", "use of anyone anywhere", "start of this project gutenberg",
                   "end of this project gutenberg", "gutenberg-tm")  # fmt: skip


def test_no_licence_text_reaches_an_instance_from_the_125_books(shared_data: Path, tmp_path: Path) -> None:
    """Every one of the 125 CRLF books loses its header and licence (the same ~3,000 words in each:
    a model would memorise them); checked on the documents, and on the instances of a few books."""
    books = shared_data / "gutenberg-125"
    config = CorpusConfig(path=str(books), kind="gutenberg")
    words = 0
    for doc in corpora.iter_documents(config):
        text = " ".join(doc).lower()
        words += len(text.split())
        assert not any(phrase in text for phrase in LICENCE_PHRASES)
    assert 9_700_000 < words < 9_900_000  # the README's 9,854,725 body words between the markers
    few = tmp_path / "few"
    few.mkdir()
    for name in sorted(p.name for p in books.iterdir())[:3]:
        shutil.copy(books / name, few / name)
    out = tmp_path / "prepared"
    prepare(PrepareConfig(corpora=[CorpusConfig(path=str(few), kind="gutenberg")], train_vocab=True, vocab_size=2000,
                          segmenter="sentencizer"), out)  # fmt: skip
    vocab = (out / "vocab.txt").read_text().splitlines()
    arrays = load_shards(out)
    pieces = [vocab[i] for i in np.unique(arrays["input_ids"])]
    assert "gutenberg" not in pieces and "ebook" not in pieces
