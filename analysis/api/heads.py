"""The heads analyses as calls (Pande et al. 2021): `roles`, `track`, `finetune_effect`, `report`
and `head_view`; the results of roles and track show the report's role grid and head cards inline.
Roles, track, finetune_effect and report are `analysis.tools.Analysis` (`ROLES`, `TRACK`,
`FINETUNE_EFFECT`, `REPORT`): their calls are `analysis.tools.api_function`'s, their commands
`analysis.tools.execute`'s."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pandas as pd

from analysis.api.common import (
    Checkpoint,
    FigureFile,
    HeldResult,
    Output,
    check_given,
    check_given_finite,
    check_model,
    collect_garbage,
    drawn,
    frame,
    loaded,
    save_with,
    tables_html,
    unwritten_info,
)
from analysis.common.figures import figure_formats
from analysis.common.flags import FIGURE_FORMATS, select_figures, select_formats
from analysis.heads import finetuning, pipeline, seeds, tracking
from analysis.heads import head_view as head_view_lib
from analysis.heads.config import (
    EFFECT_FIGURES,
    EFFECT_SECTIONS,
    EFFECT_TOOL,
    ROLES_FIGURES,
    ROLES_SECTIONS,
    ROLES_TOOL,
    SEEDS_CSV,
    TRACK_CSV,
    TRACK_FIGURES,
    TRACK_SECTIONS,
    TRACK_TOOL,
    RolesConfig,
    TrackConfig,
)
from analysis.heads.figures import about_line, figure_jobs
from analysis.heads.report import (
    NOT_SAVED,
    ReportConfig,
    ReportPage,
    Run,
    held_run,
    readable_checkpoint,
    report_data,
)
from analysis.heads.report_page import render
from analysis.tools import execute
from bertjax import pretrained, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import open_checkpoint
from bertjax.settings import Section, fits, flag_fields, from_kwargs

# The height of an inline page: the grid and a card with an example of up to ~40 tokens.
FRAME_HEIGHT = 900


def roles_config(
    ckpt: str, settings: dict, tool: dict = ROLES_TOOL, sections: Sequence[Section] = ROLES_SECTIONS
) -> RolesConfig:
    """A RolesConfig from keyword arguments named as the flags, with the tool's defaults and
    sections (`analysis.heads.config`: ROLES_TOOL and ROLES_SECTIONS, TRACK_..., EFFECT_...);
    RolesConfig checks them as it does the flags' values."""
    return from_kwargs(RolesConfig, settings, tool, sections, ckpt=str(ckpt))


class _Result(HeldResult):
    """A roles or track result: shown inline as the report's page."""

    examples: int = 4

    def report_run(self) -> Run:
        """The result as the report reads a run, from memory (its header names the folder it was
        written to, or its checkpoint)."""
        raise NotImplementedError

    def report_html(self, examples: int | None = None) -> str:
        """The page `python -m analysis.report` writes for these outputs, built from memory: no
        file or folder is created for it (a roles run's checkpoint and data files are read again
        for the example attention it shows, as the command's page reads them)."""
        config = ReportConfig(str(self.written or ""), self.examples if examples is None else examples)
        return render(report_data(self.report_run(), config))

    def _repr_html_(self) -> str:
        if not hasattr(self, "_page"):
            self._page = self.report_html()
        return frame(self._page, FRAME_HEIGHT)


