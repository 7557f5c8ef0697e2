"""What the API's results share: held in memory, written only when asked (`save`, `directory`)
through the writer the CLI uses, the figures drawn on demand, the inline views (the report's page
in an iframe; for the analyses without a report, the figures and tables as plain HTML), and the
checkpoints the last call loaded, kept for the next. A result written nowhere stays so: its inline
views are built from memory, its figures drawn into memory, and no file or folder is created."""

from __future__ import annotations

import base64
import dataclasses
import gc
import html
import json
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import pandas as pd
from flax import nnx

from analysis.common.figures import figure_formats, figures_held
from analysis.common.flags import select_formats
from analysis.common.writing import write_tables
from analysis.heads.report import NOT_SAVED
from analysis.heads.series import checkpoint_identity, hf_identity
from analysis.tools import FigureJob, execute
from bertjax import pretrained, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import check_finite, from_pretrained, load_tokenizer

# The rows of a table an inline view shows (pandas elides the middle of longer ones).
VIEW_ROWS = 12


def collect_garbage() -> None:
    """What a call does first: free the garbage of the calls before it. Their figures sit in
    reference cycles (matplotlib's figure, canvas and renderer, with its pixel buffer) that wait for
    the collector's next full pass; uncollected, they raised each clark call's peak memory by 14 MB."""
    gc.collect()


class Output:
    """An output directory: the one asked for, or a temporary one removed with its result."""

    def __init__(self, out: str | Path | None, kind: str):
        self.temporary: Path | None = None  # the folder removed with the result
        if out is None:
            self.temporary = Path(tempfile.mkdtemp(prefix=f"bertjax-{kind}-"))
            weakref.finalize(self, shutil.rmtree, self.temporary, True)
            self.path = self.temporary / kind
        else:
            self.path = Path(out).expanduser()


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as a tool loads it: its source (opened by the call, which passes the same
    source down to the tool), and the class and options of the load."""

    source: pretrained.Checkpoint
    cls: str = "BertModel"
    trained_heads: bool = False
    allow_nonfinite: bool = False

    def identity(self) -> str:
        """Its files' resolved paths, sizes and mtimes: a checkpoint re-written in place is new."""
        source = self.source
        if source.kind == "hf":
            return json.dumps(hf_identity(source.path, 0), sort_keys=True)
        assert source.step is not None  # an orbax checkpoint is opened at a step
        return json.dumps(checkpoint_identity(source.path, source.step), sort_keys=True)


# What the last call loaded, kept for the next call on the same files (a notebook re-runs a cell
# with other settings): loading again costs seconds, and each load's transient copies raise the
# process's peak memory anew, the allocator reusing the last load's freed memory piecemeal. By the
# files' identity and the load's options (a classifier is not the bare encoder, a load that
# allowed NaN weights is not one that refused them).
_KEPT: dict[tuple, Any] = {}


def loaded(checkpoints: Sequence[Checkpoint]) -> list[tuple[Any, Any]]:
    """(model, tokenizer) of each of `checkpoints`, each loaded unless the last call loaded it from
    the same unchanged files with the same options. Only these are kept afterwards: what the last
    call loaded and this one does not use is dropped before anything is loaded."""
    keys = []
    for checkpoint in checkpoints:
        identity = checkpoint.identity()
        options = (checkpoint.cls, checkpoint.trained_heads, checkpoint.allow_nonfinite)
        keys.append(((identity, "model", *options), (identity, "tokenizer")))
    wanted = {key for pair in keys for key in pair}
    for key in [key for key in _KEPT if key not in wanted]:
        del _KEPT[key]
    for checkpoint, (model_key, tokenizer_key) in zip(checkpoints, keys, strict=True):
        if model_key not in _KEPT:
            _KEPT[model_key] = from_pretrained(checkpoint.source, checkpoint.cls,
                                               trained_heads=checkpoint.trained_heads,
                                               allow_nonfinite=checkpoint.allow_nonfinite)  # fmt: skip
        if tokenizer_key not in _KEPT:
            _KEPT[tokenizer_key] = load_tokenizer(checkpoint.source)
    return [(_KEPT[model_key], _KEPT[tokenizer_key]) for model_key, tokenizer_key in keys]


