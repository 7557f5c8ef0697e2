"""Sequence lengths of the tracked tasks, and what τ = 3 means for the [CLS] and [SEP] roles at them.

    python docs/emergence_lengths.py [GLUE_DIR]    # default: $BERTJAX_DATA/glue or ../shared/data/glue

The seeds of docs/emergence.md were tracked at max length 64 with their own trained vocabulary
(docs/emergence/seeds/vocab.txt): per task, the real tokens n of each analysed sequence ([CLS] and
[SEP] included, pairs cut longest-first as the analyses cut them). β of the `cls` role is
n · α(t, [CLS]), so τ = 3 asks for 3/n of a row's attention on [CLS]; the `sep` role's sieve holds
every [SEP] (k of them: 2 in a pair, 1 in a single sentence), so τ = 3 asks for 3k/n on them together.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from transformers import BertTokenizerFast

from bertjax import glue

SEEDS = Path(__file__).resolve().parent / "emergence" / "seeds"
TASKS = {"mrpc": 408, "sst2": 872, "qnli": 1000}
MAX_LENGTH = 64


def lengths(glue_dir: Path) -> str:
    tokenizer = BertTokenizerFast(vocab=str(SEEDS / "vocab.txt"), do_lower_case=True)
    lines = ["| task | N | n: median [5%, 95%] | at the 64-token limit | [CLS] share for τ = 3 at the median | [SEP] share (all of them) |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for task, n in TASKS.items():
        texts = [e.segments for e in glue.load_glue(task, "dev", glue_dir=glue_dir, n=n)]
        encoded = [tokenizer(*t, truncation="longest_first", max_length=MAX_LENGTH)["input_ids"] for t in texts]
        sizes = np.array([len(ids) for ids in encoded])
        seps = 2 if len(texts[0]) == 2 else 1
        median = float(np.median(sizes))
        low, high = np.percentile(sizes, [5, 95], method="inverted_cdf")
        lines.append(f"| {task} | {len(sizes)} | {median:g} [{low:g}, {high:g}] | {np.mean(sizes == MAX_LENGTH):.0%} | "
                     f"{3 / median:.1%} | {3 * seps / median:.1%} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    default = Path(os.environ.get("BERTJAX_DATA", "../shared/data")) / "glue"
    print(lengths(Path(sys.argv[1]) if len(sys.argv) > 1 else default))