@dataclasses.dataclass(eq=False)
class RolesResult(_Result):
    """`roles(...)`: `table` is roles.csv, `summary` summary.csv, `scores[task][role]` the
    per-sequence β [n, layers, heads] of scores.npz (`indices[task][role]`: their example
    indices), `settings` the RolesConfig, `info` run.json (as written, or as it would be: its
    `figures` are those written), `run` the computed run the writer writes."""

    table: pd.DataFrame
    summary: pd.DataFrame
    scores: dict[str, dict[str, np.ndarray]]
    indices: dict[str, dict[str, np.ndarray]]
    settings: RolesConfig
    info: dict
    run: pipeline.RolesRun = dataclasses.field(repr=False)
    written: Path | None = dataclasses.field(default=None, repr=False)
    output: Output | None = dataclasses.field(default=None, repr=False)
    kind = "roles"

    @classmethod
    def of(cls, run: pipeline.RolesRun, info: dict | None = None, directory: Path | None = None) -> RolesResult:
        """The result of `run`; `info`: the run.json written into `directory`, if it was written."""
        if info is None:
            info = unwritten_info(run.info, run.timings)
        return cls(run.table, run.summary, {t: r.scores for t, r in run.results.items()},
                   {t: r.indices for t, r in run.results.items()}, run.config, info, run, directory)  # fmt: skip

    def report_run(self) -> Run:
        readings = {reading.name: reading.table for reading in self.run.readings}
        return held_run("roles", self.table, self.info, self.settings, self.written, readings=readings)

    def _write(self, out: Path, overwrite: bool) -> None:
        config = dataclasses.replace(self.run.config, out=str(out))
        held = dataclasses.replace(self, run=dataclasses.replace(self.run, config=config))
        save_with(ROLES, held, dataclasses.replace(config, overwrite=overwrite))
        if config.html:
            pipeline.write_html(str(out))

    def figure(self, kind: str = "role_grid", task: str | None = None) -> list[FigureFile]:
        """The figures of `kind` (one of ROLES_FIGURES) for `task` (default: the first), drawn into
        the directory if the run did not draw them there (`figures=`), or held in memory when the
        result was written nowhere."""
        if kind not in ROLES_FIGURES:
            raise UserError(f"--figures: unknown figure {kind!r} (choose from {', '.join(ROLES_FIGURES)})")
        task = task or str(self.table["task"].iloc[0])
        if task not in set(self.table["task"]):
            raise UserError(f"--task: {task!r} is not a task of this run ({', '.join(pd.unique(self.table['task']))})")
        if self.written is not None and (paths := sorted(self.written.glob(f"{task}_{kind}*"))):
            return [FigureFile(p) for p in paths]

        def draw(folder: Path) -> list[Path]:
            scores = {(task, r): s for r, s in self.scores[task].items()}
            about = about_line(
                readable_checkpoint(self.settings.ckpt), self.run.results[task].n_sequences, self.run.tau
            )
            ((draw_one, args),) = figure_jobs(self.table[self.table["task"] == task], scores, folder, tau=self.run.tau,
                                              alpha=self.settings.alpha, coarse=pipeline.COARSE, kinds=(kind,),
                                              about={task: about})  # fmt: skip
            return draw_one(*args)

        return drawn(draw, self.written)


@dataclasses.dataclass(eq=False)
class TrackResult(_Result):
    """`track(...)`: `table` is track.csv, `onset` onset.csv, `scores[step][task][role]` the
    per-sequence β of each checkpoint (held in memory, or read from the scores cache), `settings`
    the TrackConfig, `info` run.json (as written, or as it would be: its `figures` are those
    written, its `scores_cache` names the entries once they are written), `run` the computed run
    the writer writes."""

    table: pd.DataFrame
    onset: pd.DataFrame
    settings: TrackConfig
    info: dict
    run: tracking.TrackRun = dataclasses.field(repr=False)
    written: Path | None = dataclasses.field(default=None, repr=False)
    output: Output | None = dataclasses.field(default=None, repr=False)
    kind = "track"

    @classmethod
    def of(cls, run: tracking.TrackRun, info: dict | None = None, directory: Path | None = None) -> TrackResult:
        """The result of `run`; `info`: the run.json written into `directory`, if it was written."""
        info = unwritten_info(run.info, run.timings) if info is None else info
        return cls(run.track, run.onsets, run.config, info, run, directory)

    def report_run(self) -> Run:
        # What the writer puts in EXAMPLES_JSON (by step as text, as JSON has it), none when empty.
        recorded = {str(s): self.run.examples[s] for s in self.run.taus if self.run.examples.get(s) is not None}
        return held_run("track", self.table, self.info, self.settings.roles, self.written, recorded=recorded or None)

    def _write(self, out: Path, overwrite: bool) -> None:
        """As `--out` would have it; scores held in memory go into the scores cache `--out` would
        have had (`<out>.cache`), and run.json names them there."""
        target = Path(out).expanduser().resolve()
        cache = self.run.cache
        if self.run.held is not None:
            cache = target.parent / f"{target.name}.cache"
            tracking.prepare_cache(cache, target)
        roles = dataclasses.replace(self.run.config.roles, out=str(out))
        run = dataclasses.replace(self.run, config=dataclasses.replace(self.run.config, roles=roles), cache=cache)
        output = dataclasses.replace(run.config, roles=dataclasses.replace(roles, overwrite=overwrite))
        save_with(TRACK, dataclasses.replace(self, run=run), output)
        if roles.html:
            pipeline.write_html(str(out))

    @property
    def scores(self) -> dict[int, dict[str, dict[str, np.ndarray]]]:
        return {step: {task: r.scores for task, r in self.run.scores(step).items()} for step in self.run.taus}


