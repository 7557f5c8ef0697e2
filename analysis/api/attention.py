"""Clark et al. 2019 as a tool: its `Analysis` (`CLARK`, whose row in `analysis.tools` makes
`python -m analysis.clark` and the call `analysis.api.clark`) and its result."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.api.common import (
    Checkpoint,
    Output,
    TablesAnalysis,
    TablesResult,
    check_given,
    loaded,
)
from analysis.attention import pipeline
from analysis.attention.options import ClarkConfig, with_analyses_named
from analysis.tools import Analysis, execute
from bertjax.pretrained import load_tokenizer, open_checkpoint
from bertjax.settings import from_kwargs


@dataclasses.dataclass(eq=False)
class ClarkResult(TablesResult):
    """`clark(...)`: `tables` holds the CSVs the analyses write (surface, head_js_divergence,
    head_mds, gradient_importance, dependency_heads, probes, coref_heads, coref_best_per_layer,
    coref_baselines), each as its rows would be read back; `settings` is the ClarkConfig, `info`
    run.json (as written, or as it would be: its `figures` are those written; `info["results"]`:
    what was skipped and why, the relations beating their baseline, the best coreference head),
    `run` the computed run the writer writes."""

    tables: dict[str, pd.DataFrame]
    settings: ClarkConfig
    info: dict
    run: pipeline.ClarkRun = dataclasses.field(repr=False)
    written: Path | None = dataclasses.field(default=None, repr=False)
    output: Output | None = dataclasses.field(default=None, repr=False)
    kind = "clark"
    writer = staticmethod(pipeline.write)
    output_kind = pipeline.CLARK_OUTPUT

    @staticmethod
    def tables_of(run: pipeline.ClarkRun) -> dict[str, pd.DataFrame]:
        # An indexed table as its CSV reads back: the index (the heads' labels) a column.
        return {n: t.reset_index() if n in pipeline.INDEXED_TABLES else t for n, t in sorted(run.tables.items())}


def clark_config(ckpt: str, settings: dict) -> ClarkConfig:
    """A ClarkConfig from keyword arguments named as the flags (`analyses`: "all", the flag's
    comma-separated text or a list); ClarkConfig checks them as it does the flags' values."""
    return with_analyses_named(from_kwargs(ClarkConfig, settings, ckpt=str(ckpt)))


class Clark(TablesAnalysis):
    """Attention to special tokens and neighbours, head clusters, gradients, dependency heads,
    probes and coreference heads (Clark et al. 2019). `model`/`tokenizer`: CKPT already loaded (a
    `BertForPreTraining` when the gradients run, else a `BertModel`); otherwise the checkpoint the
    last call loaded, while its files are unchanged."""

    output_kind = pipeline.CLARK_OUTPUT
    result = ClarkResult
    indexed = pipeline.INDEXED_TABLES
    run = staticmethod(pipeline.compute)

    def load(self, config: ClarkConfig, model: Any, tokenizer: Any) -> tuple:
        source = open_checkpoint(config.ckpt, config.step)
        pipeline.prepare(config, source)  # its refusals, before anything is loaded
        if model is None:
            kind = pipeline.model_class(config, source)
            ((model, kept_tokenizer),) = loaded([Checkpoint(source, kind, allow_nonfinite=config.allow_nonfinite)])
            tokenizer = kept_tokenizer if tokenizer is None else tokenizer
        else:
            check_given(model, source, config.ckpt, config.allow_nonfinite)
        return source, model, load_tokenizer(source) if tokenizer is None else tokenizer


CLARK: Analysis = Clark()


def run_clark(config: ClarkConfig, model: Any = None, tokenizer: Any = None) -> ClarkResult | None:
    """The clark run of `config` written into its --out, as `python -m analysis.clark` runs it
    (`analysis.tools.execute`); None in a process of a distributed job that does not write."""
    return execute(CLARK, config, model=model, tokenizer=tokenizer)
