"""Corpus readers refuse or warn on what they cannot read correctly: an unclosed WikiExtractor
article, binary files in a plain-text folder."""

from __future__ import annotations

import logging
import os

import pytest

from bertjax.errors import UserError
from train import corpora
from train.corpora import CorpusConfig, iter_documents, wikiextractor_documents


def test_an_unclosed_wikiextractor_article_ends_at_the_next_one(caplog):
    """Probe 4.13: the first article ran to the second's `</doc>`, holding its `<doc id=…>` line."""
    text = ('<doc id="1" url="u1" title="Alpha">\nAlpha\nAlpha text.\n'
            '<doc id="2" url="u2" title="Beta">\nBeta\nBeta text.\n</doc>\n'
            '<doc id="3" title="Gamma">\nGamma\nGamma text.\n')  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="train.corpora"):
        documents = list(wikiextractor_documents(text))
    assert documents == [["Alpha text."], ["Beta text."], ["Gamma text."]]
    assert [r.getMessage() for r in caplog.records] == [
        '<doc id="1" url="u1" title="Alpha"> has no </doc>: its article ends at the next <doc>',
        '<doc id="3" title="Gamma"> has no </doc>: its article ends at the end of the file',
    ]
    closed = '<doc id="1">\nTitle\nOne.\n\nTwo.\n</doc>\nstray line\n<doc id="2">\nT\nThree.\n</doc>\n'
    assert list(wikiextractor_documents(closed)) == [["One.", "Two."], ["Three."]]


def test_binary_files_in_a_plain_corpus_folder_are_skipped_and_named(tmp_path, caplog):
    """Probe 4.15: `x.png` was read as Latin-1 text; 67 of 300 trained vocabulary entries were its
    bytes."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("The cat sat on the mat.\n")
    (folder / "x.png").write_bytes(os.urandom(20000))
    (folder / "y.bin").write_bytes(bytes(range(1, 32)) * 100)  # no NUL, but controls throughout
    (folder / "latin.txt").write_bytes("C\u00e6sar said h\u00e9llo.\n".encode("latin-1"))  # text, still read
    cfg = CorpusConfig(name="c", source="local", path=str(folder), kind="plain")
    with caplog.at_level(logging.WARNING, logger="train.corpora"):
        documents = list(iter_documents(cfg))
    assert documents == [["The cat sat on the mat."], ["C\u00e6sar said h\u00e9llo."]]
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder / 'x.png'}: skipped, binary data, not text",
        f"{folder / 'y.bin'}: skipped, binary data, not text",
    ]
    one = CorpusConfig(name="c", source="local", path=str(folder / "x.png"), kind="plain")
    with pytest.raises(UserError, match=r"x\.png: binary data, not text"):
        list(iter_documents(one))
    assert corpora.is_binary(b"plain text\n") is False
