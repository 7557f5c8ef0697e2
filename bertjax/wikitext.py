"""WikiText (Merity et al. 2016) as articles of paragraphs: read by pre-training (`train.corpora`)
and by the analyses that take Wikipedia text as input (`analysis.clark`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

_UNESCAPE = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def heading_level(line: str) -> int:
    """0 for a text line, else the heading level (` = T = ` is 1, ` = = S = = ` is 2)."""
    words = line.split()
    if len(words) < 3 or words[0] != "=" or words[-1] != "=":
        return 0
    return sum(1 for _ in itertools.takewhile(lambda w: w == "=", words))


def articles(text: str) -> Iterator[list[str]]:
    """Split WikiText into articles at level-1 headings; one paragraph per text line.

    Heading lines and the single-space blank lines are dropped. WikiText's number escapes
    (`1 @,@ 000`, `60 @-@ year`) are undone, or WordPiece would see `@` tokens no real text has.
    """
    paragraphs: list[str] = []
    for line in text.split("\n"):
        level = heading_level(line)
        if level == 1:
            if paragraphs:
                yield paragraphs
            paragraphs = []
        elif level == 0 and line.strip():
            for escaped, plain in _UNESCAPE:
                line = line.replace(escaped, plain)
            paragraphs.append(" ".join(line.split()))
    if paragraphs:
        yield paragraphs