@dataclasses.dataclass(eq=False)
class Report:
    """`report(...)`: the page written (`path`), shown inline in Jupyter."""

    path: Path

    def _repr_html_(self) -> str:
        return frame(self.path.read_text(encoding="utf-8"), FRAME_HEIGHT)


# -- the analyses -------------------------------------------------------------------------------


class _RunAnalysis:
    """What roles and finetune_effect share as `Analysis`: a module computing a run from the prepared
    objects (`compute(config, *prepared)`), writing it (`write`) and listing its figures' jobs
    (`draw_jobs`), and the result class holding the run (`of(run, info, out)`)."""

    module: Any
    result: Any

    def compute(self, config: Any, prepared: tuple) -> Any:
        return self.result.of(self.module.compute(config, *prepared))

    def write(self, result: Any, directory: Path) -> dict:
        return self.module.write(result.run, directory)

    def text(self, result: Any) -> str:
        return result.run.text()

    def figures(self, result: Any, directory: Path) -> list:
        return self.module.draw_jobs(result.run, directory)

    def written(self, result: Any, info: dict, out: Path) -> Any:
        return self.result.of(result.run, info, out)


class Roles(_RunAnalysis):
    """Which heads hold which roles: `roles(ckpt, ...)` is `python -m analysis.roles --ckpt CKPT ...`
    as a call. Keyword arguments are the flags (see `RolesConfig`); `model`/`tokenizer`: CKPT
    already loaded; `parser`: a parser object to use instead of spaCy (anything with
    `parse(texts)`, `name` and `version`), or the flag's value (`"conllu"`, `"spacy"`)."""

    output_kind = pipeline.ROLES_OUTPUT
    module = pipeline
    result = RolesResult

    def arguments(
        self, named: dict[str, Any], settings: dict[str, Any], given: dict[str, Any]
    ) -> tuple[RolesConfig, dict]:
        """A call's settings and what it hands to `prepare`: its checkpoint opened, and loaded
        unless given (kept for the next call, `loaded`), a model given checked against it."""
        if isinstance(given.get("parser"), str):  # the flag's value; taken for a parser object, it was ignored
            settings, given = settings | {"parser": given["parser"]}, given | {"parser": None}
        collect_garbage()
        config = roles_config(named["ckpt"], settings)
        source = open_checkpoint(config.ckpt, config.step)
        model, tokenizer = given.get("model"), given.get("tokenizer")
        if model is None:
            ((model, kept_tokenizer),) = loaded([Checkpoint(source, allow_nonfinite=config.allow_nonfinite)])
            tokenizer = kept_tokenizer if tokenizer is None else tokenizer
        else:
            check_given(model, source, config.ckpt, config.allow_nonfinite)
        return config, given | {"source": source, "model": model, "tokenizer": tokenizer}

    def prepare(self, config: RolesConfig, source: pretrained.Checkpoint | None = None, parser=None, model=None,
                tokenizer=None) -> tuple:  # fmt: skip
        # Flag mistakes are refused before the checkpoint is opened (a hub id's lookup takes seconds).
        select_figures(config.figures, ROLES_FIGURES), select_formats(config.figure_format)
        return open_checkpoint(config.ckpt, config.step) if source is None else source, parser, model, tokenizer


ROLES = Roles()


def run_roles(
    config: RolesConfig, model=None, tokenizer=None, parser=None, source: pretrained.Checkpoint | None = None
) -> RolesResult | None:
    """The roles run of `config` written into `config.out`, as `python -m analysis.roles` runs it
    (the `--html` page is the caller's); None in a process of a multi-process job other than the
    first, which writes nothing. `source`: `config.ckpt` already opened."""
    return execute(ROLES, config, source=source, parser=parser, model=model, tokenizer=tokenizer)


