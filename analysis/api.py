"""The analyses as Python functions, for notebooks: one call each, mirroring the CLIs.

`roles(ckpt, task=..., n=...)`, `track(ckpt=[...])` and `report(run_dir)` take the flags of
`python -m analysis.roles`, `analysis.track` and `analysis.report` as keyword arguments with the
same names (`--max-length` is `max_length=`, `--no-special-rows` is `special_rows=False`,
`--no-figures` is `figures="none"`) and defaults, check them with the same checks, and raise the
CLI's one-line error as a `UserError`. They return a result holding the tables as DataFrames (the
rows of the CSVs), the per-sequence scores, the settings and run.json; in Jupyter a result shows
the report's role grid and head cards. `head_view` shows one head's attention on a sentence or pair
of one's own.

The entry points parse their flags into the same config and call `run_roles`, `run_track` and
`run_report` here, so a CLI run and a call are one code path. The one difference is `out`: a call
without `out=` writes into a temporary directory that lives as long as its result (`save(path)`
copies it), so that repeated calls in a kernel need no fresh directory each.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from analysis.heads import head_view as head_view_lib
from analysis.heads import pipeline, tracking
from analysis.heads.config import RolesConfig
from analysis.heads.figures import DEFAULT_ROLES_FIGURES, ROLES_FIGURES, figure_jobs
from analysis.heads.report import ReportConfig, read_run, report_data, write_report
from analysis.heads.report_page import render
from analysis.heads.series import checkpoint_identity, hf_identity
from bertjax import distributed, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import from_pretrained, load_tokenizer, resolve
from sieves.builders import DEFAULT_ROLES, ROLES

__all__ = [
    "HeadView", "Report", "RolesResult", "TrackResult", "UserError", "head_view", "report", "roles", "roles_config",
    "run_report", "run_roles", "run_track", "track",
]  # fmt: skip

# The flags of `analysis.roles` that `track` does not have (it scores with the published definitions).
ROLES_ONLY = ("step", "block_score", "block_first_sep", "syntactic_average")
# The height of an inline page: the grid and a card with an example of up to ~40 tokens.
FRAME_HEIGHT = 900


# The checkpoint the last call loaded, kept for the next call on the same files (a notebook re-runs
# a cell with other settings): loading again costs seconds, and each load's transient copies raise
# the process's peak memory anew, the allocator reusing the last load's freed memory piecemeal.
_LOADED: dict = {}


def _loaded(ckpt: str, step: int | None) -> tuple:
    """(model, tokenizer) of `ckpt`, loaded unless its files are the last call's."""
    source = resolve(ckpt, step)
    identity = hf_identity(source.path, 0) if source.kind == "hf" else checkpoint_identity(source.path, source.step)
    if _LOADED.get("identity") != identity:
        _LOADED.clear()
        _LOADED.update(model=from_pretrained(ckpt, step=step), tokenizer=load_tokenizer(ckpt, step=step))
        _LOADED["identity"] = identity
    return _LOADED["model"], _LOADED["tokenizer"]


def roles_config(ckpt: str, settings: dict, allowed: Sequence[str] | None = None) -> RolesConfig:
    """A RolesConfig from keyword arguments named as the flags; RolesConfig checks them as it does
    the flags' values."""
    fields = {f.name for f in dataclasses.fields(RolesConfig)} - {"ckpt"}
    unknown = sorted(set(settings) - set(fields if allowed is None else allowed))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    # Paths as the flags give them: text (run.json records them).
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    if allowed is None:  # roles: the CLI's default, the figure a reader looks at first
        settings.setdefault("figures", DEFAULT_ROLES_FIGURES)
    if isinstance(settings.get("roles"), str):  # the flag's form: comma-separated
        settings["roles"] = tuple(settings["roles"].split(",")) if settings["roles"] else DEFAULT_ROLES
    elif settings.get("roles") is not None:
        settings["roles"] = tuple(settings["roles"])
    else:
        settings.pop("roles", None)
    if "tau" in settings:
        settings["tau"] = str(settings["tau"])
    return RolesConfig(ckpt=str(ckpt), **settings)


class _Output:
    """An output directory: the one asked for, or a temporary one removed with its result."""

    def __init__(self, out: str | Path | None, kind: str):
        if out is None:
            self._tmp = tempfile.mkdtemp(prefix=f"bertjax-{kind}-")
            weakref.finalize(self, shutil.rmtree, self._tmp, True)
            self.path = Path(self._tmp) / kind
        else:
            self.path = Path(out).expanduser()


def _save(directory: Path, out: str | Path, overwrite: bool) -> Path:
    """Copies `directory` to `out` as the CLIs write: whole or not at all."""
    with runinfo.atomic_out(str(out), overwrite) as tmp:
        shutil.copytree(directory, tmp, dirs_exist_ok=True)
    return Path(out).expanduser()


def _run_json(directory: Path) -> dict:
    return json.loads((directory / "run.json").read_text())


