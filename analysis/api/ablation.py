"""Kovaleva et al. and Michel et al. 2019 as tools: their `Analysis` (`ABLATE`, `PRUNE`, whose rows
in `analysis.tools` make `python -m analysis.ablate|prune` and the calls `analysis.api.ablate|prune`)
and their results."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.ablation import kovaleva, michel
from analysis.ablation.kovaleva import KovalevaConfig
from analysis.ablation.michel import MichelConfig
from analysis.api.common import (
    Checkpoint,
    Output,
    TablesAnalysis,
    TablesResult,
    check_given,
    loaded,
)
from analysis.tools import Analysis, execute
from bertjax.pretrained import load_tokenizer, open_checkpoint
from bertjax.settings import from_kwargs

# Both load the checkpoint as the classifier they evaluate. The classifier class loads fine-tuned
# runs and pre-trained encoders alike: a missing classifier is initialised and unused by ablate's
# patterns and features, which read attention only; disabling, masking and pruning read the
# classifier's accuracy, so they need a trained one (`trained_heads`).
CLASSIFIER = "BertForSequenceClassification"


@dataclasses.dataclass(eq=False)
class AblateResult(TablesResult):
    """`ablate(...)`: `tables` holds the CSVs the analyses write (per task `<task>_patterns`,
    `_features`, `_disable_heads`, `_disable_layers`, `_mask_one_head`, `_best_head_only`, and
    `pattern_shares`); `settings` is the KovalevaConfig, `info` run.json (as written, or as it
    would be: its `figures` are those written; `info["tasks"]`: the baselines, the counts of
    significant changes, the forward passes), `run` the computed run the writer writes."""

    tables: dict[str, pd.DataFrame]
    settings: KovalevaConfig
    info: dict
    run: kovaleva.KovalevaRun = dataclasses.field(repr=False)
    written: Path | None = dataclasses.field(default=None, repr=False)
    output: Output | None = dataclasses.field(default=None, repr=False)
    kind = "ablate"
    writer = staticmethod(kovaleva.write)
    output_kind = kovaleva.ABLATE_OUTPUT


@dataclasses.dataclass(eq=False)
class PruneResult(TablesResult):
    """`prune(...)`: `tables` holds pruning.csv (the curves), `<task>_importance`,
    `<task>_pruning_order` and `<task>_pruning_random_seeds`; `settings` is the MichelConfig,
    `info` run.json (as written, or as it would be: its `figures` are those written;
    `info["result"]`: the heads prunable within one point, the passes), `run` the computed run
    the writer writes."""

    tables: dict[str, pd.DataFrame]
    settings: MichelConfig
    info: dict
    run: michel.MichelRun = dataclasses.field(repr=False)
    written: Path | None = dataclasses.field(default=None, repr=False)
    output: Output | None = dataclasses.field(default=None, repr=False)
    kind = "prune"
    writer = staticmethod(michel.write)
    output_kind = michel.PRUNE_OUTPUT

    @property
    def curve(self):
        """pruning.csv: the metric after each pruning step, by importance and at random."""
        return self.tables["pruning"]


def ablate_config(ckpt: str, settings: dict) -> KovalevaConfig:
    """A KovalevaConfig from keyword arguments named as the flags (`analyses`: the flag's
    comma-separated text or a list); KovalevaConfig checks them as it does the flags' values."""
    return from_kwargs(KovalevaConfig, settings, ckpt=str(ckpt))


def prune_config(ckpt: str, settings: dict) -> MichelConfig:
    """A MichelConfig from keyword arguments named as the flags; it checks them as the flags'."""
    return from_kwargs(MichelConfig, settings, ckpt=str(ckpt))


def ablate_sources(config: KovalevaConfig) -> kovaleva.Sources:
    """`--ckpt` opened, and `--compare-ckpt` where the features are compared with it."""
    compared = config.compare_ckpt if kovaleva.compares(config) else None
    compare = None if compared is None else open_checkpoint(compared, config.compare_step)
    return kovaleva.Sources(open_checkpoint(config.ckpt, config.step), compare)


class Ablate(TablesAnalysis):
    """Attention patterns and features, and the classifier with heads and layers disabled or
    masked (Kovaleva et al. 2019; Michel et al. 2019 §3). `model`/`tokenizer`: CKPT already loaded
    (a BertForSequenceClassification); otherwise the checkpoints the last call loaded (CKPT's, and
    `compare_ckpt`'s where the features are compared), while their files are unchanged."""

    output_kind = kovaleva.ABLATE_OUTPUT
    result = AblateResult
    run = staticmethod(kovaleva.compute)

    def load(self, config: KovalevaConfig, model: Any, tokenizer: Any) -> tuple:
        sources = ablate_sources(config)
        checkpoints = []
        if model is None:
            trained = kovaleva.trained_heads(config)
            checkpoints.append(Checkpoint(sources.checkpoint, CLASSIFIER, trained, config.allow_nonfinite))
        else:
            check_given(model, sources.checkpoint, config.ckpt, config.allow_nonfinite)
        if sources.compare is not None:
            checkpoints.append(Checkpoint(sources.compare, CLASSIFIER, allow_nonfinite=config.allow_nonfinite))
        models = loaded(checkpoints)
        if model is None:
            (model, kept_tokenizer), *models = models
            tokenizer = kept_tokenizer if tokenizer is None else tokenizer
        tokenizer = load_tokenizer(sources.checkpoint) if tokenizer is None else tokenizer
        return sources, model, tokenizer, models[0] if models else None


class Prune(TablesAnalysis):
    """Head importance and the pruning curves against random orders (Michel et al. 2019 §4).
    `model`/`tokenizer`: CKPT already loaded (a BertForSequenceClassification); otherwise the
    checkpoint the last call loaded, while its files are unchanged."""

    output_kind = michel.PRUNE_OUTPUT
    result = PruneResult
    run = staticmethod(michel.compute)

    def load(self, config: MichelConfig, model: Any, tokenizer: Any) -> tuple:
        source = open_checkpoint(config.ckpt, config.step)
        if model is None:
            ((model, kept_tokenizer),) = loaded([Checkpoint(source, CLASSIFIER, True, config.allow_nonfinite)])
            tokenizer = kept_tokenizer if tokenizer is None else tokenizer
        else:
            check_given(model, source, config.ckpt, config.allow_nonfinite)
        return source, model, load_tokenizer(source) if tokenizer is None else tokenizer


ABLATE: Analysis = Ablate()
PRUNE: Analysis = Prune()


def run_ablate(config: KovalevaConfig, model: Any = None, tokenizer: Any = None) -> AblateResult | None:
    """The ablate run of `config` written into its --out, as `python -m analysis.ablate` runs it
    (`analysis.tools.execute`); None in a process of a distributed job that does not write."""
    return execute(ABLATE, config, model=model, tokenizer=tokenizer)


def run_prune(config: MichelConfig, model: Any = None, tokenizer: Any = None) -> PruneResult | None:
    """The prune run of `config` written into its --out, as `python -m analysis.prune` runs it
    (`analysis.tools.execute`); None in a process of a distributed job that does not write."""
    return execute(PRUNE, config, model=model, tokenizer=tokenizer)