class Track:
    """Head roles along a series of checkpoints: `track(run=WORKDIR | ckpt=[SRC[@LABEL], ...], ...)`
    is `python -m analysis.track --run WORKDIR | --ckpt SRC[@LABEL] ...` as a call. `ckpt` is one
    source or a list (each `SOURCE[@LABEL]`); `steps` a list or the flag's comma-separated text;
    `shard` the flag's "I/N". The other keyword arguments are the flags of `TrackConfig` and the
    data, test and output flags, as for `roles`. Without `out` the scores are held in memory (or
    kept in `scores_cache`, where given) and nothing else is written; a shard scores into the
    scores cache only, and writes nothing into `out`."""

    output_kind = tracking.TRACK_OUTPUT

    def arguments(
        self, named: dict[str, Any], settings: dict[str, Any], given: dict[str, Any]
    ) -> tuple[TrackConfig, dict]:
        """A call's settings (the series: `run` or `ckpt`, which are no settings) and what it hands
        to `prepare`: whether the scores are held in memory, and the progress lines' `say`."""
        run, ckpt = given.get("run"), given.get("ckpt") or ()
        if (run is None) == (not ckpt):
            raise UserError("one of the arguments --run --ckpt is required (and not both)")
        if not (isinstance(ckpt, (str, Path)) or (isinstance(ckpt, (list, tuple)) and all(isinstance(c, (str, Path)) for c in ckpt))):  # fmt: skip
            raise UserError(f"ckpt: expected a checkpoint source or a list of them, got {ckpt!r}"[:300])
        series = (str(ckpt),) if isinstance(ckpt, (str, Path)) else tuple(str(c) for c in ckpt)
        steps, shard = settings.get("steps"), settings.get("shard")
        if steps is not None and not isinstance(steps, str) and not fits(steps, tuple[int, ...]):
            raise UserError(
                f"steps: expected a list of integers or the flag's comma-separated text, got {steps!r}"[:300]
            )
        if shard is not None and not isinstance(shard, str):
            raise UserError(f"shard: expected the flag's text 'I/N' (e.g. '0/2'), got {shard!r}"[:300])
        collect_garbage()
        own = {f.name for f in flag_fields(TrackConfig)}
        roles = roles_config(
            str(run or ""), {k: v for k, v in settings.items() if k not in own}, TRACK_TOOL, TRACK_SECTIONS
        )
        config = from_kwargs(TrackConfig, {k: v for k, v in settings.items() if k in own}, roles=roles, series=series)
        writes = "out" in settings
        if not writes and config.shard is not None and config.scores_cache is None:
            raise UserError("shard: a shard scores into the scores cache only; give it scores_cache")
        # A call that writes nothing says nothing: its result shows itself.
        held = not writes and config.shard is None
        return config, {"held": held and config.scores_cache is None, "say": tracking.quiet if held else print}

    def prepare(self, config: TrackConfig, held: bool = False, say: Any = print) -> tuple:
        """The series' checks, its members and the settings fitted to them (`tracking.prepare`),
        and the scores cache made ready (None: `held`, the scores kept in memory)."""
        if config.shard is not None and config.roles.html:
            raise UserError("--html: a --shard job writes no outputs; give --html to the invocation without --shard")
        started = time.perf_counter()
        fitted, members = tracking.prepare(config)
        cache = None if held else fitted.cache_dir
        if cache is not None:
            tracking.prepare_cache(cache, Path(fitted.roles.out).expanduser().resolve())
        return fitted, members, cache, started, say

    def compute(self, config: TrackConfig, prepared: tuple) -> TrackResult | None:
        fitted, members, cache, started, say = prepared
        run = tracking.compute_members(fitted, members, cache, started, say)
        return None if run is None else TrackResult.of(run)

    def writes(self, config: TrackConfig) -> bool:
        return config.shard is None  # a shard scores into the cache only

    def replaces(self, target: Path) -> bool:
        return (target / TRACK_CSV).is_file()  # re-running into the same --out is the point of the cache

    def write(self, result: TrackResult, directory: Path) -> dict:
        assert result.run.cache is not None  # held scores get one when saved (`TrackResult._write`)
        return tracking.write(result.run, directory, result.run.cache)

    def text(self, result: TrackResult) -> str:
        return result.run.text()

    def figures(self, result: TrackResult, directory: Path) -> list:
        return []  # drawn by `write`, through the figure cache beside the scores

    def written(self, result: TrackResult, info: dict, out: Path) -> TrackResult:
        return TrackResult.of(result.run, info, out)


