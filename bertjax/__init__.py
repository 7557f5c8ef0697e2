"""bertjax: BERT (and RoBERTa, ModernBERT) in JAX/Flax for BERTology — the models, their configs and
checkpoint conversion."""

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
from bertjax.modernbert import ModernBertModel
from bertjax.pretrained import from_pretrained, init_model, load_tokenizer, save_pretrained

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertModel",
    "BertOutput",
    "ClassificationOutput",
    "ModernBertModel",
    "PreTrainingOutput",
    "UserError",
    "from_pretrained",
    "init_model",
    "load_tokenizer",
    "preset",
    "save_pretrained",
]
