"""Every input reader refuses what it cannot read correctly, in one line naming the file and line
(issue 42's probe, 2.3–5.7): text tasks (invalid UTF-8 at its file offset, a line longer than any
example, a file replaced while it is read), GAP rows (offsets, mentions that are not whole words or
are one mention twice), CoNLL-U trees whose HEADs lead round in a cycle, and a corrupt
coref_heads.csv given to the report."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from analysis import api
from analysis.attention import coref
from analysis.common import examples
from analysis.heads import report as report_lib
from bertjax.errors import UserError
from sieves.parse import read_conllu, read_text_examples

# -- text:FILE -----------------------------------------------------------------------------------


def test_invalid_utf8_is_reported_at_its_offset_in_the_file(tmp_path):  # 2.3
    lines = b"".join(b"The cat sat on the mat number %d.\n" % i for i in range(3000))
    path = tmp_path / "b.txt"
    path.write_bytes(lines + b"bad \xff byte here\n")
    with pytest.raises(UserError) as raised:
        read_text_examples(path, 5000)
    assert str(raised.value) == f"{path}:3001: not UTF-8 text (invalid start byte at byte {len(lines) + 4} of the file)"
    # The first line's byte order mark is skipped, and counted in the offset.
    path.write_bytes(b"\xef\xbb\xbfA\xffB\n")
    with pytest.raises(UserError, match=r":1: not UTF-8 text \(invalid start byte at byte 4 of the file\)$"):
        read_text_examples(path, 5)


def test_a_line_longer_than_any_example_is_one_line(tmp_path):  # 2.5
    path = tmp_path / "h.txt"
    path.write_text("A short line.\n" + "the cat sat on a mat " * 500000 + "\n")
    with pytest.raises(UserError) as raised:
        read_text_examples(path, 2)
    assert str(raised.value) == (
        f"{path}:2: a line of 10,500,000 characters; an example is a sentence or a pair, of at most 100,000 "
        "characters (the model reads at most its positions' worth of tokens of it)"
    )
    assert read_text_examples(path, 1) == ([("A short line.",)], hashlib.sha256(path.read_bytes()).hexdigest())


def test_lines_split_at_line_feeds_and_the_digest_is_of_the_bytes_read(tmp_path):
    path = tmp_path / "t.txt"
    data = "\ufeffOne.\r\n\nTwo a.\tTwo b.\nThree.\n".encode()
    path.write_bytes(data)
    assert read_text_examples(path, 2) == ([("One.",), ("Two a.", "Two b.")], hashlib.sha256(data).hexdigest())


def _settings(shared_data: Path, cache: Path) -> dict:
    return dict(n=8, batch_size=8, max_length=32, cache_dir=str(cache), figures="none", roles="local,cls,block")


SINGLES = "".join(f"Sentence number {i} is here.\n" for i in range(4))
PAIRS = "".join(f"First part {i}.\tSecond part {i}.\n" for i in range(4))


def test_a_text_file_replaced_after_it_was_read_is_recorded_as_read(
    tiny_hf, shared_data, tmp_path, monkeypatch
):  # 2.10
    text = tmp_path / "f.txt"
    text.write_text(SINGLES)
    read = examples.load_tasks

    def read_then_replaced(config, tasks):
        data = read(config, tasks)
        (tmp_path / "other.txt").write_text(PAIRS)
        os.replace(tmp_path / "other.txt", text)  # another process swaps the file in
        return data

    monkeypatch.setattr(examples, "load_tasks", read_then_replaced)
    result = api.roles(str(tiny_hf), task=f"text:{text}", **_settings(shared_data, tmp_path / "parses"))
    (files,) = result.info["data_files"].values()
    # The singles were analysed (no pair role), so run.json names the singles' bytes.
    assert "block" not in set(result.table["role"])
    assert files == [{"path": str(text), "sha256": hashlib.sha256(SINGLES.encode()).hexdigest()}]

    # The report, whose check of the file passed just before the file was swapped again, reads
    # the pairs: it shows no examples rather than the pairs' as the run's.
    monkeypatch.setattr(report_lib, "changed_data_files", lambda data_files: None)
    page = report_lib.report_data(report_lib.read_run(result.directory), report_lib.ReportConfig(str(result.directory)))
    assert page["examples"] == {}
    assert f"{text} changed while it was read" in page["examples_missing"]
    text.write_text(SINGLES)
    page = report_lib.report_data(report_lib.read_run(result.directory), report_lib.ReportConfig(str(result.directory)))
    assert page["examples_missing"] is None and page["examples"]


# -- the report's --coref ------------------------------------------------------------------------


def test_a_corrupt_coref_table_is_one_line(tiny_hf, shared_data, tmp_path):  # 2.15
    text = tmp_path / "f.txt"
    text.write_text(SINGLES)
    result = api.roles(
        str(tiny_hf), task=f"text:{text}", out=tmp_path / "run", **_settings(shared_data, tmp_path / "p")
    )
    rows = [{"layer": layer, "head": head, "dev_accuracy": 0.5, "test_accuracy": 0.5, "test_ci_low": 0.4,
             "test_ci_high": 0.6, "test_n": 10} for layer in range(2) for head in range(2)]  # fmt: skip
    coref_dir = tmp_path / "coref"
    coref_dir.mkdir()

    def write(rows) -> None:
        header = list(rows[0])
        lines = [",".join(header)] + [",".join(str(r[k]) for k in header) for r in rows]
        (coref_dir / "coref_heads.csv").write_text("\n".join(lines) + "\n")

    config = report_lib.ReportConfig(str(result.directory), 0, coref=str(coref_dir))
    run = report_lib.read_run(result.directory)
    write([*rows[:2], {**rows[2], "dev_accuracy": "abc"}, rows[3]])
    with pytest.raises(UserError) as raised:
        report_lib.report_data(run, config)
    assert str(raised.value) == f"{coref_dir / 'coref_heads.csv'}:4: dev_accuracy must be a number, got 'abc'"
    write([*rows[:3], {**rows[3], "head": 0}])  # head 1-0 twice, 1-1 missing
    with pytest.raises(UserError, match=r"coref_heads.csv: its heads are not this run's 2 layers × 2 heads"):
        report_lib.report_data(run, config)
    write([*rows[:3], {**rows[3], "head": 1.5}])
    with pytest.raises(UserError, match=r"coref_heads.csv:5: head must be an integer, got 1.5"):
        report_lib.report_data(run, config)


# -- GAP -----------------------------------------------------------------------------------------


def _gap_copy(shared_data: Path, tmp_path: Path, edit) -> Path:
    """gap-development.tsv's header and first 3 rows, `edit(row index, fields)` applied to each."""
    lines = (shared_data / "gap" / "gap-development.tsv").read_text(encoding="utf-8").splitlines()[:4]
    rows = [dict(zip(coref.GAP_COLUMNS, line.split("\t"), strict=True)) for line in lines[1:]]
    for index, row in enumerate(rows):
        edit(index, row)
    path = tmp_path / "gap.tsv"
    path.write_text("\n".join([lines[0], *("\t".join(r[c] for c in coref.GAP_COLUMNS) for r in rows)]) + "\n")
    return path


