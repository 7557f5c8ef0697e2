"""The roles analysis end to end (`python -m analysis.roles`): load the checkpoint and the examples,
score, test, write `roles.csv`, `scores.npz`, `summary.csv`, the figures and `run.json` into a
temporary sibling of `--out` renamed when complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from analysis.common.examples import (
    data_file_hashes,
    encode_tasks,
    fit_max_length,
    load_tasks,
    make_parser,
    process_shares,
)
from analysis.common.figures import FigurePool, figure_formats, pool_size, select_figures, select_formats
from analysis.common.flags import attention_readings
from analysis.common.forward import Devices
from analysis.heads import readings as second_readings
from analysis.heads import summary
from analysis.heads.config import ROLES_FIGURES, RolesConfig, config_tasks
from analysis.heads.figures import about_line, figure_jobs
from analysis.heads.report import ReportConfig, readable_checkpoint, write_report
from analysis.heads.scoring import entropy_roles, gather_scores, make_scorer, score_arrays, score_readings, test_roles
from bertjax import distributed, runinfo
from bertjax.pretrained import from_pretrained, load_tokenizer, resolve
from sieves.builders import ROLES

log = logging.getLogger(__name__)


def run(config: RolesConfig, parser=None, model=None, tokenizer=None) -> pd.DataFrame:
    """The whole analysis; returns the roles table (also written under config.out).

    `parser`: anything with `parse(texts) -> list[Parse]`, `name` and `version` (default: spaCy,
    as `config` says), e.g. parses made elsewhere and shipped with the job. `model` and
    `tokenizer`: `config.ckpt` already loaded (a notebook's), used instead of loading it again.

    In a job of several processes (`--distributed`, or any caller that initialised
    `jax.distributed`) each process encodes and scores its share of every task's sequences, the
    scores are gathered, and process 0 alone tests them and writes `--out`."""
    distributed.initialize(config.distributed)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    tasks = config_tasks(config)
    kinds = select_figures(config.figures, ROLES_FIGURES)
    formats = select_formats(config.figure_format)
    writes = jax.process_index() == 0
    with (
        runinfo.atomic_out(config.out, config.overwrite) if writes else contextlib.nullcontext() as tmp,
        # Started before the model loads, so that the workers' imports overlap the loading.
        FigurePool(pool_size(len(tasks) * len(kinds)) if writes else 0) as pool,
        figure_formats(formats),
    ):
        return _run(config, tasks, tmp, timings, started, parser, pool, kinds, model, tokenizer)


def _run(
    config: RolesConfig,
    tasks: list[str],
    tmp: Path | None,
    timings: dict[str, float],
    started: float,
    parser,
    pool: FigurePool,
    kinds: tuple[str, ...],
    model,
    tokenizer,
) -> pd.DataFrame:
    clock = time.perf_counter()
    source = resolve(config.ckpt, config.step)
    if model is None:
        model = from_pretrained(config.ckpt, step=config.step, allow_nonfinite=config.allow_nonfinite)
    if tokenizer is None:
        tokenizer = load_tokenizer(config.ckpt, step=config.step)
    devices = Devices.local(config.devices)
    readings = attention_readings(config.attention)
    scorer = make_scorer(model, entropy_roles(config), devices, readings)
    timings["load_model"] = time.perf_counter() - clock
    config = fit_max_length(config, model.config.max_sequence_length)

    clock = time.perf_counter()
    data = load_tasks(config, tasks)
    data_files = data_file_hashes(data)
    timings["load_data"] = time.perf_counter() - clock
    if parser is None or config.parser != "spacy":
        parser = make_parser(config)
    sequences = encode_tasks(config, process_shares(data), tokenizer, parser, timings)
    with distributed.all_ok("scoring"):
        by_reading = score_readings(scorer, sequences, config, timings, readings)
    counts = {task: len(d.indices) for task, d in data.items()}
    # The first reading makes the usual files; `--attention both` adds the second's beside them.
    results, *others = (gather_scores(by_reading[reading], counts) for reading in readings)

    clock = time.perf_counter()
    table, tau = test_roles(results, config)
    if tmp is None:  # not process 0: its share is in process 0's output
        return table
    extra = {
        reading: second_readings.write(tmp, readings[0], table, reading, other, config)
        for reading, other in zip(readings[1:], others, strict=True)
    }
    table.to_csv(tmp / "roles.csv", index=False)
    np.savez(tmp / "scores.npz", **score_arrays(results))
    timings["tests_and_tables"] = time.perf_counter() - clock

    clock = time.perf_counter()
    coarse = {name: role.coarse for name, role in ROLES.items()}
    scores_by_key = {(t, r): s for t, res in results.items() for r, s in res.scores.items()}
    name = readable_checkpoint(config.ckpt)
    about = {t: about_line(name, r.n_sequences, tau) for t, r in results.items()}
    pool.submit(
        figure_jobs(table, scores_by_key, tmp, tau=tau, alpha=config.alpha, coarse=coarse, kinds=kinds, about=about)
    )
    figures = pool.results()
    timings["figures"] = time.perf_counter() - clock
    digest = summary.summarize(table, coarse=coarse)
    digest.to_csv(tmp / "summary.csv", index=False)
    timings["total"] = time.perf_counter() - started

    run_info = {
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
        "data_files": data_files,
        "figures": sorted(p.name for p in figures),
        **({"readings": extra} if extra else {}),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    runinfo.write_run_json(tmp, run_info)
    print(summary.format_summary(digest, {t: r.n_sequences for t, r in results.items()}))
    for written in extra.values():
        print(second_readings.format_counts(pd.read_csv(tmp / written["comparison"])))
    for task, result in results.items():
        if result.absent:
            print(f"{task}: roles not defined for these inputs (absent): {', '.join(result.absent)}")
    return table


def write_html(out: str) -> None:
    """`--html`: the report of the output just written (by process 0, the one that wrote it)."""
    if jax.process_index() == 0:
        write_report(ReportConfig(out))
