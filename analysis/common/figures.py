"""Figure machinery every analysis shares: output formats (`--figure-format`), figure selection
(`--figures`), saving, panel grids and log axes, and the `FigurePool` of worker processes.

The figures themselves live with their analysis family (`heads.figures`, `ablation.figures`,
`attention.pipeline`); every one of them saves through `save_figure`, in the formats of the
`figure_formats` in force.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import io
import math
import os
import pickle
import queue
import shutil
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from analysis.common.flags import DEFAULT_FORMATS
from bertjax import cli, runinfo

PNG_DPI = 150

# Starting a figure process (importing matplotlib and pandas, ~2 s) costs what drawing two to
# three figures does, so a process is worth starting only for about four.
FIGURES_PER_PROCESS = 4

# A figure title's character width and line height at the default title size (12 pt), inches.
TITLE_INCH_PER_CHAR = 0.1
TITLE_INCH_PER_LINE = 0.22

_formats: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("figure_formats", default=DEFAULT_FORMATS)
_held: contextvars.ContextVar[dict[Path, bytes] | None] = contextvars.ContextVar("figures_held", default=None)


@contextlib.contextmanager
def figure_formats(formats: Sequence[str]) -> Iterator[None]:
    """The formats `save_figure` writes within the block (a context variable, not a parameter:
    every figure function of every analysis saves through `save_figure`)."""
    token = _formats.set(tuple(formats))
    try:
        yield
    finally:
        _formats.reset(token)


@contextlib.contextmanager
def figures_held() -> Iterator[dict[Path, bytes]]:
    """Within the block `save_figure` writes nothing: the bytes of each file it would write are
    held in the dict yielded, by that file's path (the inline views of a result written nowhere
    create no file or folder)."""
    held: dict[Path, bytes] = {}
    token = _held.set(held)
    try:
        yield held
    finally:
        _held.reset(token)


def save_figure(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Write `fig` as `<stem>.<format>` under `out_dir` (created if needed), in each format of
    the `figure_formats` in force; within `figures_held`, into its dict instead."""
    held = _held.get()
    if held is None:
        out_dir.mkdir(parents=True, exist_ok=True)
    # The layout engine would run again inside each savefig; it is the dearest part of drawing
    # these many-panel figures, and its result (in figure fractions) is the same for every file.
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
        fig.set_layout_engine("none")
    paths = []
    for fmt in _formats.get():
        paths.append(out_dir / f"{stem}.{fmt}")
        options: dict[str, Any] = {"dpi": PNG_DPI} if fmt == "png" else {}
        if held is not None:
            buffer = io.BytesIO()
            fig.savefig(buffer, format=fmt, **options)
            held[paths[-1]] = buffer.getvalue()
            continue
        # Through the one writer: a result's figure drawn on request goes into the user's output
        # directory, where a link planted at its name must not be written through.
        with runinfo.atomic_file(paths[-1], binary=True, overwrite=True) as f:
            fig.savefig(f, format=fmt, **options)
    return paths


def log_scale(ax: Axes, which: Literal["x", "y"]) -> None:
    """Switch an axis, after its data are drawn, to log scale with plain-number labels.

    Under 2 decades few or no powers of ten fall inside the view, so 2× and 5× are labelled too,
    and under one decade every integer multiple (0.4 … 2.5 showed only 0.5, 1 and 2); minor ticks
    stay unlabelled, which keeps labels from colliding.
    """
    ax.set(**{f"{which}scale": "log"})
    axis = ax.xaxis if which == "x" else ax.yaxis
    low, high = axis.get_view_interval()
    if math.log10(high / low) < 1:
        axis.set_major_locator(LogLocator(subs=tuple(float(k) for k in range(1, 10))))
    elif math.log10(high / low) < 2:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def step_axis(ax: Axes, steps: np.ndarray) -> None:
    """A training-step x axis: log scale when every step is positive (a series led by its init at
    step 0 stays linear)."""
    if steps.size > 1 and (steps > 0).all():
        log_scale(ax, "x")
        # A step is a whole number: a sub-decade tick such as 0.9 would read as one.
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}" if float(value).is_integer() else ""))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")


@dataclasses.dataclass(frozen=True)
class Margins:
    """Inches around a panel grid: `left`/`bottom` hold the outer tick labels and axis labels,
    `top` the figure title and the first row's panel titles, `right` a colour bar or nothing;
    `gap` is (between columns, between rows), the latter holding a panel title."""

    left: float = 0.6
    bottom: float = 0.55
    top: float = 0.65
    right: float = 0.2
    gap: tuple[float, float] = (0.15, 0.35)


