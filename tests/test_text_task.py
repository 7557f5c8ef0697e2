"""`--task text:FILE`: any text, one example per line (a tab splits a pair), named `text-<stem>`."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis.common import examples
from bertjax.errors import UserError


def settings(spec: tuple[str, ...], n: int = 10) -> SimpleNamespace:
    return SimpleNamespace(task=spec, n=n, conllu=None, glue_dir=None, split="dev")


def test_lines_become_single_texts_or_pairs_in_file_order(tmp_path: Path):
    path = tmp_path / "my corpus.txt"
    path.write_text("\ufeffOne sentence here.\n\nA first half.\tA second half.\r\nLast one.\n")
    spec = ("mrpc", f"text:{path}")  # --task as the settings hold it
    assert examples.resolve_tasks(spec) == ["mrpc", "text-my_corpus"]
    segments, indices, files = examples.examples_for(settings(spec), "text-my_corpus")
    assert segments == [("One sentence here.",), ("A first half.", "A second half."), ("Last one.",)]
    # The file with the sha256 of the bytes read (run.json's, even if the file is replaced after).
    assert indices == [0, 1, 2] and files == {path: hashlib.sha256(path.read_bytes()).hexdigest()}
    assert examples.examples_for(settings(spec, n=2), "text-my_corpus")[0] == segments[:2]


@pytest.mark.parametrize(
    "content, message",
    [
        ("a\tb\tc\n", r"text.txt:1: a line must be one text, or two texts split by one tab"),
        ("ok\n\tb\n", r"text.txt:2: a line must be one text"),
        ("\n \n", r"text.txt: no text"),
        (b"\xff\xfe\x00bad", r"text.txt:1: not UTF-8 text \(invalid start byte at byte 0 of the file\)"),
    ],
)
def test_a_bad_text_file_is_one_line_naming_it(tmp_path: Path, content, message):
    path = tmp_path / "text.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=message):
        examples.examples_for(settings((f"text:{path}",)), "text-text")


def test_missing_files_and_clashing_names_are_refused(tmp_path: Path):
    with pytest.raises(UserError, match="is not a file"):
        examples.resolve_tasks((f"text:{tmp_path / 'absent.txt'}",))
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.txt").write_text("text\n")
    with pytest.raises(UserError, match="would both be named 'text-x'"):
        examples.resolve_tasks((f"text:{tmp_path / 'a' / 'x.txt'}", f"text:{tmp_path / 'b' / 'x.txt'}"))


def test_roles_on_a_text_file_end_to_end(tiny_hf, tmp_path: Path, cli_error):
    """The CLI reads the file and names its outputs after it; a missing file is one line."""
    import pandas as pd

    from analysis import roles

    path = tmp_path / "pairs.txt"
    path.write_text("".join(f"the cat sat on mat number {i} .\tit was a good day {i} .\n" for i in range(6)))
    out = tmp_path / "out"
    roles.main(["--ckpt", str(tiny_hf), "--task", f"text:{path}", "--roles", "prev,next,block,sep", "--no-figures",
                "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / "roles.csv")
    assert set(table["task"]) == {"text-pairs"} and set(table["role"]) == {"prev", "next", "block", "sep"}
    assert (table["n"] == 6).all()
    error = cli_error(
        roles.main, ["--ckpt", str(tiny_hf), "--task", f"text:{tmp_path / 'nope.txt'}", "--out", str(tmp_path / "o2")]
    )
    assert error.startswith("error: --task text:") and "is not a file" in error


def test_mostly_unknown_text_and_a_small_n_warn(tmp_path: Path, shared_data, caplog):
    """A text the vocabulary mostly lacks (here Greek for an English WordPiece vocabulary without
    it) warns with its [UNK] share; English text does not. Fewer than SMALL_N examples warn with N."""
    from transformers import BertTokenizerFast

    vocab = (shared_data / "vocab" / "bert-base-uncased-vocab.txt").read_text().splitlines()
    # The English words and specials only: no Greek letter is in it.
    english = [t for t in vocab if t.isascii()]
    (tmp_path / "vocab.txt").write_text("\n".join(english) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"), do_lower_case=True)
    greek = tmp_path / "greek.txt"
    greek.write_text("Η γάτα κάθεται στο χαλί.\nThe cat sat on the mat.\n")
    english_file = tmp_path / "english.txt"
    english_file.write_text("The cat sat on the mat.\n" * (examples.SMALL_N + 1))
    spec = (f"text:{greek}", f"text:{english_file}")
    config = SimpleNamespace(task=spec, n=100, conllu=None, glue_dir=None, split="dev", roles=("local",),
                             max_length=32, parser="none")  # fmt: skip
    tasks = examples.resolve_tasks(spec)
    with caplog.at_level("WARNING", logger=examples.log.name):
        data = examples.load_tasks(config, tasks)
        sequences = examples.encode_tasks(config, data, tokenizer, None, {})
    share = examples.unknown_share(tokenizer, sequences["text-greek"])
    # "Η γάτα κάθεται στο χαλί ." : 5 [UNK] words of 6 pieces, then 7 known pieces.
    assert share == pytest.approx(5 / 13)
    assert examples.unknown_share(tokenizer, sequences["text-english"]) == 0.0
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        f"text-greek: N = 2 examples, fewer than {examples.SMALL_N}: its tests have little power and its shares of heads move in large steps",
        "text-greek: 38% of the text's pieces are unknown to the model's vocabulary ([UNK]; warned above 5%): "
        "the roles describe attention over [UNK], not over this text",
    ]


def test_a_file_mixing_pairs_and_single_sentences_says_why_block_is_absent(tmp_path: Path, caplog):
    path = tmp_path / "mixed.txt"
    path.write_text("".join(f"first half {i} .\tsecond half {i} .\n" for i in range(3)) + "one text .\nanother .\n")
    spec = (f"text:{path}",)
    config = SimpleNamespace(task=spec, n=100, conllu=None, glue_dir=None, split="dev", roles=("local", "block"))
    with caplog.at_level("WARNING", logger=examples.log.name):
        examples.load_tasks(config, examples.resolve_tasks(spec))
    assert [r.getMessage() for r in caplog.records if "not scored" in r.getMessage()] == [
        "text-mixed: block not scored: its examples mix 3 sentence pairs and 2 single sentences, and a pair role "
        "needs every example to be a pair (put the pairs in a text: file of their own)"
    ]


def test_text_that_a_tiny_vocabulary_spells_out_warns(tmp_path: Path, shared_data, caplog):
    """A model with a 160-piece vocabulary reported `local 100%` on MRPC without a word: it splits
    English words into characters rather than [UNK], which the [UNK] warning does not see. The
    same text through the full vocabulary, and the tiny vocabulary's own kind of text, do not warn."""
    from transformers import BertTokenizerFast

    english = "The company said its profit rose sharply in the third quarter.\n" * (examples.SMALL_N + 1)
    own = "ab ba ab ab ba ba ab.\n" * (examples.SMALL_N + 1)
    (tmp_path / "english.txt").write_text(english)
    (tmp_path / "own.txt").write_text(own)
    # Letters and specials only: every English word is spelled out in single characters.
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tiny_vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "ab", "ba", *letters, *(f"##{c}" for c in letters)]
    (tmp_path / "tiny.txt").write_text("\n".join(tiny_vocab) + "\n")
    tiny = BertTokenizerFast(vocab=str(tmp_path / "tiny.txt"), do_lower_case=True)
    full = BertTokenizerFast(vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True)

    def warnings(tokenizer, name: str) -> list[str]:
        spec = (f"text:{tmp_path / name}",)
        config = SimpleNamespace(task=spec, n=100, conllu=None, glue_dir=None, split="dev", roles=("local",),
                                 max_length=64, parser="none")  # fmt: skip
        caplog.clear()
        with caplog.at_level("WARNING", logger=examples.log.name):
            examples.encode_tasks(
                config, examples.load_tasks(config, examples.resolve_tasks(spec)), tokenizer, None, {}
            )
        return [r.getMessage() for r in caplog.records]

    # 11 words of 51 letters, and the full stop: 52 pieces.
    assert warnings(tiny, "english.txt") == [
        "text-english: 4.7 text pieces per word (warned above 3.0; a vocabulary of the text's language gives "
        "1.2-1.5): the model's vocabulary spells this text out in fragments, and the roles describe attention "
        "inside its words"
    ]
    assert warnings(full, "english.txt") == []
    assert warnings(tiny, "own.txt") == []
