"""Dependency parses: gold CoNLL-U trees (real UD English-EWT and hand-made edge cases) and spaCy."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertjax.errors import UserError
from sieves.parse import SpacyParser, Word, read_conllu


def _assert_well_formed(text: str, words: tuple[Word, ...]) -> None:
    for index, word in enumerate(words):
        assert 0 <= word.start < word.end <= len(text)
        assert text[word.start : word.end].strip() == text[word.start : word.end]
        assert 0 <= word.head < len(words)
        assert word.dep == word.dep.lower() and word.dep != "obj"
        assert (word.dep == "root") == (word.head == index)


def test_ewt_dev_spans_and_arcs(ud_english_ewt: Path) -> None:
    sentences = read_conllu(ud_english_ewt / "en_ewt-ud-dev.conllu")
    assert len(sentences) == 2001
    for text, words in sentences:
        _assert_well_formed(text, words)

    text, words = sentences[0]
    assert text == "From the AP comes this story :"
    assert [text[w.start : w.end] for w in words] == ["From", "the", "AP", "comes", "this", "story", ":"]
    assert [w.head for w in words] == [2, 2, 3, 3, 5, 3, 3]
    assert words[5].dep == "nsubj"

    text, words = sentences[1]
    individuals = words[6]
    assert text[individuals.start : individuals.end] == "individuals"
    assert (individuals.dep, individuals.head) == ("dobj", 4)


def test_ewt_dev_limit_and_subtypes(ud_english_ewt: Path) -> None:
    sentences = read_conllu(ud_english_ewt / "en_ewt-ud-dev.conllu", limit=200)
    assert len(sentences) == 200
    labels = {word.dep for _, words in sentences for word in words}
    assert "nsubj:pass" in labels and "dobj" in labels and "obj" not in labels


def test_ewt_dev_multiword_tokens_split_their_span(ud_english_ewt: Path) -> None:
    path = ud_english_ewt / "en_ewt-ud-dev.conllu"
    sentences = read_conllu(path)
    # Every multiword token of the file, checked against its words in the parse.
    by_text = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = block.splitlines()
        fields = [line.split("\t") for line in lines if not line.startswith("#")]
        ranges = [row for row in fields if "-" in row[0]]
        if ranges:
            text = next(line[len("# text = ") :] for line in lines if line.startswith("# text = "))
            by_text[text] = (ranges, {row[0]: row[1] for row in fields})
    checked = 0
    for text, words in sentences:
        if text not in by_text:
            continue
        ranges, forms = by_text.pop(text)
        for row in ranges:
            first, last = (int(part) for part in row[0].split("-"))
            parts = [text[words[i - 1].start : words[i - 1].end] for i in range(first, last + 1)]
            assert "".join(parts) == row[1]  # contiguous, in order, covering the token
            assert [p.casefold() for p in parts] == [forms[str(i)].casefold() for i in range(first, last + 1)]
            checked += 1
    assert checked > 100


CONLLU = """\
# sent_id = a
# text = I don't know,really.
1\tI\tI\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\t_\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\t_\t_\t4\tadvmod\t_\t_
4\tknow\tknow\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
4.1\tsay\tsay\tVERB\t_\t_\t_\t_\t4:conj\t_
5\t,\t,\tPUNCT\t_\t_\t6\tpunct\t_\tSpaceAfter=No
6\treally\treally\tADV\t_\t_\t4\tadvmod\t_\tSpaceAfter=No
7\t.\t.\tPUNCT\t_\t_\t4\tpunct\t_\t_