def test_gap_offsets_must_be_ascii_digits(shared_data, tmp_path):  # 3.6
    path = _gap_copy(shared_data, tmp_path, lambda i, r: r.update({"Pronoun-offset": "²"}) if i == 1 else None)
    with pytest.raises(UserError, match=r"^.*gap.tsv, line 3: Pronoun-offset '²' is not a character offset$"):
        coref.read_gap(path)


def test_gap_mentions_must_be_whole_words(shared_data, tmp_path):  # 3.9
    def inside_a_word(index, row):
        if index == 0:
            start = row["Text"].index("the ") + 1  # the "he" of a "the"
            row.update({"Pronoun": "he", "Pronoun-offset": str(start)})

    path = _gap_copy(shared_data, tmp_path, inside_a_word)
    with pytest.raises(UserError, match=r"gap.tsv, line 2: Pronoun 'he' at offset \d+ is not a whole word of Text"):
        coref.read_gap(path)


def test_gap_candidates_must_be_two_mentions(shared_data, tmp_path):  # 3.11
    path = _gap_copy(shared_data, tmp_path, lambda i, r: r.update({"B": r["A"], "B-offset": r["A-offset"]}))
    with pytest.raises(UserError, match=r"gap.tsv, line 2: A and B overlap \(characters \d+–\d+ and \d+–\d+\)"):
        coref.read_gap(path)


def test_the_staged_gap_files_pass_the_checks(shared_data):
    for name in ("gap-development.tsv", "gap-test.tsv", "gap-validation.tsv"):
        assert len(coref.read_gap(shared_data / "gap" / name)) > 400


# -- CoNLL-U -------------------------------------------------------------------------------------