def _frame(page: str, height: int) -> str:
    # An iframe keeps the page's script and style apart from the notebook's, in JupyterLab, the
    # classic notebook and a static HTML export alike; srcdoc keeps it offline.
    return (
        f'<iframe class="bertjax-report" srcdoc="{html.escape(page, quote=True)}" '
        f'style="width: 100%; height: {height}px; border: 1px solid #ddd;"></iframe>'
    )


class FigureFile:
    """A figure the analysis wrote; Jupyter shows it (PNG) inline."""

    def __init__(self, path: Path):
        self.path = path

    def _repr_png_(self) -> bytes | None:
        return self.path.read_bytes() if self.path.suffix == ".png" else None

    def __repr__(self) -> str:
        return f"FigureFile({str(self.path)!r})"


class _Result:
    """What the roles and track results share: the directory, its report and its figures."""

    directory: Path
    examples: int = 4

    def save(self, out: str | Path, overwrite: bool = False) -> Path:
        """Copies the outputs (CSVs, scores, figures, run.json) to `out`, as `--out` would have."""
        return _save(self.directory, out, overwrite)

    def report_html(self, examples: int | None = None) -> str:
        """The page `python -m analysis.report` writes for these outputs."""
        config = ReportConfig(str(self.directory), self.examples if examples is None else examples)
        return render(report_data(read_run(self.directory), config))

    def _repr_html_(self) -> str:
        if not hasattr(self, "_page"):
            self._page = self.report_html()
        return _frame(self._page, FRAME_HEIGHT)


@dataclasses.dataclass(eq=False)
class RolesResult(_Result):
    """`roles(...)`: `table` is roles.csv, `summary` summary.csv, `scores[task][role]` the
    per-sequence β [n, layers, heads] of scores.npz (`indices[task][role]`: their example
    indices), `settings` the RolesConfig, `info` run.json, `directory` where they are."""

    table: pd.DataFrame
    summary: pd.DataFrame
    scores: dict[str, dict[str, np.ndarray]]
    indices: dict[str, dict[str, np.ndarray]]
    settings: RolesConfig
    info: dict
    directory: Path
    output: _Output | None = dataclasses.field(default=None, repr=False)

    def figure(self, kind: str = "role_grid", task: str | None = None) -> list[FigureFile]:
        """The figures of `kind` (one of ROLES_FIGURES) for `task` (default: the first), drawn into
        the directory if the run did not draw them (`figures=`)."""
        if kind not in ROLES_FIGURES:
            raise UserError(f"--figures: unknown figure {kind!r} (choose from {', '.join(ROLES_FIGURES)})")
        task = task or str(self.table["task"].iloc[0])
        if task not in set(self.table["task"]):
            raise UserError(f"--task: {task!r} is not a task of this run ({', '.join(pd.unique(self.table['task']))})")
        paths = sorted(self.directory.glob(f"{task}_{kind}*"))
        if not paths:
            scores = {(task, r): s for r, s in self.scores[task].items()}
            coarse = {name: role.coarse for name, role in ROLES.items()}
            ((draw, args),) = figure_jobs(self.table[self.table["task"] == task], scores, self.directory,
                                          tau=self.info["tau"], alpha=self.settings.alpha, coarse=coarse, kinds=(kind,))  # fmt: skip
            paths = draw(*args)
        return [FigureFile(p) for p in paths]


@dataclasses.dataclass(eq=False)
class TrackResult(_Result):
    """`track(...)`: `table` is track.csv, `onset` onset.csv, `scores[step][task][role]` the
    per-sequence β of each checkpoint (from the scores cache), `settings` the TrackConfig, `info`
    run.json."""

    table: pd.DataFrame
    onset: pd.DataFrame
    settings: tracking.TrackConfig
    info: dict
    directory: Path
    output: _Output | None = dataclasses.field(default=None, repr=False)

    @property
    def scores(self) -> dict[int, dict[str, dict[str, np.ndarray]]]:
        return {
            int(step): {task: r.scores for task, r in tracking.load_scores(Path(path)).items()}
            for step, path in self.info["scores_cache"].items()
        }


@dataclasses.dataclass(eq=False)
class Report:
    """`report(...)`: the page written (`path`), shown inline in Jupyter."""

    path: Path

    def _repr_html_(self) -> str:
        return _frame(self.path.read_text(encoding="utf-8"), FRAME_HEIGHT)


# -- the analyses -------------------------------------------------------------------------------


def roles(
    ckpt: str, *, model=None, tokenizer=None, parser=None, out: str | Path | None = None, **settings
) -> RolesResult:
    """`python -m analysis.roles --ckpt CKPT ...` as a call: which heads hold which roles.

    Keyword arguments are the flags (see `RolesConfig`: task, glue_dir, split, n, max_length,
    batch_size, roles, window, special_rows, tau, alpha, test, correction, parser, spacy_model,
    conllu, cache_dir, overwrite, figures, figure_format, html, block_score, block_first_sep,
    syntactic_average, devices, distributed, step). `model`/`tokenizer`: CKPT already loaded.
    `parser`: a parser object to use instead of spaCy (as `pipeline.run` takes)."""
    output = _Output(out, "roles")
    config = roles_config(ckpt, settings | {"out": str(output.path)})
    if model is None and tokenizer is None:
        model, tokenizer = _loaded(config.ckpt, config.step)
    result = run_roles(config, model, tokenizer, parser)
    if result is not None:
        result.output = output
    return result