# text = Eat  it
1\tEat\teat\tVERB\t_\t_\t0\troot\t_\t_
2\tit\tit\tPRON\t_\t_\t1\tobj\t_\t_
"""


def test_multiword_tokens_empty_nodes_and_space_after(tmp_path: Path) -> None:
    path = tmp_path / "tiny.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    (text, words), (text2, words2) = read_conllu(path)
    assert text == "I don't know,really."
    assert words == (
        Word(0, 1, "nsubj", 3, "PRON"),
        Word(2, 4, "aux", 3, "AUX"),
        Word(4, 7, "advmod", 3, "PART"),
        Word(8, 12, "root", 3, "VERB"),
        Word(12, 13, "punct", 5, "PUNCT"),
        Word(13, 19, "advmod", 3, "ADV"),
        Word(19, 20, "punct", 3, "PUNCT"),
    )
    assert text2 == "Eat  it"
    assert words2 == (Word(0, 3, "root", 0, "VERB"), Word(5, 7, "dobj", 0, "PRON"))
    assert len(read_conllu(path, limit=1)) == 1


def test_a_multiword_token_its_words_do_not_spell_shares_its_span(tmp_path: Path) -> None:
    path = tmp_path / "fr.conllu"
    path.write_text(
        "# text = du pain\n1-2\tdu\t_\t_\t_\t_\t_\t_\t_\t_\n1\tde\tde\tADP\t_\t_\t3\tcase\t_\t_\n"
        "2\tle\tle\tDET\t_\t_\t3\tdet\t_\t_\n3\tpain\tpain\tNOUN\t_\t_\t0\troot\t_\t_\n",
        encoding="utf-8",
    )
    ((_, words),) = read_conllu(path)
    assert [(w.start, w.end) for w in words] == [(0, 2), (0, 2), (3, 7)]


def test_a_file_without_sentences_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.conllu"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"empty\.conllu: no sentences"):
        read_conllu(path)


def test_form_missing_from_text_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.conllu"
    path.write_text(CONLLU.replace("6\treally\treally", "6\tsurely\treally"), encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.conllu:10: form 'surely' not found"):
        read_conllu(path)


def test_space_after_no_is_respected(tmp_path: Path) -> None:
    # With SpaceAfter=No on "know", a space before "," in the text is a mismatch, not skipped.
    path = tmp_path / "gap.conllu"
    path.write_text(CONLLU.replace("know,really", "know ,really"), encoding="utf-8")
    with pytest.raises(UserError, match=r"gap\.conllu:9: form ','"):
        read_conllu(path)


def test_missing_text_comment(tmp_path: Path) -> None:
    path = tmp_path / "notext.conllu"
    path.write_text("\n" + CONLLU.split("\n\n")[1].replace("# text = Eat  it\n", ""), encoding="utf-8")
    with pytest.raises(UserError, match=r"notext\.conllu:2: .*# text"):
        read_conllu(path)


@pytest.fixture(scope="module")
def spacy_parser() -> SpacyParser:
    return SpacyParser()


def test_spacy_words(spacy_parser: SpacyParser) -> None:
    texts = ["Hello   world.\n\nThe cat ate the red apple quickly. ", "  ", 'She said "no".']
    parses = spacy_parser.parse(texts)
    assert len(parses) == 3
    assert parses[1] == ()
    for text, words in zip(texts, parses, strict=True):
        _assert_well_formed(text, words)
    text, words = texts[0], parses[0]
    assert [text[w.start : w.end] for w in words] == [
        "Hello", "world", ".", "The", "cat", "ate", "the", "red", "apple", "quickly", ".",
    ]  # fmt: skip
    by_form = {text[w.start : w.end]: w for w in words}
    assert (by_form["cat"].dep, words[by_form["cat"].head]) == ("nsubj", by_form["ate"])
    assert (by_form["apple"].dep, words[by_form["apple"].head]) == ("dobj", by_form["ate"])
    assert (by_form["red"].dep, words[by_form["red"].head]) == ("amod", by_form["apple"])
    assert [by_form[f].pos for f in ("cat", "ate", "red", "quickly", "The")] == ["NOUN", "VERB", "ADJ", "ADV", "DET"]
    assert words[0].pos == "INTJ" and {w.pos for w in parses[2] if texts[2][w.start : w.end] == "She"} == {"PRON"}
    assert spacy_parser.name.startswith("en_core_web_sm") and spacy_parser.version


def test_spacy_cache_skips_spacy_on_second_run(tmp_path: Path) -> None:
    texts = ["The dog barked.", "A cat slept.", "The dog barked."]
    first = SpacyParser(cache_dir=tmp_path)
    calls = []
    pipe = first.nlp.pipe
    first.nlp.pipe = lambda batch, **kwargs: calls.append(list(batch)) or pipe(calls[-1], **kwargs)
    expected = first.parse(texts)
    assert calls == [["The dog barked.", "A cat slept."]]

    second = SpacyParser(cache_dir=tmp_path)

    def no_spacy(*args, **kwargs):
        raise AssertionError("spaCy called for cached texts")

    second.nlp.pipe = no_spacy
    assert second.parse(texts) == expected
    assert second.parse(list(reversed(texts))) == list(reversed(expected))

    calls.clear()
    assert first.parse(["A new sentence.", "A cat slept."])[1] == expected[1]
    assert calls == [["A new sentence."]]


def test_spacy_without_cache_matches_cached(tmp_path: Path, spacy_parser: SpacyParser) -> None:
    texts = ["Time flies like an arrow."]
    assert SpacyParser(cache_dir=tmp_path).parse(texts) == spacy_parser.parse(texts)


def test_unknown_spacy_model() -> None:
    with pytest.raises(UserError, match="no_such_model"):
        SpacyParser(model="no_such_model")


def test_unusable_cache_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "spacy_parses.sqlite3").write_text("not a database")
    with pytest.raises(UserError, match=r"spacy_parses\.sqlite3: cannot use the parse cache"):
        SpacyParser(cache_dir=tmp_path).parse(["Hi."])


def test_cache_entries_from_before_part_of_speech_are_not_reused(tmp_path: Path) -> None:
    import sqlite3

    parser = SpacyParser(cache_dir=tmp_path)
    # An entry written the old way: keyed without the cache schema, words without `pos`.
    old_key = hashlib.sha256(
        json.dumps([parser.name, parser.version, "Dogs bark."], ensure_ascii=False).encode()
    ).hexdigest()
    with sqlite3.connect(tmp_path / "spacy_parses.sqlite3") as connection:
        connection.execute("CREATE TABLE parses (key TEXT PRIMARY KEY, words TEXT)")
        connection.execute(
            "INSERT INTO parses VALUES (?, ?)", (old_key, '[[0,4,"nsubj",1],[5,9,"root",1],[9,10,"punct",1]]')
        )
    (words,) = parser.parse(["Dogs bark."])
    assert all(w.pos for w in words) and [words] == SpacyParser().parse(["Dogs bark."])
    assert SpacyParser(cache_dir=tmp_path).parse(["Dogs bark."]) == [words]  # stored with pos, read back equal


def test_ewt_dev_keeps_universal_tags(ud_english_ewt: Path) -> None:
    _, words = read_conllu(ud_english_ewt / "en_ewt-ud-dev.conllu", limit=1)[0]
    tags = {w.pos for w in words}
    assert "" not in tags and tags <= {
        "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X",
    }  # fmt: skip


def test_the_parser_loads_spacy_only_for_texts_not_in_the_cache(tmp_path):
    """Its name and version (the cache key) come from the model's meta.json; a run whose texts are
    all cached never imports spaCy (seconds of a re-run), and one that needs a parse loads it."""
    script = (
        "import sys; from pathlib import Path; from sieves.parse import SpacyParser\n"
        "p = SpacyParser(cache_dir=Path(sys.argv[1]))\n"
        "p.parse(sys.argv[2:]); print(p.name, p.version, 'spacy' in sys.modules)\n"
    )
    run = lambda *texts: subprocess.run([sys.executable, "-c", script, str(tmp_path), *texts], capture_output=True,
                                        text=True, check=True).stdout.split()  # fmt: skip
    first = run("The cat sat.")
    assert first[2] == "True"  # a new text: spaCy parsed it
    assert run("The cat sat.") == [*first[:2], "False"]  # cached: the same key, no spaCy


@pytest.mark.parametrize(
    "payload",
    ["[]", "{not json", '"words"', '[[0,4,"nsubj",1,"NOUN"]]', '[[0,99,"root",0,"NOUN"]]', '[[0,4,"root",0,null]]'],
)
def test_a_damaged_cache_row_is_parsed_again_with_a_warning(tmp_path: Path, payload: str, caplog) -> None:
    """A row that cannot be its text's parse (not JSON, not words, no words for a non-blank text,
    a head or span outside the sentence) is a miss: parsed again, replaced, and said so."""
    import sqlite3

    text = "Dogs bark."
    expected = SpacyParser(cache_dir=tmp_path).parse([text])
    with sqlite3.connect(tmp_path / "spacy_parses.sqlite3") as connection:
        assert connection.execute("UPDATE parses SET words = ?", (payload,)).rowcount == 1
    with caplog.at_level("WARNING", logger="sieves.parse"):
        assert SpacyParser(cache_dir=tmp_path).parse([text, "  "]) == [*expected, ()]
    assert "spacy_parses.sqlite3: 1 entry is not a parse of its text ('Dogs bark.'); parsed again" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="sieves.parse"):
        assert SpacyParser(cache_dir=tmp_path).parse([text, "  "]) == [*expected, ()]  # replaced, and `()` kept
    assert not caplog.text
