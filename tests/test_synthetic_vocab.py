"""The known answer's vocabulary keeps every word of the synthetic language whole: a word split
into pieces would let a "prev" or "next" head read inside the word, not its neighbour."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from transformers import BertTokenizerFast

from train import synthetic
from train.corpora import CorpusConfig
from train.prepare import PrepareConfig, train_vocab

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "pretrain" / "synthetic.yaml"


def _split_words(language: Path, vocab_size: int, out: Path) -> list[str]:
    config = PrepareConfig(
        corpora=[CorpusConfig(name="synthetic", source="local", path=str(language / "train.txt"), kind="plain")],
        train_vocab=True, vocab_size=vocab_size, segmenter="sentencizer",
    )  # fmt: skip
    out.mkdir()
    tokenizer = BertTokenizerFast(vocab=str(train_vocab(config, out, np.random.default_rng(config.seed))))
    words = json.loads((language / "language.json").read_text())["words"]
    return [w for w in words if len(tokenizer.tokenize(w)) > 1]


@pytest.fixture(scope="module")
def language(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("language") / "text"
    synthetic.write(out, words=64, successors=2, tokens=300_000, seed=0)
    return out


def test_the_recipes_vocabulary_keeps_every_word_whole(language, tmp_path):
    vocab_size = OmegaConf.load(CONFIG).data.vocab_size
    assert _split_words(language, vocab_size, tmp_path / "vocab") == []


def test_the_old_size_split_words(language, tmp_path):
    # The planted defect: the size the recipe had, which split 26 of the 64 words.
    assert len(_split_words(language, 160, tmp_path / "vocab")) == 26