TRACK = Track()


def run_track(config: TrackConfig, say=print) -> TrackResult | None:
    """The track run of `config` written into its --out, as `python -m analysis.track` runs it
    (the `--html` page is the caller's); None for a `--shard` job and in a process other than the
    first, which write nothing into --out. `say` gets the progress lines."""
    return execute(TRACK, config, say=say)


def run_seeds(config: TrackConfig, workdirs: list[str], say=print) -> pd.DataFrame:
    """Several runs of one recipe (`--run` repeated): each tracked into `<out>/<its name>/` with the
    settings of `config`, then the across-seed summary (`analysis.heads.seeds`) into `<out>`. The
    whole of `<out>` is one output (`runinfo.atomic_out`, of its own kind): written into a temporary
    and moved in when complete, replacing only an earlier across-seed output. Each run's steps are
    cached under `<scores cache>/<its name>` (default `<out>.cache/<its name>`, beside `<out>`).
    `say` gets each run's lines and the summary's."""
    out = Path(config.roles.out).expanduser().resolve()
    resolved = [Path(w).expanduser().resolve() for w in workdirs]
    for i, path in enumerate(resolved):
        if path in resolved[:i]:
            raise UserError(f"--run {path} is given twice (as {workdirs[resolved.index(path)]} and {workdirs[i]}); "
                            "each seed's run once")  # fmt: skip
    names = [path.name for path in resolved]
    if len(set(names)) < len(names):
        names = [f"{i}-{name}" for i, name in enumerate(names)]
    caches = {name: config.cache_dir / name for name in names}
    if config.shard is not None or jax.process_index() != 0:
        # A shard (or a process other than the first) scores into the caches and writes no --out.
        for name, workdir in zip(names, workdirs, strict=True):
            _track_seed(config, workdir, out / name, caches[name], say)
        return pd.DataFrame()
    # Re-running into the same --out is the point of the caches: an earlier across-seed output may go.
    with runinfo.atomic_out(out, config.roles.overwrite or (out / SEEDS_CSV).is_file(), tracking.SEEDS_OUTPUT) as tmp:
        tracking.prepare_cache(config.cache_dir, out)  # the runs' caches are under it: not inside --out
        directories = {}
        for name, workdir in zip(names, workdirs, strict=True):
            _track_seed(config, workdir, out / name, caches[name], say, into=tmp / name)
            directories[name] = tmp / name
        table, tracks = seeds.summarize(directories)
        table.to_csv(tmp / SEEDS_CSV, index=False)
        if "onset" in select_figures(config.roles.figures, TRACK_FIGURES):
            with figure_formats(select_formats(config.roles.figure_format)):
                for task in pd.unique(next(iter(tracks.values()))["task"]):
                    seeds.plot_seeds(tracks, task, tmp, f"{task}_seeds")
    say(tracking.seeds_text(table, len(workdirs)))
    say(f"wrote {out / SEEDS_CSV}")
    return table


def _track_seed(config: TrackConfig, workdir: str, member_out: Path, cache: Path, say,
                into: Path | None = None) -> None:  # fmt: skip
    """One seed's run tracked as `member_out` (written into `into`, if given: `execute`)."""
    say(f"track: run {workdir} → {member_out}")
    roles = dataclasses.replace(config.roles, ckpt=workdir, out=str(member_out))
    done = execute(TRACK, dataclasses.replace(config, roles=roles, scores_cache=str(cache)), into=into, say=say)
    if done is not None:
        say(done.run.text())