SENTENCE = """# text = Dogs bark loudly.
1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_
2\tbark\tbark\tVERB\tVBP\t_\t0\troot\t_\t_
3\tloudly\tloudly\tADV\tRB\t_\t2\tadvmod\t_\tSpaceAfter=No
4\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\t_

"""


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        ({1: "1"}, r"x.conllu:2: word 1 has itself as HEAD"),  # 5.7
        ({1: "3", 3: "1"}, r"x.conllu:2: the HEADs of words 1, 3 lead round in a cycle, never to the root \(HEAD 0\)"),
    ],
)
def test_conllu_heads_must_form_a_tree(heads, message, tmp_path):
    lines = SENTENCE.splitlines()
    for word, head in heads.items():
        fields = lines[word].split("\t")
        fields[6] = head
        lines[word] = "\t".join(fields)
    path = tmp_path / "x.conllu"
    path.write_text("\n".join(lines) + "\n\n")
    with pytest.raises(UserError, match=message):
        read_conllu(path)
    path.write_text(SENTENCE)
    assert len(read_conllu(path)) == 1


def test_the_staged_ewt_trees_pass(ud_english_ewt):
    assert len(read_conllu(ud_english_ewt / "en_ewt-ud-dev.conllu")) > 2000


def _replaced_after_reading(monkeypatch, path: Path, other: bytes) -> None:
    """Swaps `other` in at `path` once the run's tasks are read, as another process might."""
    read = examples.load_tasks

    def read_then_replaced(config, tasks):
        data = read(config, tasks)
        swap = path.with_name("swap")
        swap.write_bytes(other)
        os.replace(swap, path)
        return data

    monkeypatch.setattr(examples, "load_tasks", read_then_replaced)


def test_a_glue_file_replaced_after_it_was_read_is_recorded_as_read(tiny_hf, shared_data, tmp_path, monkeypatch):
    """2.10 for a GLUE TSV: run.json hashed the file again at the end, so it named the version
    there then. Now the reader reads the bytes once and run.json names their sha256."""
    dev = tmp_path / "glue" / "MRPC" / "dev.tsv"
    dev.parent.mkdir(parents=True)
    lines = (shared_data / "glue" / "MRPC" / "dev.tsv").read_bytes().splitlines(keepends=True)
    read, other = b"".join(lines[:9]), b"".join(lines[:1] + lines[2:9])
    dev.write_bytes(read)
    _replaced_after_reading(monkeypatch, dev, other)
    settings = {**_settings(shared_data, tmp_path / "parses"), "roles": "local,cls"}
    result = api.roles(str(tiny_hf), task="mrpc", glue_dir=str(tmp_path / "glue"), **settings)
    assert result.info["data_files"]["mrpc"] == [{"path": str(dev), "sha256": hashlib.sha256(read).hexdigest()}]


def test_a_conllu_file_replaced_while_it_is_read_is_one_line(tiny_hf, shared_data, tmp_path, monkeypatch, cli_error):
    """2.10 for a CoNLL-U file, which the analysis reads twice (the sentences, then their trees):
    trees of another version were paired with the first version's sentences, and run.json named
    the version there at the end."""
    from analysis import roles

    gold = tmp_path / "gold.conllu"
    sentences = (shared_data / "ud_english_ewt" / "en_ewt-ud-dev.conllu").read_text().split("\n\n")[:3]
    gold.write_text("\n\n".join(sentences) + "\n\n")
    _replaced_after_reading(monkeypatch, gold, ("# another version\n" + gold.read_text()).encode())
    argv = ["--ckpt", str(tiny_hf), "--parser", "conllu", "--conllu", str(gold), "--n", "8", "--max-length", "32",
            "--roles", "local,cls", "--no-figures", "--out", str(tmp_path / "out")]  # fmt: skip
    assert cli_error(roles.main, argv) == f"error: {gold} changed while it was read; run again once it stays put"
    assert not (tmp_path / "out").exists()


def test_a_gap_file_is_recorded_as_the_bytes_read(tmp_path):
    """2.10 for GAP: the coreference analysis' run.json names the sha256 of what `read_gap` parsed."""
    from bertjax import runinfo

    path = tmp_path / "gap.tsv"
    header = "\t".join(coref.GAP_COLUMNS) + "\n"
    row = "1\tHe said Ann met Bo.\tHe\t0\tAnn\t8\tTRUE\tBo\t16\tFALSE\turl\n"
    path.write_text(header + row)
    read = path.read_bytes()
    coref.read_gap(path)
    path.write_text(header + row.replace("Bo", "Al"))
    assert runinfo.input_sha256(path) == hashlib.sha256(read).hexdigest()
