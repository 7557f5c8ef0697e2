"""train.synthetic: the known-answer language is what its docstring says, and seeded."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bertjax.errors import UserError
from train import synthetic


def test_the_language_follows_its_successor_table_and_is_seeded(tmp_path: Path):
    info = synthetic.write(tmp_path / "a", words=20, successors=2, tokens=5000, seed=3)
    synthetic.write(tmp_path / "b", words=20, successors=2, tokens=5000, seed=3)
    for name in ("train.txt", "heldout.txt", "pairs.txt", "language.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert json.loads((tmp_path / "a" / "language.json").read_text()) == info
    words = info["words"]
    assert len(set(words)) == 20 == len(words)
    index = {w: i for i, w in enumerate(words)}
    documents = (tmp_path / "a" / "train.txt").read_text().strip().split("\n\n")
    assert len(documents) == info["documents"]["train"]
    for document in documents:
        sentences = document.split("\n")
        assert synthetic.DOCUMENT_SENTENCES[0] <= len(sentences) <= synthetic.DOCUMENT_SENTENCES[1]
        for sentence in sentences:
            *body, stop = sentence.split(" ")
            assert stop == "." and synthetic.SENTENCE_WORDS[0] <= len(body) <= synthetic.SENTENCE_WORDS[1]
            for a, b in itertools.pairwise(body):
                assert index[b] in info["successors"][index[a]]
    pairs = (tmp_path / "a" / "pairs.txt").read_text().splitlines()
    assert len(pairs) == info["pairs"] and all(line.count("\t") == 1 for line in pairs)
    other = synthetic.write(tmp_path / "c", words=20, successors=2, tokens=5000, seed=4)
    assert other["successors"] != info["successors"]


def test_word_forms_are_distinct_up_to_the_limit():
    assert len(set(synthetic.make_words(synthetic.MAX_WORDS))) == synthetic.MAX_WORDS


@pytest.mark.parametrize("words, successors", [(1, 1), (10, 10), (10, 0), (synthetic.MAX_WORDS + 1, 2)])
def test_impossible_languages_are_refused(tmp_path: Path, words, successors):
    with pytest.raises(UserError, match="--words"):
        synthetic.write(tmp_path / "x", words=words, successors=successors, tokens=100, seed=0)
    assert not (tmp_path / "x").exists()


def test_cli(tmp_path: Path, capsys, cli_error):
    synthetic.main(["--out", str(tmp_path / "lang"), "--words", "12", "--tokens", "2000"])
    assert "training documents" in capsys.readouterr().out
    assert cli_error(synthetic.main, ["--out", str(tmp_path / "lang")]).endswith("exists and is not empty")
