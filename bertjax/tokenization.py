"""A BERT tokenizer read by the `tokenizers` library alone, without importing transformers (its
import is ~1.1 s of every analysis's start on a 2-core CPU, more than loading MiniLM's weights).

`light_tokenizer` returns one only where transformers' `BertTokenizer` would encode the same: a
`tokenizer.json` whose normalizer, pre-tokenizer, model and post-processor are the ones that class
builds from `tokenizer_config.json`, and whose added tokens are exactly its special tokens. Anything
else (a `vocab.txt` alone, another tokenizer class, added tokens) is left to transformers. Both are
encoded by `sieves.align.encode_batch` through `backend_tokenizer`, the same `tokenizers.Tokenizer`
calls that transformers makes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, cast

from bertjax.config import read_hf_json

# The special tokens BertTokenizer names, with its defaults.
SPECIAL = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
           "mask_token": "[MASK]"}  # fmt: skip
# Settings of tokenizer_config.json that change what transformers builds beyond BertTokenizer's
# arguments read here: a file naming any of them goes to transformers.
UNREAD = ("added_tokens_decoder", "additional_special_tokens", "extra_special_tokens", "bos_token", "eos_token")


@dataclasses.dataclass(frozen=True, eq=False)
class LightTokenizer:
    """What the analyses ask of a tokenizer (`sieves.align.encode_batch`, the [UNK] share, the
    vocabulary's size), over a `tokenizers.Tokenizer`."""

    backend_tokenizer: Any
    name_or_path: str
    cls_token_id: int
    sep_token_id: int
    unk_token_id: int
    pad_token_id: int
    mask_token_id: int
    truncation_side: str = "right"
    split_special_tokens: bool = False
    is_fast = True
    bos_token_id = None
    eos_token_id = None

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]


def light_tokenizer(location: Path) -> LightTokenizer | None:
    """The tokenizer of `location` without transformers where it is provably what transformers'
    BertTokenizer loads (see the module's docstring), else None."""
    file = location / "tokenizer.json"
    config_file = location / "tokenizer_config.json"
    if not file.is_file():
        return None
    config = read_hf_json(config_file) if config_file.is_file() else {}
    if config.get("tokenizer_class") not in ("BertTokenizer", "BertTokenizerFast") or any(k in config for k in UNREAD):
        return None
    special = {name: config.get(name, default) for name, default in SPECIAL.items()}
    side, split = config.get("truncation_side", "right"), config.get("split_special_tokens", False)
    if not all(isinstance(v, str) for v in special.values()) or side not in ("left", "right") or split not in (0, 1):
        return None  # an AddedToken object, or a setting transformers would refuse
    switches = (config.get("do_lower_case", True), config.get("tokenize_chinese_chars", True))
    if not all(isinstance(v, bool) for v in switches) or config.get("strip_accents") not in (None, True, False):
        return None
    # transformers reads the special tokens from special_tokens_map.json too: it must agree.
    named = location / "special_tokens_map.json"
    if named.is_file() and any(special.get(k) != v for k, v in read_hf_json(named).items()):
        return None
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors

    try:
        backend = Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 (its parse errors are bare Exceptions: transformers names them)
        return None
    stored = json.loads(backend.to_str())
    model = stored.get("model") or {}
    vocab = model.get("vocab") or {}
    if not all(token in vocab for token in special.values()):
        return None
    cls, sep = special["cls_token"], special["sep_token"]
    # What BertTokenizer.__init__ sets on the tokenizer it builds from this file's vocabulary.
    expected = {
        "normalizer": normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=config.get("tokenize_chinese_chars", True),
            strip_accents=config.get("strip_accents"),
            lowercase=config.get("do_lower_case", True),
        ),
        "pre_tokenizer": pre_tokenizers.BertPreTokenizer(),
        "post_processor": processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
        ),
    }
    # A component's state is its part of tokenizer.json, as the library writes it.
    if any(json.loads(cast(bytes, built.__getstate__())) != stored.get(part) for part, built in expected.items()):
        return None
    wordpiece = {"type": "WordPiece", "unk_token": special["unk_token"], "continuing_subword_prefix": "##",
                 "max_input_chars_per_word": 100}  # fmt: skip
    if {k: model.get(k) for k in wordpiece} != wordpiece:
        return None
    added = stored.get("added_tokens") or []
    # Each the special token of its vocabulary entry, so that the ids here are the backend's.
    if not all(t.get("special") and t.get("id") == vocab.get(t.get("content")) for t in added):
        return None
    if {t.get("content") for t in added} != set(special.values()):
        return None
    ids = {f"{name}_id": vocab[token] for name, token in special.items()}
    return LightTokenizer(backend, str(location), **ids, truncation_side=side, split_special_tokens=bool(split))
