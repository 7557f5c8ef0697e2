"""GLUE loading: the staged real files, the stand-in fallback, every user error, the hub path."""

import logging
from pathlib import Path

import datasets
import pytest
from transformers import BertTokenizerFast

from bertjax import glue
from bertjax.errors import UserError
from bertjax.glue import TASKS, Example, encode, glue_files, load_glue, resolve_tasks


@pytest.fixture(scope="module")
def glue_dir(shared_data: Path) -> Path:
    return shared_data / "glue"


def write_tsv(root: Path, task_dir: str, name: str, lines: list[str], bom: bool = False) -> Path:
    path = root / task_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{line}\n" for line in lines)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


@pytest.mark.parametrize(
    ("task", "rows", "positive"),
    [("mrpc", 408, 279), ("sst2", 872, 444), ("qnli", 5463, 2761), ("qqp", 9, 4)],
)
def test_row_and_label_counts(glue_dir: Path, task: str, rows: int, positive: int) -> None:
    examples = load_glue(task, "dev", glue_dir)
    assert len(examples) == rows
    assert [e.index for e in examples] == list(range(rows))
    assert sum(e.label for e in examples) == positive


def test_first_rows(glue_dir: Path) -> None:
    mrpc = load_glue("mrpc", "dev", glue_dir, n=2)
    assert mrpc[0] == Example(
        0,
        "He said the foodservice pie business doesn't fit the company's long-term growth strategy.",
        '"The foodservice pie business does not fit our long-term growth strategy.',
        1,
    )
    assert mrpc[1].label == 0
    sst2 = load_glue("sst2", "dev", glue_dir, n=2)
    # The files' trailing space is kept: the text is what the file holds.
    assert sst2[0] == Example(0, "it 's a charming and often affecting journey . ", None, 1)
    assert sst2[1] == Example(1, "unflinchingly bleak and desperate ", None, 0)
    qnli = load_glue("qnli", "validation", glue_dir, n=2)
    assert qnli[0] == Example(
        0,
        "What came into force after the new constitution was herald?",
        "As of that day, the new constitution heralding the Second Republic came into force.",
        0,
    )
    assert qnli[1].label == 1  # not_entailment, the hub's order
    assert load_glue("mrpc", "train", glue_dir, n=1)[0].text_a.startswith("Amrozi accused his")


def test_bom_does_not_leak_into_the_header(tmp_path: Path, glue_dir: Path) -> None:
    assert (glue_dir / "MRPC" / "dev.tsv").read_bytes().startswith(b"\xef\xbb\xbf")
    # With the BOM read as text, "Quality" would not be found and this would fail at line 1.
    write_tsv(tmp_path, "MRPC", "dev.tsv", ["Quality\t#1 String\t#2 String", "1\ta\tb"], bom=True)
    assert load_glue("mrpc", "dev", tmp_path) == [Example(0, "a", "b", 1)]


def test_n_takes_the_first_rows_in_file_order(glue_dir: Path) -> None:
    full = load_glue("qnli", "dev", glue_dir)
    assert load_glue("qnli", "dev", glue_dir, n=10) == full[:10]
    assert load_glue("qnli", "dev", glue_dir, n=1_000_000) == full


def test_n_stops_before_a_bad_row(tmp_path: Path) -> None:
    write_tsv(tmp_path, "SST-2", "dev.tsv", ["sentence\tlabel", "good\t1", "bad row"])
    assert load_glue("sst2", "dev", tmp_path, n=1) == [Example(0, "good", None, 1)]