def panel_grid(
    count: int,
    panel_size: tuple[float, float],
    title: str,
    xlabel: str,
    ylabel: str | None = None,
    max_cols: int = 4,
    margins: Margins = Margins(),
) -> tuple[Figure, list[Axes]]:
    """`count` panels with plot areas of `panel_size` inches, at most `max_cols` a row, on shared
    axes (tick labels on the outer panels only).

    Placed in fixed inches, not by a layout engine: constrained layout measures every tick label
    of every panel and was two thirds of the time to draw a 12-panel grid."""
    ncols = min(max_cols, count)
    nrows = math.ceil(count / ncols)
    (width, height), (gap_x, gap_y) = panel_size, margins.gap
    fig_width = margins.left + ncols * width + (ncols - 1) * gap_x + margins.right
    # A narrow grid widens to fit its title, the panels centred; a title's every line after the
    # first takes room from the top.
    lines = title.splitlines()
    slack = max(0.0, TITLE_INCH_PER_CHAR * max(map(len, lines)) - fig_width)
    fig_width += slack
    top = margins.top + TITLE_INCH_PER_LINE * (len(lines) - 1)
    fig_height = top + nrows * height + (nrows - 1) * gap_y + margins.bottom
    fig = Figure(figsize=(fig_width, fig_height))
    axes: list[Axes] = []
    for i in range(count):
        row, col = divmod(i, ncols)
        left = slack / 2 + margins.left + col * (width + gap_x)
        bottom = fig_height - top - (row + 1) * height - row * gap_y
        rect = (left / fig_width, bottom / fig_height, width / fig_width, height / fig_height)
        ax = fig.add_axes(rect, sharex=axes[0] if axes else None, sharey=axes[0] if axes else None)
        # The lowest panel of its column has the x axis: nothing below it, a full row or not.
        # Inner panels have no axes at all; drawing their ticks was half the cost of a grid.
        if i + ncols >= count:
            ax.set_xlabel(xlabel, fontsize=8)
        else:
            ax.xaxis.set_visible(False)
        if col == 0:
            if ylabel is not None:
                ax.set_ylabel(ylabel, fontsize=8)
        else:
            ax.yaxis.set_visible(False)
        axes.append(ax)
    fig.suptitle(title, y=1 - 0.12 / fig_height, va="top")
    return fig, axes