@dataclasses.dataclass(eq=False)
class FinetuneEffectResult(HeldResult):
    """`finetune_effect(...)`: `tables` holds beta_change.csv, head_means.csv and
    attention_similarity.csv; `settings` is the EffectConfig, `info` run.json (as written, or as it
    would be: its `figures` are those written), `run` the computed run the writer writes."""

    tables: dict[str, pd.DataFrame]
    settings: finetuning.EffectConfig
    info: dict
    run: finetuning.EffectRun = dataclasses.field(repr=False)
    written: Path | None = dataclasses.field(default=None, repr=False)
    output: Output | None = dataclasses.field(default=None, repr=False)
    kind = "finetune_effect"

    @classmethod
    def of(cls, run: finetuning.EffectRun, info: dict | None = None, directory: Path | None = None):
        """The result of `run`; `info`: the run.json written into `directory`, if it was written."""
        info = unwritten_info(run.info, run.timings) if info is None else info
        return cls(run.tables, run.config, info, run, directory)

    def _write(self, out: Path, overwrite: bool) -> None:
        data = dataclasses.replace(self.run.config.data, out=str(out))
        run = dataclasses.replace(self.run, config=dataclasses.replace(self.run.config, data=data))
        output = dataclasses.replace(run.config, data=dataclasses.replace(data, overwrite=overwrite))
        save_with(FINETUNE_EFFECT, dataclasses.replace(self, run=run), output)
        if data.html:
            pipeline.write_html(str(out))

    def figure_names(self) -> list[str]:
        """The figures of the run, by file name without its format: those written, or (a result
        written nowhere) those `figures=` asks for, drawn on demand."""
        if self.written is None:
            return list(select_figures(self.settings.data.figures, finetuning.FIGURES))
        return list(dict.fromkeys(Path(name).stem for name in self.info["figures"]))

    def figure(self, name: str = "beta_change") -> list[FigureFile]:
        """The figure `name` (one of FIGURES), drawn into the directory if the run did not draw it
        there (`figures=`), or held in memory when the result was written nowhere."""
        if name not in finetuning.FIGURES:
            raise UserError(f"--figures: unknown figure {name!r} (choose from {', '.join(finetuning.FIGURES)})")
        if self.written is not None:
            paths = [p for p in sorted(self.written.glob(f"{name}.*")) if p.suffix[1:] in FIGURE_FORMATS]
            if paths:
                return [FigureFile(p) for p in paths]

        def draw(folder: Path) -> list[Path]:
            with figure_formats(select_formats(self.settings.data.figure_format)):
                return finetuning.PLOTS[name](self.tables[name], folder, name)

        return drawn(draw, self.written)

    def _repr_html_(self) -> str:
        return tables_html(self, NOT_SAVED if self.written is None else str(self.written))


class FinetuneEffect(_RunAnalysis):
    """What fine-tuning does to the heads: `finetune_effect(pre, post, ...)` is `python -m
    analysis.finetune_effect --pre PRE --post CKPT[:TASK] ...` as a call, the change in mean β per
    coarse role and layer third, and the per-head cosine similarity of the attention before and
    after fine-tuning. `post` is one spec or a list; the other keyword arguments are the data and
    output flags. `model`/`tokenizer`: PRE already loaded; `post_models`: each post checkpoint
    already loaded, in the order of `post`."""

    output_kind = finetuning.EFFECT_OUTPUT
    module = finetuning
    result = FinetuneEffectResult

    def arguments(
        self, named: dict[str, Any], settings: dict[str, Any], given: dict[str, Any]
    ) -> tuple[finetuning.EffectConfig, dict]:
        """A call's settings and what it hands to `prepare`: the checkpoints opened, and loaded
        unless given (kept for the next call, `loaded`), the models given checked against them."""
        post = named["post"]
        specs = [str(post)] if isinstance(post, (str, Path)) else [str(p) for p in post]
        if not specs:
            raise UserError("post: give at least one fine-tuned checkpoint")
        collect_garbage()
        data = roles_config(str(named["pre"]), settings, EFFECT_TOOL, EFFECT_SECTIONS)
        config = finetuning.effect_config(specs, data)
        sources = effect_sources(config)
        model, tokenizer, post_models = given.get("model"), given.get("tokenizer"), given.get("post_models")
        if model is not None:
            check_given(model, sources[0], data.ckpt, data.allow_nonfinite)
        # A count that differs is the run's line.
        for post_model, post_config, source in zip(post_models or (), config.posts, sources[1:], strict=False):
            check_given(post_model, source, post_config.ckpt, data.allow_nonfinite)
        if model is None and post_models is None:
            checkpoints = [Checkpoint(s, allow_nonfinite=data.allow_nonfinite) for s in sources]
            (model, kept_tokenizer), *posts = loaded(checkpoints)
            tokenizer = kept_tokenizer if tokenizer is None else tokenizer
            post_models = [post_model for post_model, _ in posts]
        return config, {"sources": sources, "model": model, "tokenizer": tokenizer, "post_models": post_models}

    def prepare(self, config: finetuning.EffectConfig, sources: Sequence[pretrained.Checkpoint] | None = None,
                model=None, tokenizer=None, post_models: Sequence | None = None) -> tuple:  # fmt: skip
        select_figures(config.data.figures, EFFECT_FIGURES), select_formats(config.data.figure_format)  # as Roles
        return effect_sources(config) if sources is None else sources, model, tokenizer, post_models