# The sizes that make a model another checkpoint's: its weights would not fit that checkpoint's.
ARCHITECTURE = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size",
                "max_position_embeddings", "type_vocab_size")  # fmt: skip


def check_model(model, what: str = "model") -> None:
    """A model passed to a call is one bertjax loaded (a string or a transformers model went on to
    an AttributeError deep inside)."""
    if not (isinstance(model, nnx.Module) and hasattr(model, "config")):
        raise UserError(f"{what}: expected a model loaded by bertjax (bertjax.from_pretrained), got {model!r}"[:300])


def check_given(model, source: pretrained.Checkpoint, ckpt: str, allow_nonfinite: bool) -> None:
    """A model passed in for `ckpt` (opened: `source`) is taken as that checkpoint (run.json names it, the report
    loads it for its examples), so it must have the checkpoint's architecture; and its weights are
    checked for NaN and ±Inf as a loaded file's are (an edited or trained model may hold them).
    Weights of the same architecture but other values cannot be told apart from the checkpoint's
    without loading it, which passing a model is meant to save: that stays the caller's word."""
    check_model(model)
    stored = source.config
    differ = [f"{key} {getattr(model.config, key)} vs {getattr(stored, key)}" for key in ARCHITECTURE
              if getattr(model.config, key) != getattr(stored, key)]  # fmt: skip
    if differ:
        raise UserError(f"model: not the model of {ckpt} ({', '.join(differ)}); pass the checkpoint it was "
                        "loaded from as the first argument, or leave model out")  # fmt: skip
    check_given_finite(model, allow_nonfinite)


def check_given_finite(model, allow_nonfinite: bool) -> None:
    """A model passed in refused (or, with `allow_nonfinite`, warned about) for NaN or ±Inf weights,
    as a loaded file's are."""
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    check_finite(
        Path("model (passed in)"), [(path, variable.get_value()) for path, variable in params], allow_nonfinite
    )


def refuse_inside_temporary(out: str | Path, output: Output | None) -> None:
    """One line if `out` lies in the temporary folder of a result given no `out` (`output`'s),
    which is removed with the result, and what was saved there with it."""
    temporary = None if output is None else output.temporary
    if temporary is not None and Path(out).expanduser().resolve().is_relative_to(temporary.resolve()):
        raise UserError(
            f"{out}: inside this result's temporary folder {temporary}, which is removed with the result; save it elsewhere"
        )


def frame(page: str, height: int) -> str:
    # An iframe keeps the page's script and style apart from the notebook's, in JupyterLab, the
    # classic notebook and a static HTML export alike; srcdoc keeps it offline.
    return (
        f'<iframe class="bertjax-report" srcdoc="{html.escape(page, quote=True)}" '
        f'style="width: 100%; height: {height}px; border: 1px solid #ddd;"></iframe>'
    )


class FigureFile:
    """A figure the analysis wrote; Jupyter shows it (PNG) inline. `data`: its bytes, for a figure
    of a result not written anywhere (drawn into memory; `path` is then only its file name)."""

    def __init__(self, path: Path, data: bytes | None = None):
        self.path = path
        self.data = data

    def _repr_png_(self) -> bytes | None:
        if self.path.suffix != ".png":
            return None
        return self.path.read_bytes() if self.data is None else self.data

    def __repr__(self) -> str:
        return f"FigureFile({str(self.path)!r})"


class HeldResult:
    """What the results held in memory share (roles, track, finetune_effect, clark). A result is held in memory: the call that made it wrote
    nothing unless given `out`. `save(out)` writes its files through the CLI's writer;
    `directory` is where its files are (`out`, or on first use a temporary folder they are
    written into, removed with the result); the figures are drawn on demand."""

    kind: str
    written: Path | None
    output: Output | None

    def _write(self, out: Path, overwrite: bool) -> None:
        """Writes the result's files into `out` as `--out` gets them (whole or not at all), the
        `--html` page too where the settings ask for it."""
        raise NotImplementedError

    @property
    def directory(self) -> Path:
        """Where the result's files are: the call's `out`; without one, on first use, a temporary
        folder they are written into, removed with the result."""
        if self.written is None:
            self.output = Output(None, self.kind)
            self._write(self.output.path, overwrite=False)
            self.written = self.output.path
        return self.written

    def save(self, out: str | Path, overwrite: bool = False) -> Path:
        """Writes the outputs (CSVs, scores, figures, run.json) to `out`, as `--out` would have."""
        if not isinstance(overwrite, bool):  # "no" would be taken for yes
            raise UserError(f"overwrite: expected True or False, got {overwrite!r}"[:300])
        refuse_inside_temporary(out, self.output)
        self._write(Path(out), overwrite)
        return Path(out).expanduser()


