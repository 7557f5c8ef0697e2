"""bertjax: BERT in JAX/Flax for BERTology — the model, its configs and checkpoint conversion."""

from bertjax.config import PRESETS, BertConfig, preset
from bertjax.errors import UserError
from bertjax.model import (
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    BertOutput,
    ClassificationOutput,
    PreTrainingOutput,
)
from bertjax.pretrained import from_pretrained, init_model, load_tokenizer, save_pretrained

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertModel",
    "BertOutput",
    "ClassificationOutput",
    "PreTrainingOutput",
    "UserError",
    "from_pretrained",
    "init_model",
    "load_tokenizer",
    "preset",
    "save_pretrained",
]