FINETUNE_EFFECT = FinetuneEffect()


def effect_sources(config: finetuning.EffectConfig) -> list[pretrained.Checkpoint]:
    """The pre-trained checkpoint, then each post checkpoint, opened."""
    return [open_checkpoint(text) for text in (config.data.ckpt, *(p.ckpt for p in config.posts))]


def run_finetune_effect(
    config: finetuning.EffectConfig,
    model=None,
    tokenizer=None,
    post_models: Sequence | None = None,
    sources: Sequence[pretrained.Checkpoint] | None = None,
) -> FinetuneEffectResult | None:
    """The comparison of `config` written into its --out, as `python -m analysis.finetune_effect`
    runs it (the `--html` page is the caller's); None in a process of a multi-process job other
    than the first, which writes nothing. `sources`: `effect_sources(config)`, already opened."""
    return execute(FINETUNE_EFFECT, config, sources=sources, model=model, tokenizer=tokenizer, post_models=post_models)


# `report(run_dir, ...)`: the page as a `Report`, shown inline in Jupyter.
REPORT = ReportPage(Report)


def run_report(config: ReportConfig) -> Report:
    return execute(REPORT, config)


def head_view(
    model_or_ckpt,
    text: str | Sequence[str],
    *,
    layer: int,
    head: int,
    role: str = "local",
    tokenizer=None,
    **settings,
) -> HeadView:
    """One head's attention on `text` (a sentence, or a pair as two strings), as the report's head
    card draws it: the line view with `role`'s sieve marked from its first scored token, and the β
    of every role on this input. `model_or_ckpt`: a checkpoint source, or a loaded model with its
    `tokenizer`. Other keyword arguments are the sieve flags (window, special_rows,
    block_first_sep, max_length, spacy_model, cache_dir, allow_nonfinite: weights that are NaN or
    ±Inf are refused, as every analysis refuses them, unless allowed)."""
    head_view_settings = Section(RolesConfig, "head view", ("window", "special_rows", "block_first_sep",
                                                            "max_length", "spacy_model", "cache_dir", "allow_nonfinite"))  # fmt: skip
    given = not isinstance(model_or_ckpt, (str, Path))
    config = roles_config("the model given" if given else str(model_or_ckpt), settings, {}, (head_view_settings,))
    head_view_lib.check_request(text, layer, head, role)
    if given:
        check_model(model_or_ckpt, "model_or_ckpt")
        check_given_finite(model_or_ckpt, config.allow_nonfinite)
        model = model_or_ckpt
    else:  # kept for the next call, as the analyses keep theirs: a view is redrawn cell after cell
        source = open_checkpoint(config.ckpt)
        ((model, kept_tokenizer),) = loaded([Checkpoint(source, allow_nonfinite=config.allow_nonfinite)])
        tokenizer = kept_tokenizer if tokenizer is None else tokenizer
    page = head_view_lib.page_data(model, tokenizer, text, layer, head, role, config)
    return HeadView(render(page), page)


@dataclasses.dataclass(eq=False)
class HeadView:
    """`head_view(...)`: the page (`html`) and its data (`data`: tokens, attention, β per role)."""

    html: str
    data: dict

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Writes the page to `path` (an existing file is replaced only with `overwrite`)."""
        path = Path(path).expanduser()
        with runinfo.atomic_file(path, overwrite=overwrite) as f:
            f.write(self.html)
        return path

    def _repr_html_(self) -> str:
        tokens = len(self.data["examples"][head_view_lib.TASK]["sequences"][0]["tokens"])
        return frame(self.html, head_view_lib.frame_height(tokens))