def test_qqp_stand_in_file(glue_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bertjax.glue"):
        examples = load_glue("qqp", "dev", glue_dir)
    assert "dev.head9.tsv" in caplog.text
    assert examples[0] == Example(0, "Why are African-Americans so beautiful?", "Why are hispanics so beautiful?", 0)
    assert glue_files("qqp", "dev", glue_dir) == [glue_dir / "QQP" / "dev.head9.tsv"]
    assert glue_files("mrpc", "dev", glue_dir) == [glue_dir / "MRPC" / "dev.tsv"]


def test_ambiguous_stand_ins_are_an_error(tmp_path: Path) -> None:
    for name in ("dev.head9.tsv", "dev.head20.tsv"):
        write_tsv(tmp_path, "QQP", name, ["question1\tquestion2\tis_duplicate", "a\tb\t0"])
    with pytest.raises(UserError, match=r"QQP/dev\.tsv"):
        load_glue("qqp", "dev", tmp_path)


def test_test_split_has_no_labels(tmp_path: Path) -> None:
    write_tsv(tmp_path, "QNLI", "test.tsv", ["index\tquestion\tsentence", "0\tWhy?\tBecause."])
    assert load_glue("qnli", "test", tmp_path) == [Example(0, "Why?", "Because.", None)]


def test_text_keeps_quotes_and_other_line_breaks(tmp_path: Path) -> None:
    write_tsv(tmp_path, "SST-2", "dev.tsv", ["sentence\tlabel", 'a "quote\u2028here\t0', "b\t1"])
    assert [e.text_a for e in load_glue("sst2", "dev", tmp_path)] == ['a "quote\u2028here', "b"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["sentence\tlabel", "fine\t1", "x"], r"dev\.tsv:3: 1 tab-separated fields, header has 2"),
        (["sentence\tlabel", "fine\t1", "a\t0\textra"], r"dev\.tsv:3: 3 tab-separated fields"),
        (["sentence\tlabel", "   \t1"], r"dev\.tsv:2: empty text in column 'sentence'"),
        (["sentence\tlabel", "fine\t1", "fine\t2"], r"dev\.tsv:3: label '2' is not one of 0, 1"),
        (["sentence\tlabel", "fine\t1 "], r"dev\.tsv:2: label '1 ' is not one of 0, 1"),
        (["sentence\tlabel", "fine\t"], r"dev\.tsv:2: label '' is not one of"),
        (["text\tlabel", "fine\t1"], r"dev\.tsv:1: header lacks column\(s\) 'sentence'"),
        ([], r"dev\.tsv:1: header lacks column"),
        (["sentence\tlabel"], r"dev\.tsv: no examples \(a header and nothing else\)"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    write_tsv(tmp_path, "SST-2", "dev.tsv", lines)
    with pytest.raises(UserError, match=message):
        load_glue("sst2", "dev", tmp_path)


def test_empty_second_text(tmp_path: Path, shared_data: Path) -> None:
    """An error for the analyses; kept for fine-tuning, as QQP's official train split has two."""
    write_tsv(tmp_path, "MRPC", "dev.tsv", ["Quality\t#1 String\t#2 String", "1\ta\tb", "0\ta\t"])
    with pytest.raises(UserError, match=r"dev\.tsv:3: empty text in column '#2 String'"):
        load_glue("mrpc", "dev", tmp_path)
    assert load_glue("mrpc", "dev", tmp_path, allow_empty=True)[1] == Example(1, "a", "", 0)
    write_tsv(tmp_path, "QQP", "train.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                                            "310137\t1\t2\tHow can I create an Android app?\t\t0"])  # fmt: skip
    (example,) = load_glue("qqp", "train", tmp_path, allow_empty=True)
    tokenizer = BertTokenizerFast(vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True)
    arrays = encode([example], tokenizer, 16, "qqp train")
    n = int(arrays["attention_mask"][0].sum())
    tokens = tokenizer.convert_ids_to_tokens(arrays["input_ids"][0, :n].tolist())
    assert tokens[0] == "[CLS]" and tokens[-3:] == ["?", "[SEP]", "[SEP]"] and arrays["token_type_ids"][0, n - 1] == 1


def test_invalid_utf8(tmp_path: Path) -> None:
    path = write_tsv(tmp_path, "SST-2", "dev.tsv", ["sentence\tlabel"])
    path.write_bytes(path.read_bytes() + b"caf\xe9\t1\n")
    with pytest.raises(UserError, match=r"dev\.tsv:2: not valid UTF-8"):
        load_glue("sst2", "dev", tmp_path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"not found: .*SST-2/train\.tsv"):
        load_glue("sst2", "train", tmp_path)


def test_unknown_task_split_and_n(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"unknown task 'cola' \(--task\): choose one of qnli, qqp"):
        load_glue("cola", "dev", tmp_path)
    with pytest.raises(UserError, match=r"unknown split 'val' \(--split\)"):
        load_glue("sst2", "val", tmp_path)
    with pytest.raises(UserError, match="--n must be ≥ 1"):
        load_glue("sst2", "dev", tmp_path, n=0)


def test_resolve_tasks() -> None:
    assert resolve_tasks("all") == ["qnli", "qqp", "mrpc", "sst2"]
    assert resolve_tasks("mrpc") == ["mrpc"]
    with pytest.raises(UserError, match="unknown task"):
        resolve_tasks("glue")


def test_task_specs() -> None:
    assert [s.num_labels for s in TASKS.values()] == [2, 2, 2, 2]
    assert [t for t, s in TASKS.items() if "f1" in s.metrics] == ["qqp", "mrpc"]
    assert TASKS["qnli"].labels[0] == "entailment"


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub switched on (the tests run with it off), for a faked `datasets.load_dataset`."""
    for variable in glue.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def test_hub_rows_are_sliced_and_converted(monkeypatch: pytest.MonkeyPatch, online) -> None:
    calls = []
    rows = {
        "mrpc": [
            {"sentence1": "a", "sentence2": "b", "label": 1, "idx": 0},
            {"sentence1": "c", "sentence2": "d", "label": -1, "idx": 1},
        ],
        "sst2": [{"sentence": "e ", "label": 0, "idx": 0}],
    }

    def fake_load_dataset(path: str, name: str, split: str) -> list[dict]:
        calls.append((path, name, split))
        return rows[name]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_glue("mrpc", "dev", n=2) == [Example(0, "a", "b", 1), Example(1, "c", "d", None)]
    assert load_glue("sst2", "train") == [Example(0, "e ", None, 0)]
    assert calls == [("nyu-mll/glue", "mrpc", "validation[:2]"), ("nyu-mll/glue", "sst2", "train")]


def test_hub_unreachable_is_a_user_error(monkeypatch: pytest.MonkeyPatch, online) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match=r"could not load nyu-mll/glue qnli validation.*--glue-dir"):
        load_glue("qnli")


@pytest.mark.parametrize("variable", glue.OFFLINE_VARIABLES)
@pytest.mark.parametrize("cached", [None, "hub", "datasets"])
def test_the_hub_switched_off_without_a_cached_copy_is_one_line_at_once(monkeypatch, tmp_path, variable, cached):
    from huggingface_hub import constants

    for name in glue.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: calls.append(args) or [])
    if cached is None:
        with pytest.raises(
            UserError,
            match=rf"^nyu-mll/glue mrpc: the hub is off \({variable}=1\) and no local copy is cached; pass --glue-dir",
        ):
            load_glue("mrpc")
        assert calls == []  # the client never ran: no retries
        return
    copy = {
        "hub": tmp_path / "hub" / "datasets--nyu-mll--glue",
        "datasets": tmp_path / "datasets" / "nyu-mll___glue" / "mrpc",
    }
    copy[cached].mkdir(parents=True)
    # With a copy the client is asked (it reads its cache offline); here it has no rows.
    with pytest.raises(UserError, match="no examples"):
        load_glue("mrpc")
    assert calls == [("nyu-mll/glue", "mrpc")]
