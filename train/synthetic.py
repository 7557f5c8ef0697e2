"""A seeded synthetic language with a known answer: a first-order Markov chain over made-up words.

`python -m train.synthetic --out DIR [--words 64] [--successors 2] [--tokens 300000] [--seed 0]`

Each word is followed by one of `successors` words, uniformly; a sentence starts at a uniformly
drawn word, runs 4-12 words and ends with a full stop; a document holds 4-12 sentences. So a masked
token's best context-free guess, the full stop, is right about 1/9 of the time (at 64 words, 2
successors: 7% of the pieces a trained vocabulary makes), while its left neighbour narrows it to
`successors` words and its right neighbour usually to one: the masked-LM optimum needs a token's
neighbours, which is what a positional (prev/next) head provides. Writes into DIR:

    train.txt     documents for `kind: plain` (one sentence per line, a blank line between documents)
    heldout.txt   other documents of the same language, for `heldout.corpora`
    pairs.txt     two consecutive sentences per line, tab-separated, for `--task text:FILE`
    language.json the words, the successor table and the settings
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bertjax import cli, runinfo
from bertjax.errors import UserError
from bertjax.settings import add_flags, setting
from train.config import parse_command

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
SENTENCE_WORDS = (4, 12)
DOCUMENT_SENTENCES = (4, 12)
MAX_WORDS = (len(CONSONANTS) * len(VOWELS)) ** 2


@dataclasses.dataclass(frozen=True)
class Language:
    words: tuple[str, ...]
    successors: np.ndarray  # [V, k] word ids

    def sentence(self, rng: np.random.Generator) -> list[int]:
        length = int(rng.integers(SENTENCE_WORDS[0], SENTENCE_WORDS[1] + 1))
        ids = [int(rng.integers(len(self.words)))]
        for _ in range(length - 1):
            ids.append(int(self.successors[ids[-1], rng.integers(self.successors.shape[1])]))
        return ids

    def text(self, ids: Sequence[int]) -> str:
        return " ".join(self.words[i] for i in ids) + " ."


def make_words(count: int) -> tuple[str, ...]:
    """`count` distinct lower-case words of two consonant-vowel syllables: word 70q + r is
    S[r] + S[(31r + q) mod 70] over the 70 syllables S, distinct for count ≤ 4900 (given r, the
    second syllable fixes q), and varied in both syllables even for a few dozen words."""
    syllables = [c + v for c in CONSONANTS for v in VOWELS]
    n = len(syllables)
    return tuple(syllables[i % n] + syllables[(31 * (i % n) + i // n) % n] for i in range(count))


def make_language(words: int, successors: int, seed: int) -> Language:
    if words < 2 or not 1 <= successors < words:
        raise UserError(f"--words must be ≥ 2 and --successors in [1, words), got {words} and {successors}")
    if words > MAX_WORDS:
        raise UserError(f"--words: at most {MAX_WORDS}, got {words}")
    rng = np.random.default_rng(seed)
    table = np.stack([rng.choice(words, size=successors, replace=False) for _ in range(words)])
    return Language(make_words(words), table)


def documents(language: Language, tokens: int, rng: np.random.Generator) -> list[list[str]]:
    """Documents (lists of sentences) until about `tokens` words and full stops are written."""
    docs, written = [], 0
    while written < tokens:
        count = int(rng.integers(DOCUMENT_SENTENCES[0], DOCUMENT_SENTENCES[1] + 1))
        doc = [language.sentence(rng) for _ in range(count)]
        written += sum(len(s) + 1 for s in doc)
        docs.append([language.text(s) for s in doc])
    return docs


def write(out: Path, words: int, successors: int, tokens: int, seed: int, heldout_tokens: int | None = None) -> dict:
    """Writes the four files into `out` (new or empty) atomically; returns language.json's content."""
    if tokens < 1:
        raise UserError(f"--tokens must be ≥ 1, got {tokens}")
    if seed < 0:  # numpy's generators take none
        raise UserError(f"--seed must be ≥ 0, got {seed}")
    language = make_language(words, successors, seed)
    train_rng, heldout_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    train = documents(language, tokens, train_rng)
    heldout = documents(language, heldout_tokens or max(tokens // 10, 1000), heldout_rng)
    pairs = [f"{doc[i]}\t{doc[i + 1]}" for doc in heldout for i in range(0, len(doc) - 1, 2)]
    info = {
        "words": list(language.words),
        "successors": language.successors.tolist(),
        "settings": {"words": words, "successors": successors, "tokens": tokens, "seed": seed},
        "documents": {"train": len(train), "heldout": len(heldout)},
        "pairs": len(pairs),
        # The best a model that ignores context can do, and one that reads the left neighbour only.
        "unigram_accuracy": 1 / words,
        "left_neighbour_accuracy": 1 / successors,
    }
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: output directory exists and is not empty")
    with runinfo.atomic_out(out, kind="synthetic corpus") as tmp:
        (tmp / "train.txt").write_text("\n\n".join("\n".join(doc) for doc in train) + "\n")
        (tmp / "heldout.txt").write_text("\n\n".join("\n".join(doc) for doc in heldout) + "\n")
        (tmp / "pairs.txt").write_text("\n".join(pairs) + "\n")
        (tmp / "language.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


@dataclasses.dataclass(frozen=True)
class SyntheticFlags:
    """The language and how much text is drawn from it."""

    out: str = setting(help="output directory (new or empty)")
    words: int = setting(64, help="vocabulary of the language")
    successors: int = setting(2, help="words that may follow each word")
    tokens: int = setting(300_000, help="training text size, in words and full stops")
    seed: int = setting(0, help="seed of the language and of the text drawn from it")


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("train.synthetic", __doc__)
    add_flags(p, SyntheticFlags)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_command(build_parser(), SyntheticFlags, argv)
    out = Path(a.out)
    info = write(out, a.words, a.successors, a.tokens, a.seed)
    print(f"wrote {out}: {info['documents']['train']} training documents, {info['pairs']} held-out pairs")


if __name__ == "__main__":
    cli.run(main)
