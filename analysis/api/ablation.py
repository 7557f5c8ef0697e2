"""Kovaleva et al. and Michel et al. 2019 as calls: `ablate` (`python -m analysis.ablate`) and
`prune` (`python -m analysis.prune`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from analysis.ablation import kovaleva, michel
from analysis.ablation.kovaleva import KovalevaConfig
from analysis.ablation.michel import MichelConfig
from analysis.api.common import (
    Checkpoint,
    Output,
    TablesResult,
    check_given,
    collect_garbage,
    loaded,
)
from bertjax import pretrained
from bertjax.pretrained import open_checkpoint
from bertjax.settings import from_kwargs, with_settings

# Both load the checkpoint as the classifier they evaluate (ablate's attention analyses read its encoder).
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
    return from_kwargs(KovalevaConfig, settings, skip=("ckpt",), ckpt=str(ckpt))


def prune_config(ckpt: str, settings: dict) -> MichelConfig:
    """A MichelConfig from keyword arguments named as the flags; it checks them as the flags'."""
    return from_kwargs(MichelConfig, settings, skip=("ckpt",), ckpt=str(ckpt))


@with_settings(KovalevaConfig, skip=("ckpt",))
def ablate(ckpt: str, *, model=None, tokenizer=None, out: str | Path | None = None, **settings) -> AblateResult:
    """`python -m analysis.ablate --ckpt CKPT ...` as a call: attention patterns and features, and
    the classifier with heads and layers disabled or masked.

    Keyword arguments are the flags (see `KovalevaConfig`: step, task, glue_dir, split, n,
    max_length, batch_size, analyses, alpha, compare_ckpt, compare_step, spacy_model, cache_dir,
    overwrite, figure_format, devices, allow_nonfinite). `model`/`tokenizer`: CKPT already
    loaded (a BertForSequenceClassification)."""
    collect_garbage()
    config = ablate_config(ckpt, settings if out is None else settings | {"out": str(out)})
    sources = ablate_sources(config)
    compare = None
    if model is None:
        checkpoints = [
            Checkpoint(sources.checkpoint, CLASSIFIER, kovaleva.trained_heads(config), config.allow_nonfinite)
        ]
        if sources.compare is not None:
            checkpoints.append(Checkpoint(sources.compare, CLASSIFIER, allow_nonfinite=config.allow_nonfinite))
        (model, kept_tokenizer), *others = loaded(checkpoints)
        tokenizer = kept_tokenizer if tokenizer is None else tokenizer
        compare = others[0] if others else None
    else:
        check_given(model, sources.checkpoint, config.ckpt, config.allow_nonfinite)
    if out is None:  # held in memory: nothing is written
        return AblateResult.of(kovaleva.compute(config, sources, model, tokenizer, compare))
    return run_ablate(config, model, tokenizer, compare, sources)


def ablate_sources(config: KovalevaConfig) -> kovaleva.Sources:
    """`--ckpt` opened, and `--compare-ckpt` where the features are compared with it."""
    compare = open_checkpoint(config.compare_ckpt, config.compare_step) if kovaleva.compares(config) else None
    return kovaleva.Sources(open_checkpoint(config.ckpt, config.step), compare)


def run_ablate(
    config: KovalevaConfig, model=None, tokenizer=None, compare=None, sources: kovaleva.Sources | None = None
) -> AblateResult:
    """The ablate run of `config` written into its --out (what `python -m analysis.ablate` calls);
    `compare`: (model, tokenizer) of `--compare-ckpt` already loaded; `sources`:
    `ablate_sources(config)`, already opened."""
    sources = ablate_sources(config) if sources is None else sources
    run, info = kovaleva.run(config, sources, model, tokenizer, compare)
    return AblateResult.of(run, info, Path(config.out).expanduser())


@with_settings(MichelConfig, skip=("ckpt",))
def prune(ckpt: str, *, model=None, tokenizer=None, out: str | Path | None = None, **settings) -> PruneResult:
    """`python -m analysis.prune --ckpt CKPT ...` as a call: head importance and the pruning
    curves against random orders.

    Keyword arguments are the flags (see `MichelConfig`: step, task, glue_dir, split, n,
    importance_split, importance_n, max_length, batch_size, metric, prune_step, reestimate,
    random_seeds, overwrite, figure_format, devices, allow_nonfinite). `model`/`tokenizer`: CKPT
    already loaded (a BertForSequenceClassification)."""
    collect_garbage()
    config = prune_config(ckpt, settings if out is None else settings | {"out": str(out)})
    source = open_checkpoint(config.ckpt, config.step)
    if model is None:
        ((model, kept_tokenizer),) = loaded([Checkpoint(source, CLASSIFIER, True, config.allow_nonfinite)])
        tokenizer = kept_tokenizer if tokenizer is None else tokenizer
    else:
        check_given(model, source, config.ckpt, config.allow_nonfinite)
    if out is None:  # held in memory: nothing is written
        return PruneResult.of(michel.compute(config, source, model, tokenizer))
    return run_prune(config, model, tokenizer, source)


def run_prune(
    config: MichelConfig, model=None, tokenizer=None, source: pretrained.Checkpoint | None = None
) -> PruneResult:
    """The prune run of `config` written into its --out (what `python -m analysis.prune` calls);
    `source`: `config.ckpt` already opened."""
    source = open_checkpoint(config.ckpt, config.step) if source is None else source
    run, info = michel.run(config, source, model, tokenizer)
    return PruneResult.of(run, info, Path(config.out).expanduser())