class _Computed:
    """An `analysis.tools.Analysis` whose result is computed already: `analysis`'s, written by
    the runner as `--out` is (`save_with`)."""

    def __init__(self, analysis: Any, result: Any):
        self.analysis, self.result = analysis, result
        self.output_kind = analysis.output_kind

    def prepare(self, config: Any) -> None:
        return None

    def compute(self, config: Any, prepared: None) -> Any:
        return self.result

    def write(self, result: Any, directory: Path) -> dict:
        return self.analysis.write(result, directory)

    def text(self, result: Any) -> str:
        return self.analysis.text(result)

    def figures(self, result: Any, directory: Path) -> Sequence:
        return self.analysis.figures(result, directory)


def save_with(analysis: Any, result: Any, config: Any) -> None:
    """Writes `result`, computed by `analysis` (an `analysis.tools.Analysis`), into `config.out` as
    the command writes its `--out` (whole or not at all, `config.overwrite` saying whether an
    earlier output of its kind is replaced); run.json records the settings `analysis.write`
    returns, the run's own."""
    execute(_Computed(analysis, result), config)


def unwritten_info(info: dict, timings: dict[str, float]) -> dict:
    """run.json as it would be written, without the figures (none drawn) and the environment: the
    values as JSON gives them back (lists for tuples, text for paths)."""
    info = info | {"figures": [], "timings_s": {k: round(v, 3) for k, v in timings.items()}}
    return json.loads(json.dumps(info, default=str))


def drawn(draw, directory: Path | None) -> list[FigureFile]:
    """The figure files `draw(folder)` writes: into the result's directory, or (None) into memory,
    held as bytes."""
    if directory is not None:
        return [FigureFile(p) for p in draw(directory)]
    with figures_held() as held:
        return [FigureFile(p, held[p]) for p in draw(Path())]


class TablesResult(HeldResult):
    """A result of tables and figures held in memory (clark, ablate, prune): `tables`, `settings`
    (the run's config), `info` and `run`, whose `figures` are its drawing jobs (`run.draw(job,
    folder)` draws one, a figure or several); `writer` is its module's one writer,
    `write(run, directory)`."""

    tables: dict[str, pd.DataFrame]
    settings: Any
    info: dict
    run: Any

    output_kind: ClassVar[str]  # what `.bertjax-output` says of it (`runinfo.atomic_out`), its module's

    @staticmethod
    def writer(run: Any, directory: Path, /) -> dict:  # positional: each module names its own parameters
        raise NotImplementedError

    @classmethod
    def of(cls, run, info: dict | None = None, directory: Path | None = None) -> Self:
        """The result of `run`; `info`: the run.json written into `directory`, if it was written."""
        info = unwritten_info(run.info, run.timings) if info is None else info
        make: Callable[..., Self] = cls  # each kind is a dataclass of these fields, in this order
        return make(cls.tables_of(run), run.config, info, run, directory)

    @staticmethod
    def tables_of(run) -> dict[str, pd.DataFrame]:
        """The run's tables as their CSVs read back, by name."""
        return dict(sorted(run.tables.items()))

    def _write(self, out: Path, overwrite: bool) -> None:
        run = dataclasses.replace(self.run, config=dataclasses.replace(self.run.config, out=str(out)))
        with runinfo.atomic_out(str(out), overwrite, self.output_kind) as tmp:
            self.writer(run, tmp)

    def _figures(self) -> dict[str, list[FigureFile]]:
        """The figures by file name without its format, in file-name order: the files written, or
        (a result written nowhere) every figure drawn once into memory and held as bytes."""
        if self.written is not None:
            names = sorted(self.info["figures"])
            return {stem: [FigureFile(self.written / n) for n in names if Path(n).stem == stem]
                    for stem in dict.fromkeys(Path(n).stem for n in names)}  # fmt: skip
        if not hasattr(self, "_held_figures"):
            with figures_held() as data, figure_formats(select_formats(self.settings.figure_format)):
                paths = [p for job in self.run.figures for p in self.run.draw(job, Path())]
            held: dict[str, list[FigureFile]] = {}
            for path in sorted(paths, key=lambda p: p.name):
                held.setdefault(path.stem, []).append(FigureFile(path, data[path]))
            self._held_figures = held
        return self._held_figures

    def figure_names(self) -> list[str]:
        """The figures of the run, by file name without its format (`surface_by_layer`)."""
        return list(self._figures())

    def figure(self, name: str) -> list[FigureFile]:
        """The files of the figure `name` (one per `figure_format`)."""
        figures = self._figures()
        if name not in figures:
            raise UserError(f"no figure {name!r} in this run (it drew {', '.join(figures) or 'none'})")
        return figures[name]

    def _repr_html_(self) -> str:
        return tables_html(self, NOT_SAVED if self.written is None else str(self.written))