def pool_size(n_jobs: int) -> int:
    """Worker processes for `n_jobs` figures: one per usable core, each with at least
    FIGURES_PER_PROCESS to draw; 0 (draw in the caller) when fewer than two would be started."""
    workers = min(_usable_cores(), n_jobs // FIGURES_PER_PROCESS)
    return workers if workers > 1 else 0


def _usable_cores() -> int:
    """The cores this process may run on; macOS and Windows lack sched_getaffinity, so there
    every core counts."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class FigurePool:
    """Figure worker processes, started once and fed (function, arguments) jobs.

    Start it early: a worker spends its first ~2 s importing matplotlib and pandas, which then
    overlaps the caller's own loading. Workers are fresh `python -m analysis.figure_worker` interpreters,
    not multiprocessing: they import only the plotting modules (not the caller's JAX), never
    inherit JAX's threads as a fork would, and need no `__main__` guard in the caller's script.
    Jobs and results travel over the workers' stdin and stdout, so nothing is written outside the
    figures' own directory. A worker ends with its caller: on Linux the kernel kills it when the
    caller dies (`PR_SET_PDEATHSIG`, asked before its imports), elsewhere it stops at the end of
    its figure, when it reads end-of-file. The pool must be started on the thread that lives as long as it (the kernel signal
    follows the thread that started the worker). With 0 workers, jobs are drawn in the caller.
    """

    def __init__(self, workers: int):
        self._jobs: queue.Queue = queue.Queue()
        self._drawn: list[tuple[int, list[Path]]] = []
        self._failures: list[str] = []
        self._submitted = 0
        self._processes: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []
        # The package's own root first: the caller may have found `analysis` through its sys.path.
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        for _ in range(workers):
            process = subprocess.Popen(
                [sys.executable, "-m", "analysis.figure_worker", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            self._processes.append(process)
            thread = threading.Thread(target=self._feed, args=(process,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def __enter__(self) -> FigurePool:
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(now=exc_type is not None)

    def submit(self, jobs: Sequence[tuple]) -> None:
        """Queues `jobs`, (function, arguments) each, drawn in the `figure_formats` in force now."""
        formats = _formats.get()
        for fn, args in jobs:
            self._jobs.put((self._submitted, fn, args, formats))
            self._submitted += 1

    def results(self) -> list[Path]:
        """The paths of every job submitted, in submission order, once all are drawn."""
        if not self._processes:
            while not self._jobs.empty():
                cli.stop_if_terminated()
                i, fn, args, formats = self._jobs.get()
                with figure_formats(formats):
                    self._drawn.append((i, fn(*args)))
        else:
            # Queue.join() without its unbounded wait: Ctrl-C and SIGTERM only set a flag, read here
            # while the workers draw.
            with self._jobs.all_tasks_done:
                while self._jobs.unfinished_tasks:
                    cli.stop_if_terminated()
                    self._jobs.all_tasks_done.wait(timeout=0.1)
        if self._failures:
            raise RuntimeError(f"a figure process failed:\n{self._failures[0]}")
        return [path for _, paths in sorted(self._drawn, key=lambda item: item[0]) for path in paths]

    def close(self, now: bool = False) -> None:
        """Stops the workers: after their current figure, or `now` (after an error or an interrupt,
        when the run's output is discarded anyway)."""
        for _ in self._processes:
            self._jobs.put(None)
        for process in self._processes:
            # Every worker was started with both pipes.
            assert process.stdin is not None and process.stdout is not None
            if now:
                process.kill()
            with contextlib.suppress(OSError):
                process.stdin.close()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
        self._processes = []

    def _feed(self, process: subprocess.Popen) -> None:
        """One worker's thread: sends it a job, waits for its reply, until the queue says stop."""
        while (job := self._jobs.get()) is not None:
            i, *work = job
            try:
                if self._failures:
                    continue  # the run fails anyway; drain the queue
                _write_frame(process.stdin, work)
                reply = _read_frame(process.stdout)
                if reply is None:
                    self._failures.append(f"the worker exited (status {process.wait()}); see its error above")
                elif reply[0] == "error":
                    self._failures.append(reply[1])
                else:
                    self._drawn.append((i, reply[1]))
            except (OSError, ValueError, pickle.PicklingError) as e:
                self._failures.append(f"{type(e).__name__}: {e}")
            finally:
                self._jobs.task_done()
        self._jobs.task_done()


def _write_frame(stream, payload) -> None:
    data = pickle.dumps(payload)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_frame(stream):
    """The next pickled payload on `stream`, or None at its end."""
    header = stream.read(8)
    if len(header) < 8:
        return None
    return pickle.loads(stream.read(struct.unpack("<Q", header)[0]))


def serve() -> None:
    """A worker of `FigurePool` (`python -m analysis.figure_worker`): draws each job read on
    stdin, replies on stdout, until end-of-file."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    # Anything a library prints goes to stderr, not into the replies.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    while (job := _read_frame(sys.stdin.buffer)) is not None:
        fn, args, formats = job
        try:
            with figure_formats(formats):
                reply = ("ok", fn(*args))
        except Exception:  # noqa: BLE001 — the caller reports it, with this traceback
            reply = ("error", traceback.format_exc())
        _write_frame(replies, reply)


class FigureCache:
    """Figures kept on disk by what they show, so a re-run that draws the same data copies them.

    A figure's key is the hash of its stem, the formats, matplotlib's version, the source of the
    modules that draw it and `content` (the caller's bytes for everything drawn: the table rows, τ,
    …), so a figure is copied only when drawing it again would give the same file. Entries are
    written to a temporary name and renamed, like the scores cache they live beside."""

    def __init__(self, directory: Path, drawing_modules: Sequence[ModuleType]):
        self.directory = directory
        code = hashlib.sha256(matplotlib.__version__.encode())
        for module in drawing_modules:
            assert module.__file__ is not None, f"{module.__name__} has no source file to hash"
            code.update(Path(module.__file__).read_bytes())
        self.code = code.hexdigest()

    def figure(self, stem: str, content: bytes, draw: Callable[[], list[Path]], out_dir: Path) -> list[Path]:
        """`out_dir/<stem>.<format>` for the formats in force: copies of cached files when all are
        there, else what `draw()` writes (then kept)."""
        formats = _formats.get()
        key = hashlib.sha256("\0".join([self.code, stem, ",".join(formats), str(PNG_DPI)]).encode() + content)
        cached = [self.directory / f"{key.hexdigest()}.{fmt}" for fmt in formats]
        if all(path.is_file() for path in cached):
            out_dir.mkdir(parents=True, exist_ok=True)
            targets = [out_dir / f"{stem}.{fmt}" for fmt in formats]
            for source, target in zip(cached, targets, strict=True):
                shutil.copyfile(source, target)
            return targets
        paths = draw()
        self.directory.mkdir(parents=True, exist_ok=True)
        for path, entry in zip(paths, cached, strict=True):
            with runinfo.atomic_file(entry, binary=True, overwrite=True) as f, open(path, "rb") as drawn:
                shutil.copyfileobj(drawn, f)
        return paths
