"""The tool contract: what an analysis implements (`Analysis`), the table of tools (`TOOLS`, one
`Tool` row each), and the one runner that makes a row its command line (`Command`, `main`) and its
Python call (`api_function`, exported by `analysis.api`).

A row names its parts as `"module:name"` texts, imported once the flags are parsed, so that a
command's `--help` and its flag errors wait for no JAX and no other analysis (tests/test_cli.py).
Adding an analysis is one module implementing `Analysis` and one row given to `register`
(docs/layout.md has an example); the rows below are the tools written before the protocol, whose
`run` computes and writes in one call.
"""

from __future__ import annotations

import argparse
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
    (`execute`) does the rest, the same for every analysis."""

    output_kind: str  # what `.bertjax-output` names (`runinfo.atomic_out`): an output it may replace

    def prepare(self, config: Any) -> Any: ...

    def compute(self, config: Any, prepared: Any) -> Any: ...

    def write(self, result: Any, directory: Path) -> dict: ...

    def text(self, result: Any) -> str: ...

    def figures(self, result: Any, directory: Path) -> Sequence[FigureJob]: ...


@dataclasses.dataclass(frozen=True)
class Tool:
    """A row of the table: `python -m analysis.<name>` and `analysis.api.<name>(...)`.

    `settings`: the typed settings class; its flags are `flags(parser, tool, skip)` where given
    (with `tool` and `skip` as `settings.add_flags` takes them), else its fields' and `--config`.
    Exactly one of `analysis` (an `Analysis`: the runner computes and writes) and `run` (settings →
    the result, computed and written; None where this process has nothing to print) is given.
    `section`: the attribute of the settings holding `out`, `overwrite` and `html` (a tool whose
    settings nest the roles settings). `refuses`: the command refuses the mistakes that need no
    model (`refuse_early`) before it imports the analysis. `html`: it writes `--html`'s page.
    `wrote`: the last line printed, from the result's `path`, where it is not `wrote <out>`.
    `api` and `exports`: the module of a hand-written Python call and the names `analysis.api`
    exports from it (a row with `analysis` gets its call from `api_function`)."""

    name: str
    settings: str
    analysis: str | None = None
    run: str | None = None
    flags: str | None = None
    tool: str | None = None
    skip: str | None = None
    section: str | None = None
    refuses: bool = True
    html: bool = False
    wrote: str | None = None
    api: str | None = None
    exports: tuple[str, ...] = ()
    positional: tuple[str, ...] = ("ckpt",)  # the settings an API call takes by position

    def __post_init__(self) -> None:
        if (self.analysis is None) == (self.run is None):
            raise ValueError(f"tool {self.name}: give exactly one of analysis= and run=")


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
    Tool("roles", f"{_HEADS}:RolesConfig", run="analysis.api.heads:run_roles", flags=f"{_HEADS}:add_roles_flags",
         tool=f"{_HEADS}:ROLES_TOOL", html=True, api="analysis.api.heads",
         exports=("RolesResult", "roles", "roles_config", "run_roles")),
    Tool("track", f"{_HEADS}:TrackConfig", run="analysis.api.heads:run_track", flags=f"{_HEADS}:add_roles_flags",
         tool=f"{_HEADS}:TRACK_TOOL", skip=f"{_HEADS}:TRACK_SKIP", section="roles", refuses=False, html=True,
         api="analysis.api.heads", exports=("TrackResult", "track", "run_track")),
    Tool("finetune_effect", f"{_HEADS}:RolesConfig", run="analysis.api.heads:run_finetune_effect",
         flags=f"{_HEADS}:add_roles_flags", tool=f"{_HEADS}:EFFECT_TOOL", skip=f"{_HEADS}:EFFECT_SKIP",
         section="data", refuses=False, html=True, api="analysis.api.heads",
         exports=("FinetuneEffectResult", "finetune_effect", "run_finetune_effect")),
    Tool("report", f"{_HEADS}:ReportConfig", run="analysis.api.heads:run_report", refuses=False,
         wrote="analysis.heads.report:wrote_line", api="analysis.api.heads", exports=("Report", "report", "run_report")),
    Tool("clark", "analysis.attention.options:ClarkConfig", run="analysis.api.attention:run_clark",
         api="analysis.api.attention", exports=("ClarkResult", "clark", "clark_config", "run_clark")),
    Tool("ablate", "analysis.ablation.options:KovalevaConfig", run="analysis.api.ablation:run_ablate",
         api="analysis.api.ablation", exports=("AblateResult", "ablate", "ablate_config", "run_ablate")),
    Tool("prune", "analysis.ablation.options:MichelConfig", run="analysis.api.ablation:run_prune",
         api="analysis.api.ablation", exports=("PruneResult", "prune", "prune_config", "run_prune")),
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
        config = settings.from_flags(load(self.tool.settings), p, a, argv)
        settings.print_config_if_asked(a, config)
        return config

    def run(self, config: Any) -> Any:
        return run(self.tool, config)

    def main(self, argv: list[str] | None = None) -> Any:
        return self.run(self.parse_args(argv))


def add_tool_flags(p: argparse.ArgumentParser, tool: Tool) -> None:
    """The flags of `tool`'s settings (and `--config`/`--print-config`)."""
    if tool.flags is not None:
        load(tool.flags)(p, {} if tool.tool is None else load(tool.tool), () if tool.skip is None else load(tool.skip))
        return
    settings.add_flags(p, load(tool.settings))
    settings.add_config_flags(p)