class TablesAnalysis:
    """What the `Analysis` (`analysis.tools`) of a tool whose result is a `TablesResult` shares
    (clark, ablate, prune): `prepare` collects the garbage of the calls before (`collect_garbage`)
    and opens and loads the checkpoints (`load`: the arguments of `run` after the config, a
    `model`/`tokenizer` passed in used instead of loading them), timed as run.json's `load_model`;
    `compute` returns the `result` class of `run`'s run; `write` writes its tables (the `indexed`
    ones with their index) and returns its run.json record and timings; the figures are the run's
    drawing jobs; `written` is the result as written."""

    output_kind: str  # the result's
    result: ClassVar[type[TablesResult]]
    indexed: ClassVar[tuple[str, ...]] = ()
    run: ClassVar[Callable[..., Any]]

    def load(self, config: Any, model: Any, tokenizer: Any) -> tuple:
        raise NotImplementedError

    def prepare(self, config: Any, model: Any = None, tokenizer: Any = None) -> tuple[tuple, float]:
        collect_garbage()
        clock = time.perf_counter()
        arguments = self.load(config, model, tokenizer)
        return arguments, time.perf_counter() - clock

    def compute(self, config: Any, prepared: tuple[tuple, float]) -> TablesResult:
        arguments, loading = prepared
        run = self.run(config, *arguments)
        run.timings = {"load_model": loading} | run.timings
        return self.result.of(run)

    def write(self, result: TablesResult, directory: Path) -> dict:
        write_tables(result.run.tables, directory, self.indexed)
        return result.run.info | {"timings_s": result.run.timings}

    def text(self, result: TablesResult) -> str:
        return result.run.text()

    def figures(self, result: TablesResult, directory: Path) -> list[FigureJob]:
        return [result.run.job(name, directory) for name in result.run.figures]

    def written(self, result: TablesResult, info: dict, out: Path) -> TablesResult:
        return self.result.of(result.run, info, out)


def tables_html(result, where: str) -> str:
    """The inline view of a result of tables and figures (`figure_names`, `figure`, `tables`): the
    figures as PNG data (offline, and kept by a static export), then each table's rows."""
    parts = [f"<div class='bertjax-result'><b>{html.escape(type(result).__name__)}</b>: {html.escape(where)}"]
    for name in result.figure_names():
        for figure in result.figure(name):
            if (png := figure._repr_png_()) is not None:
                data = base64.b64encode(png).decode()
                parts.append(f"<figure><img alt='{html.escape(name)}' style='max-width: 100%' "
                             f"src='data:image/png;base64,{data}'><figcaption>{html.escape(name)}</figcaption></figure>")  # fmt: skip
    for name, table in result.tables.items():
        parts.append(f"<details><summary>{html.escape(name)}.csv: {len(table)} rows</summary>"
                     f"{table.to_html(max_rows=VIEW_ROWS, index=False)}</details>")  # fmt: skip
    return "\n".join([*parts, "</div>"])
