"""The tool contract: what an analysis implements (`Analysis`), the table of tools (`TOOLS`, one
`Tool` row each), and the one runner that makes a row its command line (`Command`, `main`) and its
Python call (`api_function`, exported by `analysis.api`).

A row names its parts as `"module:name"` texts, imported once the flags are parsed, so that a
command's `--help` and its flag errors wait for no JAX and no other analysis (tests/test_cli.py).
Adding an analysis is one module implementing `Analysis` and one row given to `register`
(docs/layout.md has an example); the rows below are bertjax's own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import inspect
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from bertjax import cli, settings

# A figure to draw: (function, arguments), as `analysis.common.figures.FigurePool` takes it.
FigureJob = tuple[Callable[..., list[Path]], tuple]


class Analysis(Protocol):
    """One analysis: `prepare` loads what `compute` reads (checkpoints, data), `compute` returns the
    result in memory, `write` writes its files into a directory and returns what run.json adds,
    `text` is what the command prints, `figures` the drawing jobs into a directory. The runner
    (`execute`) does the rest, the same for every analysis. Optional: `prepare` may take keyword
    arguments, the row's `given` (objects a Python call passes beside the settings, such as a model
    already loaded); a `config` and `timings_s` that `write` returns are the settings the run used
    and its own stages, recorded in run.json; `written(result, info, out)` is the result
    returned once written into `out` (`info`: run.json as written, without the environment); and
    `arguments(named, settings, given)` makes a Python call's settings and what `prepare` is handed,
    where the call takes more than the settings' fields (`api_function`); `writes(config)` says
    whether this process writes `config.out` at all (a track shard, which only fills a cache: it is
    computed as in the other processes of a job, and nothing is written); `replaces(target)` says
    whether an output of its kind at `target` is replaced without `overwrite` (re-running into the
    same `--out` is the point of track's scores cache); `figures` and `timings_s["figures"]` that
    `write` returns are figures it drew itself (through a figure cache), recorded beside the pool's.

    An analysis whose output is one file, not an `--out` folder (the report's page), says where
    in `file(config)`: the file's path, checked (refused in one line) before the work and again
    before it is replaced, and the output folder it goes into, if any, whose lock
    (`runinfo.exclusive`) is held from before `prepare` until the file is in place. Its `write`
    then gets the file, open, to write into (moved into place whole, `runinfo.atomic_file`); no
    figures and no run.json are written, and `written` gets no run.json (`{}`)."""

    output_kind: str  # what `.bertjax-output` names (`runinfo.atomic_out`): an output it may replace

    def prepare(self, config: Any) -> Any: ...

    def compute(self, config: Any, prepared: Any) -> Any: ...

    # `directory`: a Path; for an analysis whose output is one file (`file`), that file, open.
    def write(self, result: Any, directory: Any) -> dict: ...

    def text(self, result: Any) -> str: ...

    def figures(self, result: Any, directory: Path) -> Sequence[FigureJob]: ...


@dataclasses.dataclass(frozen=True)
class Tool:
    """A row of the table: `python -m analysis.<name>` and `analysis.api.<name>(...)`.

    `settings`: the typed settings class; its flags are `flags(parser, tool, takes)` where given
    (with `tool`, and `takes` as `settings.add_flags` takes `sections`: the sections of a shared
    settings class that this tool takes), else its fields' and `--config`.
    `analysis`: its `Analysis` (the runner computes and writes). `section`: the attribute of the
    settings holding `out`, `overwrite` and `html` (a tool whose settings nest the roles settings). `refuses`: the command refuses the mistakes that need no
    model (`refuse_early`) before it imports the analysis. `html`: it writes `--html`'s page.
    `wrote`: the last line printed, from the result's `path`, where it is not `wrote <out>`.
    `api` and `exports`: the module defining the row's result and other names `analysis.api`
    exports from it (its call is `api_function`'s). `given`: the keyword arguments of the call
    that are not settings (a model already loaded: `model`,
    `tokenizer`), None unless passed, which `execute` hands to `prepare` by name. `resolve`:
    settings → the settings run, applied to the parsed flags and to a call's keywords alike
    (what the flags' values imply, such as whether `--analyses` named the analyses). `schemas`:
    settings classes beside `settings` whose fields a call takes as keywords too (track's
    RolesConfig, nested in its TrackConfig as `roles`; its `arguments` makes the settings)."""

    name: str
    settings: str
    analysis: str
    flags: str | None = None
    tool: str | None = None
    takes: str | None = None
    section: str | None = None
    refuses: bool = True
    html: bool = False
    wrote: str | None = None
    api: str | None = None
    exports: tuple[str, ...] = ()
    positional: tuple[str, ...] = ("ckpt",)  # the settings an API call takes by position
    given: tuple[str, ...] = ()
    resolve: str | None = None
    schemas: tuple[str, ...] = ()


def load(spec: str) -> Any:
    """The object a `"module:name"` text names."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


_HEADS = "analysis.heads.config"
TOOLS: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    """Adds `tool` to the table (a package's own analysis included); a name is taken once."""
    if tool.name in TOOLS and TOOLS[tool.name] != tool:
        raise ValueError(f"a tool named {tool.name!r} is registered already")
    TOOLS[tool.name] = tool
    return tool


for _row in (
    Tool("roles", f"{_HEADS}:RolesConfig", analysis="analysis.api.heads:ROLES", flags=f"{_HEADS}:add_roles_flags",
         tool=f"{_HEADS}:ROLES_TOOL", takes=f"{_HEADS}:ROLES_SECTIONS", html=True, api="analysis.api.heads",
         exports=("RolesResult", "roles_config", "run_roles"), given=("model", "tokenizer", "parser")),
    Tool("track", f"{_HEADS}:TrackConfig", analysis="analysis.api.heads:TRACK", flags=f"{_HEADS}:add_roles_flags",
         tool=f"{_HEADS}:TRACK_TOOL", takes=f"{_HEADS}:TRACK_SECTIONS", section="roles", refuses=False, html=True,
         api="analysis.api.heads", exports=("TrackResult", "run_track"), positional=(),
         given=("run", "ckpt"), schemas=(f"{_HEADS}:RolesConfig",)),
    Tool("finetune_effect", f"{_HEADS}:RolesConfig", analysis="analysis.api.heads:FINETUNE_EFFECT",
         flags=f"{_HEADS}:add_roles_flags", tool=f"{_HEADS}:EFFECT_TOOL", takes=f"{_HEADS}:EFFECT_SECTIONS",
         section="data", refuses=False, html=True, api="analysis.api.heads",
         exports=("FinetuneEffectResult", "run_finetune_effect"), positional=("pre", "post"),
         given=("model", "tokenizer", "post_models")),
    Tool("report", f"{_HEADS}:ReportConfig", analysis="analysis.api.heads:REPORT", refuses=False,
         wrote="analysis.heads.report:wrote_line", api="analysis.api.heads", exports=("Report", "run_report"),
         positional=("run_dir",)),
    Tool("clark", "analysis.attention.options:ClarkConfig", analysis="analysis.api.attention:CLARK",
         api="analysis.api.attention", exports=("ClarkResult", "clark_config", "run_clark"),
         given=("model", "tokenizer"), resolve="analysis.attention.options:with_analyses_named"),
    Tool("ablate", "analysis.ablation.options:KovalevaConfig", analysis="analysis.api.ablation:ABLATE",
         api="analysis.api.ablation", exports=("AblateResult", "ablate_config", "run_ablate"),
         given=("model", "tokenizer")),
    Tool("prune", "analysis.ablation.options:MichelConfig", analysis="analysis.api.ablation:PRUNE",
         api="analysis.api.ablation", exports=("PruneResult", "prune_config", "run_prune"),
         given=("model", "tokenizer")),
):  # fmt: skip
    register(_row)


def _part(config: Any, tool: Tool) -> Any:
    """The settings holding `out`, `overwrite` and `html`."""
    return config if tool.section is None else getattr(config, tool.section)


class Command:
    """A row's command line: `build_parser`, `parse_args`, `run` and `main`, as every entry module
    had them. `doc`: the entry module's docstring (its first paragraph is `--help`'s description).
    An entry module whose flags go beyond its settings passes `extra_flags(parser)` (added first)
    and its own `parse(parser, args, argv)`."""

    def __init__(self, name: str, doc: str, extra_flags: Callable | None = None, parse: Callable | None = None):
        self.tool = TOOLS[name]
        self.doc = doc
        self.extra_flags = extra_flags
        self.parse = parse

    def build_parser(self) -> argparse.ArgumentParser:
        p = cli.parser(f"analysis.{self.tool.name}", self.doc)
        if self.extra_flags is not None:
            self.extra_flags(p)
        add_tool_flags(p, self.tool)
        return p

    def parse_args(self, argv: list[str] | None) -> Any:
        p = self.build_parser()
        a = p.parse_args(argv)
        if self.parse is not None:
            return self.parse(p, a, argv)
        sections = taken_sections(self.tool)
        config = resolved(self.tool, settings.from_flags(load(self.tool.settings), p, a, argv, sections=sections))
        settings.print_config_if_asked(a, config, sections=sections)
        return config

    def run(self, config: Any) -> Any:
        return run(self.tool, config)

    def main(self, argv: list[str] | None = None) -> Any:
        return self.run(self.parse_args(argv))


def resolved(tool: Tool, config: Any) -> Any:
    """`config` completed by `tool.resolve`, where the row has one."""
    return config if tool.resolve is None else load(tool.resolve)(config)


def taken_sections(tool: Tool) -> Sequence[settings.Section] | None:
    """The sections of a shared settings class that `tool` takes (None: all its settings)."""
    return None if tool.takes is None else load(tool.takes)


def add_tool_flags(p: argparse.ArgumentParser, tool: Tool) -> None:
    """The flags of `tool`'s settings (and `--config`/`--print-config`)."""
    sections = taken_sections(tool)
    if tool.flags is not None:
        load(tool.flags)(p, {} if tool.tool is None else load(tool.tool), sections)
        return
    settings.add_flags(p, load(tool.settings), sections=sections)
    settings.add_config_flags(p)


def run(tool: Tool, config: Any) -> Any:
    """What every command does once its flags are parsed: refuses what needs no model, imports the
    analysis (only now: `--help` and flag errors need no JAX), runs it, and prints its text, the
    `--html` page and where it wrote. Returns the result (None: a process that prints nothing)."""
    part = _part(config, tool)
    if tool.refuses:
        from analysis.common.flags import refuse_early

        refuse_early(part)
    result = execute(load(tool.analysis), config)
    if result is None:
        return None
    if tool.wrote is not None:
        print(load(tool.wrote)(result.path))
        return result
    text = load(tool.analysis).text(result)
    if text:
        print(text)
    if tool.html and part.html:
        from analysis.heads.pipeline import write_html

        print(write_html(part.out))
    cli.print_wrote(part.out)
    return result


def main(name: str, argv: list[str] | None = None) -> Any:
    """`python -m analysis.<name> ARGV` in this process, for a row without an entry module of its own
    (a package's analysis): its docstring is its analysis module's."""
    tool = TOOLS[name]
    doc = importlib.import_module(tool.analysis.partition(":")[0]).__doc__ or name
    return Command(name, doc).main(argv)


def execute(analysis: Analysis, config: Any, write: bool = True, into: Path | None = None, **given: Any) -> Any:
    """An `Analysis` run: joined to the distributed job where `config.distributed` asks, prepared
    (`given`: what a Python call passed beside the settings, a model already loaded, handed to
    `prepare` by name) and computed, then (where `write`, and in the first process only) written
    whole or not at all into `config.out` (`runinfo.atomic_out`, entered before the computation, so
    that an `--out` another run is writing is refused before the work, not after): the analysis'
    files, its figures drawn by the figure pool, and run.json: the settings, then what `write`
    returned (its `config`, where it returns one, is the settings the run used, such as a length
    fitted to the model, in their place), the figures and the timings (the `timings_s` `write`
    returned, its own stages, in place of prepare, compute and write). Returns the result, or what
    the analysis' optional `written(result, info, out)` makes of it once written (`info`: run.json
    without the environment); None in the other processes of a job that writes, and where the analysis' optional
    `writes(config)` says this process writes nothing. `into`: where to write instead of
    `config.out`, inside a larger output being written and moved in whole (`config.out` names
    where it will be then: across-seed track's members)."""
    import jax

    from analysis.common.figures import FigurePool, figure_formats, pool_size
    from analysis.common.flags import DEFAULT_FORMATS, select_formats
    from bertjax import distributed, runinfo

    distributed.initialize(getattr(config, "distributed", False))
    if (file := getattr(analysis, "file", None)) is not None:
        return _one_file(analysis, config, file, given)
    started = time.perf_counter()
    prepared = analysis.prepare(config, **given)
    timings = {"prepare": time.perf_counter() - started}
    writes = getattr(analysis, "writes", None)
    if not write or jax.process_index() != 0 or (writes is not None and not writes(config)):
        result = analysis.compute(config, prepared)
        return result if not write else None
    target = Path(config.out).expanduser() if into is None else into
    replaces = getattr(analysis, "replaces", None)
    overwrite = getattr(config, "overwrite", False) or (replaces is not None and replaces(target))
    with runinfo.atomic_out(target, overwrite, analysis.output_kind) as tmp:
        clock = time.perf_counter()
        result = analysis.compute(config, prepared)
        timings["compute"] = time.perf_counter() - clock
        clock = time.perf_counter()
        info = dict(analysis.write(result, tmp))
        timings["write"] = time.perf_counter() - clock
        clock = time.perf_counter()
        jobs = analysis.figures(result, tmp)
        formats = select_formats(getattr(config, "figure_format", DEFAULT_FORMATS))
        with figure_formats(formats), FigurePool(pool_size(len(jobs))) as pool:
            pool.submit(jobs)
            figures = pool.results()
        # An analysis timing its own stages has them recorded in place of the runner's three, which
        # would count them twice (benchmarks sum the stages).
        timings = dict(info.pop("timings_s", timings))
        timings["figures"] = timings.get("figures", 0.0) + time.perf_counter() - clock
        timings["total"] = time.perf_counter() - started
        drawn = sorted([*info.get("figures", ()), *(p.name for p in figures)])
        rounded = {k: round(v, 3) for k, v in timings.items()}
        info = {"config": dataclasses.asdict(config)} | info | {"figures": drawn, "timings_s": rounded}
        runinfo.write_run_json(tmp, info)
    written = getattr(analysis, "written", None)
    return result if written is None else written(result, info, Path(config.out).expanduser())


def _one_file(analysis: Any, config: Any, file: Callable, given: dict[str, Any]) -> Any:
    """`execute` for an analysis whose output is one file (`file(config)`: the file and the output
    folder it goes into, locked meanwhile)."""
    from bertjax import runinfo
    from bertjax.errors import UserError

    path, folder = file(config)
    with runinfo.exclusive(folder, "run directory") if folder is not None else contextlib.nullcontext():
        result = analysis.compute(config, analysis.prepare(config, **given))
        try:
            with runinfo.atomic_file(file(config)[0], overwrite=True) as f:  # as `file` allowed, checked again
                analysis.write(result, f)
        except OSError as e:
            raise UserError(f"{path}: cannot write the {analysis.output_kind} ({e.strerror})") from None
    written = getattr(analysis, "written", None)
    return result if written is None else written(result, {}, path)


@functools.cache
def api_function(name: str) -> Callable[..., Any]:
    """The Python call of the row `name`: its `positional` settings by
    position, the others as keywords named as the flags, checked as the flags' values are, and the
    row's `given` (None unless passed); `out=` writes the result as `--out` does (and `--html`'s
    page where the settings ask for it), without it nothing is written (but for an analysis whose
    output is one file, `file`: its file, where `out` or the analysis puts it). Its docstring adds the
    analysis class's. The defaults are the row's `tool`'s, where it has one. An analysis whose
    call takes more than its settings' fields (objects loaded for it, settings of a form the
    flags do not have) makes the call's settings itself: its optional
    `arguments(named, settings, given)` gets the positional arguments by name, the keywords that
    are settings (`out` among them) and the row's `given`, and returns the settings and what
    `prepare` is handed."""
    tool = TOOLS[name]
    schema = load(tool.settings)
    spec = tool.analysis
    defaults = None if tool.tool is None else load(tool.tool)
    sections = taken_sections(tool)

    def call(*args: Any, out: str | Path | None = None, **kwargs: Any) -> Any:
        if len(args) > len(tool.positional):
            raise TypeError(f"{name}() takes {len(tool.positional)} positional arguments, got {len(args)}")
        given = dict(zip(tool.positional, args, strict=False)) | {
            n: kwargs.pop(n) for n in tool.positional if n in kwargs
        }
        given = {n: str(v) if isinstance(v, Path) else v for n, v in given.items()}
        if missing := [n for n in tool.positional if n not in given]:
            raise TypeError(f"{name}() missing required argument(s): {', '.join(missing)}")
        objects = {n: kwargs.pop(n) for n in tool.given if n in kwargs}
        written = {} if out is None else {"out": str(out)}
        analysis = load(spec)
        if (arguments := getattr(analysis, "arguments", None)) is not None:
            config, objects = arguments(given, kwargs | written, objects)
        else:
            config = settings.from_kwargs(schema, kwargs | written, defaults, sections, **given)
        config = resolved(tool, config)
        # A one-file analysis' file is its result: written where `out` says, or where its `file` puts it.
        result = execute(analysis, config, write=out is not None or hasattr(analysis, "file"), **objects)
        part = _part(config, tool)
        if result is not None and out is not None and tool.html and part.html:
            from analysis.heads.pipeline import write_html

            write_html(part.out)
        return result

    call.__name__ = call.__qualname__ = name
    about = type(load(tool.analysis)).__doc__
    call.__doc__ = f"`python -m analysis.{name}` as a call; keyword arguments are its flags ({schema.__name__})." + (
        "\n\n" + inspect.cleandoc(about) if about else ""
    )
    more = [load(spec) for spec in tool.schemas]
    # Its positional settings by name in `help()` and completion, not `*args`: parameters of its
    # own, which `with_settings` does not list again as keywords.
    signature = inspect.signature(call)
    named = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in tool.positional]
    rest = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    call.__signature__ = signature.replace(parameters=[*named, *rest])  # type: ignore[attr-defined]
    call = settings.with_settings(schema, *more, tool=defaults, sections=sections)(call)
    signature = inspect.signature(call)
    # A `given` that is a setting too (roles' `parser`: an object, or the flag's value) shows the setting's default.
    named += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
              for n in tool.given if n not in signature.parameters]  # fmt: skip
    rest = list(signature.parameters.values())[len(tool.positional) :]
    call.__signature__ = signature.replace(parameters=[*named, *rest])  # type: ignore[attr-defined]
    return call


def api_names() -> dict[str, str]:
    """The names `analysis.api` exports from the rows' own modules, by the module defining them."""
    return {export: tool.api for tool in TOOLS.values() if tool.api is not None for export in tool.exports}
