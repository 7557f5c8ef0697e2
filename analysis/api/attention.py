"""Clark et al. 2019 as a call: `clark` (`python -m analysis.clark`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from analysis.api.common import (
    Checkpoint,
    Output,
    TablesResult,
    check_given,
    collect_garbage,
    loaded,
)
from analysis.attention import pipeline
from analysis.attention.options import DEFAULT_OUT
from analysis.attention.pipeline import ANALYSES, ClarkConfig
from bertjax import pretrained
from bertjax.pretrained import open_checkpoint
from bertjax.settings import from_kwargs, with_settings


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
    config = from_kwargs(ClarkConfig, settings, skip=("ckpt",), ckpt=str(ckpt))
    # Only named analyses make a missing MLM head or GAP an error; all of them (the default) skip it.
    return dataclasses.replace(config, analyses_explicit=config.analyses != ANALYSES)


@with_settings(ClarkConfig, skip=("ckpt",))
def clark(ckpt: str, *, model=None, tokenizer=None, out: str | Path | None = None, **settings) -> ClarkResult:
    """`python -m analysis.clark --ckpt CKPT ...` as a call: attention to special tokens and
    neighbours, head clusters, gradients, dependency heads, probes and coreference heads.

    Keyword arguments are the flags (see `ClarkConfig`: step, analyses, data_dir, inputs,
    glue_dir, split, n, max_length, batch_size, cluster_n, gradient_n, ewt_n, gap_n, first_piece,
    coref_target, coref_mentions, min_count, probe_train_n, probe_epochs, probe_learning_rate, seed,
    surface_weighting, attention, baseline_offsets, all_relations_include_root, word_text, segment_ids,
    overwrite, figure_format, allow_nonfinite). `model`/`tokenizer`: CKPT already loaded (a
    `BertForPreTraining` when the gradients run, else a `BertModel`)."""
    collect_garbage()
    config = clark_config(ckpt, settings | {"out": DEFAULT_OUT if out is None else str(out)})
    source = open_checkpoint(config.ckpt, config.step)
    if model is None:
        checkpoint = Checkpoint(source, pipeline.model_class(config, source), allow_nonfinite=config.allow_nonfinite)
        ((model, kept_tokenizer),) = loaded([checkpoint])
        tokenizer = kept_tokenizer if tokenizer is None else tokenizer
    else:
        check_given(model, source, config.ckpt, config.allow_nonfinite)
    if out is None:  # held in memory: nothing is written
        return ClarkResult.of(pipeline.compute(config, source, model, tokenizer))
    return run_clark(config, model, tokenizer, source)


def run_clark(
    config: ClarkConfig, model=None, tokenizer=None, source: pretrained.Checkpoint | None = None
) -> ClarkResult:
    """The clark run of `config` written into its --out (what `python -m analysis.clark` calls);
    `source`: `config.ckpt` already opened."""
    source = open_checkpoint(config.ckpt, config.step) if source is None else source
    run, info = pipeline.run(config, source, model, tokenizer)
    return ClarkResult.of(run, info, Path(config.out).expanduser())
