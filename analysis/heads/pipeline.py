"""The roles analysis (`python -m analysis.roles`) as compute → result → writer: `compute` loads
the checkpoint and the examples, scores and tests, and returns a `RolesRun` held in memory;
`write` turns one into the tables and scores of `--out` (`roles.csv`, `scores.npz`, `summary.csv`)
and `draw_jobs` into its figures; the runner (`analysis.tools.execute`, through
`analysis.api.heads.Roles`) draws them and writes run.json, into a temporary sibling of `--out`
renamed when complete.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from analysis.common.examples import Inputs, encode_tasks, fit_max_length, prepare_inputs, process_shares
from analysis.common.flags import attention_readings, select_figures
from analysis.common.forward import Devices, at_precision
from analysis.heads import readings as second_readings
from analysis.heads import summary
from analysis.heads.config import ROLES_FIGURES, RolesConfig, config_tasks
from analysis.heads.figures import about_line, figure_jobs
from analysis.heads.report import ReportConfig, readable_checkpoint, write_report, wrote_line
from analysis.heads.scoring import (
    TaskScores,
    entropy_roles,
    gather_scores,
    make_scorer,
    reference_length,
    score_arrays,
    score_readings,
    test_roles,
)
from analysis.tools import FigureJob
from bertjax import distributed
from bertjax.pretrained import Checkpoint, from_pretrained, load_tokenizer
from sieves.builders import ROLES

log = logging.getLogger(__name__)

# What `.bertjax-output` says of this tool's `--out` (`runinfo.atomic_out`): only its kind is replaced.
ROLES_OUTPUT = "roles output"

COARSE = {name: role.coarse for name, role in ROLES.items()}


@dataclasses.dataclass(eq=False)
class RolesRun:
    """A roles run held in memory: `table` (roles.csv), `summary` (summary.csv), each task's
    per-sequence scores (`results`, scores.npz), τ, `info` (run.json's provenance and settings,
    without the figures and the environment, which the writer adds) and the timings of its
    stages. A run of `--attention both` holds its second reading in `readings`."""

    config: RolesConfig
    table: pd.DataFrame
    summary: pd.DataFrame
    results: dict[str, TaskScores]
    tau: float
    info: dict
    timings: dict[str, float]
    readings: list[second_readings.Reading] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        """What the CLI prints at the end of a run: the summary, and the roles no input defines."""
        lines = [summary.format_summary(self.summary, {t: r.n_sequences for t, r in self.results.items()})]
        for task, result in self.results.items():
            if result.absent:
                lines.append(f"{task}: roles not defined for these inputs (absent): {', '.join(result.absent)}")
        lines[1:1] = [second_readings.format_counts(r.comparison) for r in self.readings]
        return "\n".join(lines)


@at_precision()
def compute(config: RolesConfig, source: Checkpoint, parser=None, model=None, tokenizer=None) -> RolesRun:
    """The whole analysis of `source` (`config.ckpt` opened) in memory; writes nothing (the parse
    cache aside).

    `parser`: anything with `parse(texts) -> list[Parse]`, `name` and `version` (default: spaCy,
    as `config` says), e.g. parses made elsewhere and shipped with the job. `model` and
    `tokenizer`: `config.ckpt` already loaded (a notebook's), used instead of loading it again.

    In a job of several processes (`--distributed`, or any caller that initialised
    `jax.distributed`) each process encodes and scores its share of every task's sequences, and
    the scores are gathered: every process returns the whole run."""
    distributed.initialize(config.distributed)
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    if tokenizer is None:
        tokenizer = load_tokenizer(source, light=True)
    loading = time.perf_counter() - clock
    # The checkpoint's config.json (or step metadata) is all the length needs: the weights load
    # while the tasks are encoded.
    config = fit_max_length(config, (source.config if model is None else model.config).max_sequence_length)

    clock = time.perf_counter()
    inputs = prepare_inputs(config, config_tasks(config), parser)
    timings["load_data"] = time.perf_counter() - clock
    worker = ThreadPoolExecutor(1, thread_name_prefix="roles-encode")
    try:
        # Each task encoded in the worker's thread, one after another from now on: the model loads,
        # and each task is scored, while the next is encoded (parse-cache reads, tokenizing,
        # aligning: ~1 s of MiniLM's 4 tasks on a 2-core CPU, where a quiet run's scoring keeps
        # about one core busy).
        encoding = {
            task: worker.submit(encode_tasks, config, {task: data}, tokenizer, inputs.parser, {})
            for task, data in process_shares(inputs.data).items()
        }
        clock = time.perf_counter()
        if model is None:
            model = from_pretrained(source, allow_nonfinite=config.allow_nonfinite)
        devices = Devices.local(config.devices)
        readings = attention_readings(config.attention)
        scorer = make_scorer(model, entropy_roles(config), devices, readings, reference_length(config))
        timings["load_model"] = loading + time.perf_counter() - clock
        by_reading: dict[str, dict[str, TaskScores]] = {reading: {} for reading in readings}
        with distributed.all_ok("scoring"):
            for task, encoded in encoding.items():
                clock = time.perf_counter()
                (sequences,) = encoded.result().values()
                # What encoding the task adds to the run: the wait for it.
                timings[f"{task}/prepare"] = time.perf_counter() - clock
                scored = score_readings(scorer, {task: sequences}, config, timings, readings)
                for reading in readings:
                    by_reading[reading] |= scored[reading]
    finally:
        # A run stopped early (an error, Ctrl-C) does not wait for the tasks not yet begun.
        worker.shutdown(cancel_futures=True)
    # The first reading makes the usual files; `--attention both` adds the second's beside them.
    results, *others = (gather_scores(by_reading[reading], inputs.n_sequences) for reading in readings)

    clock = time.perf_counter()
    table, tau = test_roles(results, config)
    digest = summary.summarize(table, coarse=COARSE)
    second = [
        second_readings.compute(readings[0], table, reading, other, config)
        for reading, other in zip(readings[1:], others, strict=True)
    ]
    timings["tests_and_tables"] = time.perf_counter() - clock
    info = provenance(config, tau, source, model, devices, inputs, results)
    return RolesRun(config, table, digest, results, tau, info, timings, second)


def provenance(
    config: RolesConfig, tau: float, source: Checkpoint, model, devices: Devices, inputs: Inputs, results
) -> dict:
    """run.json's record of the run before its figures: settings, checkpoint, model, mesh, parser,
    what each task scored, the data files read."""
    parser = inputs.parser
    return {
        "config": dataclasses.asdict(config),
        "tau": tau,
        "checkpoint": source.describe(),
        "model_config": model.config.to_hf_dict(),
        "mesh": devices.record(),
        "processes": jax.process_count(),
        "parser": None if parser is None else {"name": parser.name, "version": parser.version},
        "tasks": {
            t: {
                "sequences": r.n_sequences,
                "n_by_role": {k: len(v) for k, v in r.scores.items()},
                "absent_roles": r.absent,
            }
            for t, r in results.items()
        },
        "data_files": inputs.data_files,
    }


def write(result: RolesRun, directory: Path) -> dict:
    """The one writer of a roles run's tables and scores (the CLI's and the API's) into
    `directory`; returns what run.json records of the run, its own stages' `timings_s` among them,
    for the runner to complete."""
    extra = {r.name: second_readings.write(directory, r) for r in result.readings}
    result.table.to_csv(directory / "roles.csv", index=False)
    # Numbers only: np.load reads it unpickled.
    np.savez(directory / "scores.npz", allow_pickle=False, **score_arrays(result.results))
    result.summary.to_csv(directory / "summary.csv", index=False)
    return result.info | {
        "config": dataclasses.asdict(result.config),  # its place kept: the run's, or a saved copy's `out`
        "figures": [],  # the runner's list, kept in its place before the readings
        **({"readings": extra} if extra else {}),
        "timings_s": result.timings,
    }


def draw_jobs(result: RolesRun, directory: Path) -> list[FigureJob]:
    """The figures `result.config` asks for, as jobs drawing into `directory`."""
    config = result.config
    scores_by_key = {(t, r): s for t, res in result.results.items() for r, s in res.scores.items()}
    name = readable_checkpoint(config.ckpt)
    about = {t: about_line(name, r.n_sequences, result.tau) for t, r in result.results.items()}
    kinds = select_figures(config.figures, ROLES_FIGURES)
    return figure_jobs(result.table, scores_by_key, directory, tau=result.tau, alpha=config.alpha, coarse=COARSE,
                       kinds=kinds, about=about)  # fmt: skip


def write_html(out: str) -> str | None:
    """`--html`: the report of the output just written (by process 0, the one that wrote it);
    returns the line a CLI prints (None in the other processes)."""
    if jax.process_index() == 0:
        return wrote_line(write_report(ReportConfig(out)))
    return None