def run(tool: Tool, config: Any) -> Any:
    """What every command does once its flags are parsed: refuses what needs no model, imports the
    analysis (only now: `--help` and flag errors need no JAX), runs it, and prints its text, the
    `--html` page and where it wrote. Returns the result (None: a process that prints nothing)."""
    part = _part(config, tool)
    if tool.refuses:
        from analysis.common.flags import refuse_early

        refuse_early(part)
    result = execute(load(tool.analysis), config) if tool.analysis is not None else load(tool.run)(config)
    if result is None:
        return None
    if tool.wrote is not None:
        print(load(tool.wrote)(result.path))
        return result
    text = load(tool.analysis).text(result) if tool.analysis is not None else result.run.text()
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
    spec = tool.analysis or tool.run or ""
    doc = importlib.import_module(spec.partition(":")[0]).__doc__ or name
    return Command(name, doc).main(argv)


def execute(analysis: Analysis, config: Any, write: bool = True) -> Any:
    """An `Analysis` run: joined to the distributed job where `config.distributed` asks, prepared and
    computed, then (where `write`, and in the first process only) written whole or not at all into
    `config.out` (`runinfo.atomic_out`): the analysis' files, its figures drawn by the figure pool,
    and run.json with the settings and the timings. Returns the result; None in the other processes
    of a job that writes."""
    import jax

    from analysis.common.figures import FigurePool, figure_formats, pool_size
    from analysis.common.flags import select_formats
    from bertjax import distributed, runinfo

    distributed.initialize(getattr(config, "distributed", False))
    started = time.perf_counter()
    prepared = analysis.prepare(config)
    timings = {"prepare": time.perf_counter() - started}
    clock = time.perf_counter()
    result = analysis.compute(config, prepared)
    timings["compute"] = time.perf_counter() - clock
    if not write:
        return result
    if jax.process_index() != 0:
        return None
    with runinfo.atomic_out(config.out, getattr(config, "overwrite", False), analysis.output_kind) as tmp:
        clock = time.perf_counter()
        info = analysis.write(result, tmp)
        timings["write"] = time.perf_counter() - clock
        clock = time.perf_counter()
        jobs = analysis.figures(result, tmp)
        formats = select_formats(getattr(config, "figure_format", "png"))
        with figure_formats(formats), FigurePool(pool_size(len(jobs))) as pool:
            pool.submit(jobs)
            figures = pool.results()
        timings |= {"figures": time.perf_counter() - clock, "total": time.perf_counter() - started}
        runinfo.write_run_json(tmp, {**info, "config": dataclasses.asdict(config),
                                     "figures": sorted(p.name for p in figures),
                                     "timings_s": {k: round(v, 3) for k, v in timings.items()}})  # fmt: skip
    return result


@functools.cache
def api_function(name: str) -> Callable[..., Any]:
    """The Python call of the row `name` that has an `Analysis`: its `positional` settings by
    position, the others as keywords named as the flags, checked as the flags' values are; `out=`
    writes the result as `--out` does, without it nothing is written."""
    tool = TOOLS[name]
    if tool.analysis is None:
        raise ValueError(f"tool {name}: its Python call is {tool.api}.{name}")
    schema = load(tool.settings)

    def call(*args: Any, out: str | Path | None = None, **kwargs: Any) -> Any:
        if len(args) > len(tool.positional):
            raise TypeError(f"{name}() takes {len(tool.positional)} positional arguments, got {len(args)}")
        given = dict(zip(tool.positional, args, strict=False)) | {
            n: kwargs.pop(n) for n in tool.positional if n in kwargs
        }
        given = {n: str(v) if isinstance(v, Path) else v for n, v in given.items()}
        written = {} if out is None else {"out": str(out)}
        config = settings.from_kwargs(schema, kwargs | written, skip=tool.positional, **given)
        return execute(load(tool.analysis), config, write=out is not None)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"`python -m analysis.{name}` as a call; keyword arguments are its flags ({schema.__name__})."
    call = settings.with_settings(schema, skip=(*tool.positional, "out"))(call)
    # Its positional settings by name in `help()` and completion, not `*args`.
    signature = inspect.signature(call)
    named = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in tool.positional]
    rest = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    call.__signature__ = signature.replace(parameters=[*named, *rest])  # type: ignore[attr-defined]
    return call


def api_names() -> dict[str, str]:
    """The names `analysis.api` exports from the rows' own modules, by the module defining them."""
    return {export: tool.api for tool in TOOLS.values() if tool.api is not None for export in tool.exports}
