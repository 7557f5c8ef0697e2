"""The model families bertjax reads and builds, one registry entry each (HF's `model_type`).

An entry is what the rest of bertjax asks of a family: its config adapter (a HF `config.json` to
`BertConfig` fields and back, and the checks of its own fields), its classes (the encoder and the
headed models it has, as `module:Class`, imported when first asked for, as big_vision imports
`models.<name>`), its conversion rules (`convert.Rules`), and the few facts of its architecture that
shared code reads (positions counted after the padding id, a pooler, token types). Nothing outside
this module compares `model_type` with a family's name: adding a family is one module (its
encoder, or none where BERT's layers serve) and one line in `FAMILIES` (docs/layout.md).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bertjax.convert import BERT_RULES, ELECTRA_RULES, MODERNBERT_RULES, ROBERTA_RULES, Rules
from bertjax.errors import UserError

if TYPE_CHECKING:
    from bertjax.config import BertConfig, ConfigAdapter
    from bertjax.model import Model

# The classes of a family with BERT's layers (bertjax.model): the encoder, MLM + NSP, a classifier.
BERT_CLASSES = {
    "BertModel": "bertjax.model:BertModel",
    "BertForPreTraining": "bertjax.model:BertForPreTraining",
    "BertForSequenceClassification": "bertjax.model:BertForSequenceClassification",
}

# ModernBERT's layers are its own (RoPE, local bands, GeGLU); its encoder answers for BertModel.
MODERNBERT = "bertjax.modernbert:ModernBertModel"


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family. `classes` maps the class a caller asks for (`BertModel` is every family's
    bare encoder, what the analyses ask for) to the `module:Class` that implements it."""

    name: str  # HF's model_type
    title: str  # as the papers write it, for messages
    classes: Mapping[str, str]
    rules: Rules
    config_adapter: str  # `module:NAME` of its `bertjax.config.ConfigAdapter`
    architecture: str  # the prefix of HF's class names (`Bert`ForPreTraining, `Roberta`Model)
    positions_after_padding: bool = False  # fairseq's numbering: real tokens from pad_token_id + 1
    narrow_embeddings: bool = False  # embedding_size, projected to hidden_size
    pooler: bool = True
    token_types: bool = True
    exportable: bool = False  # save_pretrained writes HF's format

    @property
    def adapter(self) -> ConfigAdapter:
        return load(self.config_adapter)

    def read_hf(self, hf: dict[str, Any], source: str) -> dict[str, Any]:
        """A HF config.json's fields under `BertConfig`'s names; `source` names it in errors."""
        return self.adapter.read_hf(hf, source)

    def write_hf(self, config: BertConfig, architecture: str) -> dict[str, Any]:
        return self.adapter.write_hf(config, architecture)

    def check(self, config: BertConfig) -> None:
        """The family's own fields, after the checks every config gets."""
        self.adapter.check(config)

    @property
    def described(self) -> str:
        return f"{'an' if self.title[0] in 'AEIOU' else 'a'} {self.title}"

    def model_class(self, asked: str | type[Model]) -> type[Model]:
        """The class of this family that `asked` (a name, or a class of any family) stands for; a
        class no family knows (a caller's own subclass) is taken as it is."""
        key = asked if isinstance(asked, str) else asked.__name__
        if key in self.classes:
            return load(self.classes[key])
        if not isinstance(asked, str) and key not in class_names():
            return asked
        encoder = self.classes["BertModel"].rpartition(":")[2]
        if any(
            key in f.classes and key != "BertModel" and f.classes[key] == f.classes["BertModel"]
            for f in FAMILIES.values()
        ):
            raise UserError(f"{key} is not a class of model_type {self.name!r}; load it as BertModel")
        if set(self.classes) <= {"BertModel", encoder}:
            loads = "" if encoder == "BertModel" else f", which loads as {encoder}"
            have = f"its encoder only (BertModel{loads})"
        else:
            have = f"the classes {', '.join(self.classes)}"
        raise UserError(f"{key} is not available for model_type {self.name!r}: bertjax has {have}")


def load(where: str) -> Any:
    """The object `module:NAME` names: a family's pieces are imported when first used, so the
    registry imports no model code (and the config module, which reads it, can import it)."""
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def class_names() -> list[str]:
    """Every class name some family has, in registry order."""
    return list(dict.fromkeys(name for f in FAMILIES.values() for name in f.classes))


def family(name: Any) -> Family:
    if not isinstance(name, str) or name not in FAMILIES:
        raise UserError(f"model_type {name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "BERT", BERT_CLASSES, BERT_RULES, "bertjax.config:BERT_ADAPTER", "Bert", exportable=True),
    # BERT's layers, positions counted from after the padding id, one token type.
    "roberta": Family(
        "roberta", "RoBERTa", BERT_CLASSES, ROBERTA_RULES, "bertjax.config:BERT_ADAPTER", "Roberta",
        positions_after_padding=True,
    ),
    # BERT's layers behind a projection of narrower embeddings; bertjax has its encoder only.
    "electra": Family(
        "electra", "ELECTRA", {"BertModel": BERT_CLASSES["BertModel"]}, ELECTRA_RULES, "bertjax.config:BERT_ADAPTER",
        "Electra", narrow_embeddings=True, pooler=False,
    ),
    "modernbert": Family(
        "modernbert", "ModernBERT", {"BertModel": MODERNBERT, "ModernBertModel": MODERNBERT}, MODERNBERT_RULES,
        "bertjax.config:MODERNBERT_ADAPTER", "ModernBert", pooler=False, token_types=False,
    ),
}  # fmt: skip