def run_roles(config: RolesConfig, model=None, tokenizer=None, parser=None) -> RolesResult | None:
    """The roles run of `config` (what `python -m analysis.roles` calls); None in a process of a
    multi-process job other than the first, which writes nothing."""
    table = pipeline.run(config, parser=parser, model=model, tokenizer=tokenizer)
    if jax.process_index() != 0:
        return None
    if config.html:
        pipeline.write_html(config.out)
    directory = Path(config.out).expanduser()
    scores: dict[str, dict[str, np.ndarray]] = {}
    indices: dict[str, dict[str, np.ndarray]] = {}
    with np.load(directory / "scores.npz") as stored:
        for key in stored.files:
            task, role, *index = key.split("/")
            (indices if index else scores).setdefault(task, {})[role] = stored[key]
    info = _run_json(directory)
    return RolesResult(table, pd.read_csv(directory / "summary.csv"), scores, indices,
                       dataclasses.replace(config, max_length=info["config"]["max_length"]), info, directory)  # fmt: skip


def track(
    *,
    run: str | None = None,
    ckpt: str | Sequence[str] = (),
    steps: str | Sequence[int] | None = None,
    with_init: bool = False,
    scores_cache: str | None = None,
    shard: str | None = None,
    sas: str | None = None,
    sas_n: int = 1000,
    out: str | Path | None = None,
    **settings,
) -> TrackResult | None:
    """`python -m analysis.track --run WORKDIR | --ckpt SRC[@LABEL] ...` as a call: the roles along
    a series of checkpoints. `ckpt` is one source or a list (each `SOURCE[@LABEL]`); `steps` a
    list or the flag's comma-separated text; `shard` the flag's "I/N". The other keyword
    arguments are the data, test and output flags, as for `roles`."""
    if (run is None) == (not ckpt):
        raise UserError("one of the arguments --run --ckpt is required (and not both)")
    series = (str(ckpt),) if isinstance(ckpt, (str, Path)) else tuple(str(c) for c in ckpt)
    if isinstance(steps, str):
        steps = tracking.parse_steps(steps)
    output = _Output(out, "track")
    fields = {f.name for f in dataclasses.fields(RolesConfig)} - {"ckpt", *ROLES_ONLY}
    config = tracking.TrackConfig(
        roles=roles_config(run or "", settings | {"out": str(output.path)}, fields),
        steps=None if steps is None else tuple(steps),
        scores_cache=None if scores_cache is None else str(scores_cache),
        series=series,
        with_init=with_init,
        shard=None if shard is None else distributed.parse_shard(shard),
        sas=None if sas is None else str(sas),
        sas_n=sas_n,
    )
    result = run_track(config)
    if result is not None:
        result.output = output
    return result


def run_track(config: tracking.TrackConfig) -> TrackResult | None:
    """The track run of `config` (what `python -m analysis.track` calls); None for a `--shard` job
    and in a process other than the first, which write nothing into --out."""
    if config.shard is not None and config.roles.html:
        raise UserError("--html: a --shard job writes no outputs; give --html to the invocation without --shard")
    table = tracking.run(config)
    if table is None or jax.process_index() != 0:
        return None
    if config.roles.html:
        pipeline.write_html(config.roles.out)
    directory = Path(config.roles.out).expanduser()
    return TrackResult(table, pd.read_csv(directory / "onset.csv"), config, _run_json(directory), directory)


def report(
    run_dir: str | Path, *, examples: int = 4, out: str | Path | None = None, coref: str | None = None
) -> Report:
    """`python -m analysis.report RUN_DIR` as a call: writes the page (default RUN_DIR/report.html)."""
    return run_report(ReportConfig(str(run_dir), examples, None if out is None else str(out), coref))


def run_report(config: ReportConfig) -> Report:
    return Report(write_report(config))


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
    block_first_sep, max_length, spacy_model, cache_dir)."""
    allowed = ("window", "special_rows", "block_first_sep", "max_length", "spacy_model", "cache_dir")
    name = model_or_ckpt if isinstance(model_or_ckpt, (str, Path)) else "the model given"
    config = roles_config(str(name), settings, allowed)
    page = head_view_lib.page_data(model_or_ckpt, tokenizer, text, layer, head, role, config)
    return HeadView(render(page), page)


@dataclasses.dataclass(eq=False)
class HeadView:
    """`head_view(...)`: the page (`html`) and its data (`data`: tokens, attention, β per role)."""

    html: str
    data: dict

    def save(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        path.write_text(self.html, encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        tokens = len(self.data["examples"][head_view_lib.TASK]["sequences"][0]["tokens"])
        return _frame(self.html, head_view_lib.frame_height(tokens))
