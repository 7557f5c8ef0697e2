"""bertjax: BERT (and RoBERTa, ModernBERT) in JAX/Flax for BERTology — the models, their configs and
checkpoint conversion."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bertjax import cli
from bertjax.errors import UserError

cli.library_logging()

# The package's names by the module that defines them, imported on first use: every entry point
# imports `bertjax.cli`, and its `--help` should not wait for JAX and flax to load.
_MODULES = {
    "bertjax.config": ("PRESETS", "BertConfig", "preset"),
    "bertjax.model": ("BertForPreTraining", "BertForSequenceClassification", "BertModel", "BertOutput",
                      "ClassificationOutput", "PreTrainingOutput"),
    "bertjax.modernbert": ("ModernBertModel",),
    "bertjax.pretrained": ("Checkpoint", "from_pretrained", "init_model", "load_tokenizer", "open_checkpoint",
                           "save_pretrained"),
}  # fmt: skip
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

if TYPE_CHECKING:
    from bertjax.config import PRESETS, BertConfig, preset
    from bertjax.model import (
        BertForPreTraining,
        BertForSequenceClassification,
        BertModel,
        BertOutput,
        ClassificationOutput,
        PreTrainingOutput,
    )
    from bertjax.modernbert import ModernBertModel
    from bertjax.pretrained import (
        Checkpoint,
        from_pretrained,
        init_model,
        load_tokenizer,
        open_checkpoint,
        save_pretrained,
    )


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'bertjax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertModel",
    "BertOutput",
    "Checkpoint",
    "ClassificationOutput",
    "ModernBertModel",
    "PreTrainingOutput",
    "UserError",
    "from_pretrained",
    "init_model",
    "load_tokenizer",
    "open_checkpoint",
    "preset",
    "save_pretrained",
]
