"""What every `python -m ...` entry point shares: quiet logging (`-v/--verbose` for the libraries'
INFO lines), the one-line user errors and the compilation cache."""

from __future__ import annotations

import _thread
import argparse
import contextlib
import logging
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bertjax.errors import UserError

# Where bertjax keeps what it can recompute: parses, compiled XLA programs.
CACHE_ROOT = Path("~/.cache/bertjax").expanduser()


# Loggers whose INFO lines are a run's progress; every other library's INFO lines (orbax's, through
# absl, by the hundred per checkpoint; jax probing for backends it will not use) show with --verbose.
OWN_LOGGERS = ("__main__", "analysis", "benchmarks", "bertjax", "sieves", "train")
# Warnings that only restate what bertjax asked for: orbax warns on every read-only manager it opens,
# and transformers, imported without torch, that it has no models (bertjax reads tokenizers and
# configs only).
RESTATEMENTS = ("Given directory is read only", "PyTorch was not found")
# bertjax's log lines, from a CLI or from the library in a program that configured no logging.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_USER_XLA_LOG_LEVEL = os.environ.get("TF_CPP_MIN_LOG_LEVEL")


class Quiet(logging.Filter):
    """Lets through bertjax's own INFO lines and every library's warnings and errors, except the
    `RESTATEMENTS`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return record.name not in _RESTATING or _Restatement().filter(record)
        return record.name.split(".", 1)[0] in OWN_LOGGERS


# The loggers the `RESTATEMENTS` come from: absl's, which orbax logs through, and transformers'.
_RESTATING = ("absl", "transformers")


class _Restatement(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(RESTATEMENTS)


def library_logging() -> None:
    """The library's logging, whoever calls it (a CLI, a notebook, a user's program): the
    `RESTATEMENTS` are dropped at their loggers (`_RESTATING`), and bertjax's own lines come out in `LOG_FORMAT` where the program configured no
    logging. Python's default (`WARNING:analysis.x:...`) is what the first absl call sets on the
    root logger when it has no handler; the root logger is not touched here."""
    for name in _RESTATING:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Restatement) for f in logger.filters):
            logger.addFilter(_Restatement())
    for name in OWN_LOGGERS:
        logger = logging.getLogger(name)
        if name != "__main__" and not any(isinstance(h, _OwnLines) for h in logger.handlers):
            logger.addHandler(_OwnLines(logger))
            logger.propagate = False  # `_OwnLines` hands each line on itself


class _OwnLines(logging.Handler):
    """Writes a bertjax line in `LOG_FORMAT` on stderr where the program configured no logging
    (the root logger has no handler, or only the default one absl adds), and hands it on to the
    root logger's handlers, as propagation would, where it did (a CLI's `run`, a user, pytest)."""

    def __init__(self, owner: logging.Logger) -> None:
        super().__init__()
        self.owner = owner
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if not any(not _implicit(handler) for handler in root.handlers):
            sys.stderr.write(self.format(record) + "\n")
            return
        if not root.filter(record):
            return
        # pytest attaches its capturing handlers to non-propagating loggers as well as to the root:
        # those have the line already.
        for handler in root.handlers:
            if handler not in self.owner.handlers and record.levelno >= handler.level:
                handler.handle(record)


def _implicit(handler: logging.Handler) -> bool:
    """Whether `handler` is `logging.basicConfig()`'s with no arguments: absl's on its first call."""
    return type(handler) is logging.StreamHandler and getattr(handler.formatter, "_fmt", None) == logging.BASIC_FORMAT


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's `(default: X)` after every flag that takes a value, except where the help text
    already says what its default is (a None default means something: "default: the hub")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Paragraphs filled as argparse fills them, except that a line indented by two spaces (an
        entry of a list: the config keys of the training commands) starts a line of its own, and
        wraps under a hanging indent."""
        out, paragraph = [], []
        for line in [*text.splitlines(), None]:
            if line is not None and not line.startswith("  "):
                paragraph.append(line)
                continue
            if paragraph:
                out.append(super()._fill_text("\n".join(paragraph), width, indent))
                paragraph = []
            if line is not None:
                out.append(textwrap.fill(line.strip(), width, initial_indent=indent + "  ", break_on_hyphens=False,
                                         subsequent_indent=indent + "      "))  # fmt: skip
        return "\n".join(out)


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that a required setting (`settings.add_flags` marks its flag
    `config_may_supply`) is not required of the command line where a `--config` file is given: the
    file may hold it (what `--print-config` wrote), and `settings.make` names it if neither does."""

    def parse_known_args(self, args=None, namespace=None):
        given = sys.argv[1:] if args is None else list(args)
        if not any(a == "--config" or a.startswith("--config=") for a in given):
            return super().parse_known_args(args, namespace)
        relaxed = [a for a in self._actions if getattr(a, "config_may_supply", False)]
        for action in relaxed:
            action.required = False
        try:
            return super().parse_known_args(args, namespace)
        finally:
            for action in relaxed:
                action.required = True


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """The parser of `python -m PROG`, described by the first paragraph of its module's `doc`,
    with every flag's default in `--help` and `-v/--verbose`."""
    p = Parser(prog=f"python -m {prog}", description=doc.split("\n\n")[0], formatter_class=HelpFormatter)
    add_verbose_argument(p)
    return p


class DeprecatedAliases(argparse.Action):
    """Stores a flag's value; every option string after the first is an old spelling, kept for one
    release, and using it prints one line on stderr naming the new one."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string is not None and option_string != self.option_strings[0]:
            print(f"warning: {option_string} is deprecated, use {self.option_strings[0]}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def print_wrote(out: str | Path) -> None:
    """The last line of a run that wrote a directory: where its outputs are."""
    print(f"wrote {Path(out).expanduser().resolve()}")


def add_verbose_argument(p: argparse.ArgumentParser) -> None:
    """`-v/--verbose`, the same in every CLI: it takes effect while the arguments are parsed, before
    jax starts its backends, so their start-up lines show too."""
    p.add_argument(
        "-v", "--verbose", action=_Verbose, nargs=0, default=False,
        help="also show the libraries' INFO logs (orbax's checkpointing, jax's backend start-up)",
    )  # fmt: skip


class _Verbose(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, True)
        set_verbose(True)


def set_verbose(verbose: bool) -> None:
    """Shows (True) or hides (False) the libraries' INFO lines on the root logger's handlers, and
    XLA's C++ INFO lines where its backends have not started yet (a user's TF_CPP_MIN_LOG_LEVEL wins)."""
    for handler in logging.getLogger().handlers:
        for quiet in [f for f in handler.filters if isinstance(f, Quiet)]:
            handler.removeFilter(quiet)
        if not verbose:
            handler.addFilter(Quiet())
    if _USER_XLA_LOG_LEVEL is None:
        # XLA reads it once, at its first C++ log line, which comes when jax starts a backend.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0" if verbose else "1"
    if not verbose:
        # transformers' advice at import, e.g. "PyTorch was not found. Models won't be available"
        # where only the runtime is installed: bertjax reads tokenizers and configs only.
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised by the next `stop_if_terminated` of a loop (or `GRACE_S` after it came, where no
    loop reads it), so that the run cleans up as it does for Ctrl-C."""


# SIGINT (Ctrl-C) and SIGTERM as they came since `cli.run` started; the first decides. No lock:
# handlers run on the main thread between its bytecodes, and would wait forever on a lock the main
# thread held.
_SIGNALS: list[int] = []

# Seconds a first signal waits for a loop to read it before it is raised wherever the run is: model
# tracing, data generation and compilation read no flag, and took minutes to reach a loop that did.
GRACE_S = 3.0

# What the watcher of a run's first signal (a thread, `_raise_unless_read`) shares with the main
# thread. `run`: the `cli.run` under way (None outside one, where nothing is watched); `main`: its
# thread; `hook`: the `sys.unraisablehook` it replaced; `acted`: the signal has been read by a loop
# or raised; `due`: the watcher's own SIGTERM is on its way, to be raised; `force`: a second
# Ctrl-C, raised whatever the loops do; `reading`: loops under way that read the flag after each
# item, however long an item takes (the trainer's steps).
_WATCH: dict = {"run": None, "main": None, "hook": None, "acted": False, "due": False, "force": False, "reading": 0}
# The watcher's checks and its signal against the end of the run. Never taken by the handler.
_WATCH_LOCK = _thread.allocate_lock()


def _first_signal() -> int | None:
    return _SIGNALS[0] if _SIGNALS else None


def _exception() -> type[KeyboardInterrupt]:
    return Terminated if _first_signal() == signal.SIGTERM and not _WATCH["force"] else KeyboardInterrupt


def on_signal(signum: int, frame: object) -> None:
    """SIGINT's and SIGTERM's handler: a flag that the loops read (`stop_if_terminated`). Not an
    exception raised here: Python raises it wherever the main thread is, and where that is a
    garbage-collection callback (JAX's `_xla_gc_callback`) or a finaliser, it is printed as
    "Exception ignored" and dropped; an analysis then finished and exited 0.

    Where no loop reads the flag within `GRACE_S` (a model traced, data generated), the watcher
    started here has it raised after all, by a signal of its own. A second Ctrl-C while the first is
    pending raises `KeyboardInterrupt` at once, wherever the run is: the way out of a wait no loop
    checks (a download, a lock). Either one, should Python drop it, is dropped silently by
    `_dropped` and raised again by the watcher."""
    if _WATCH["due"]:
        _WATCH["due"] = False
        raise _exception()
    _SIGNALS.append(signum)
    if len(_SIGNALS) == 1 and _WATCH["run"] is not None:
        _thread.start_new_thread(_raise_unless_read, (_WATCH["run"], time.monotonic()))
    if len(_SIGNALS) > 1 and signum == signal.SIGINT:
        _WATCH["force"] = _WATCH["acted"] = True
        raise KeyboardInterrupt


def _raise_unless_read(run: object, since: float) -> None:
    """The watcher of `run`'s first signal: has it raised in the main thread (by a SIGTERM, which
    also ends a wait in a lock or a sleep) once `GRACE_S` has passed with no loop acting on it, and
    again whenever Python dropped it; ends with the run."""
    while True:
        time.sleep(0.1)
        with _WATCH_LOCK:
            if _WATCH["run"] is not run:
                return
            late = not _WATCH["reading"] and time.monotonic() - since >= GRACE_S
            if not _WATCH["acted"] and (_WATCH["force"] or late):
                _WATCH["acted"] = _WATCH["due"] = True
                signal.pthread_kill(_WATCH["main"], signal.SIGTERM)


def _dropped(unraisable) -> None:
    """`sys.unraisablehook` during a run: a signal's exception that Python could not raise where it
    came (a garbage-collection callback, a finaliser) is dropped without the "Exception ignored"
    traceback, for the watcher to raise it again."""
    if _WATCH["run"] is not None and _SIGNALS and issubclass(unraisable.exc_type, KeyboardInterrupt):
        _WATCH["acted"] = False
        return
    _WATCH["hook"](unraisable)


@contextlib.contextmanager
def reading_the_flag() -> Iterator[None]:
    """A loop that reads the flag after each item and acts on it itself (the trainer saves a
    checkpoint after its step at SIGTERM): a signal is not raised inside it, however long an item
    takes."""
    _WATCH["reading"] += 1
    try:
        yield
    finally:
        _WATCH["reading"] -= 1


def _acted(first: bool) -> bool:
    _WATCH["acted"] = _WATCH["acted"] or first
    return first


def terminated() -> bool:
    """Whether SIGTERM came first (the trainer then saves a checkpoint before it stops)."""
    return _acted(_first_signal() == signal.SIGTERM)


def interrupted() -> bool:
    """Whether Ctrl-C came first."""
    return _acted(_first_signal() == signal.SIGINT)


def stop_if_terminated() -> None:
    """Raises `Terminated` if SIGTERM came, `KeyboardInterrupt` if Ctrl-C did: called by the loops
    that take a run's time (the batches of a forward pass, encoding, parsing, preparing data,
    drawing figures, training) and by `cli.run` when the command returns."""
    if _first_signal() is not None:
        _WATCH["acted"] = True
        raise _exception()


class _StderrHandler(logging.StreamHandler):
    """Writes to the `sys.stderr` of the moment: a handler holding the stream it was made with
    writes into a closed one once that is replaced (a notebook cell's, a test's captured stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def run(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> None:
    """Runs `main(argv)`; a `UserError` becomes `error: <message>` on stderr and exit status 2,
    Ctrl-C exit status 130 and SIGTERM 143 (the shell's 128 + signal), after the same clean-up."""
    # force: absl (imported with jax) has already configured the root logger at WARNING.
    logging.basicConfig(
        level=logging.INFO,
        format=LOG_FORMAT,
        handlers=[_StderrHandler()],
        force=True,
    )
    set_verbose(False)
    use_compilation_cache()
    _SIGNALS.clear()
    # Ctrl-C stays ignored where the process started with it ignored (a shell's background job),
    # as Python itself leaves it.
    handled = [signal.SIGTERM] + [signal.SIGINT] * (signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    previous = {signum: signal.signal(signum, on_signal) for signum in handled}
    _WATCH.update(run=object(), main=threading.get_ident(), hook=sys.unraisablehook, acted=False, due=False,
                  force=False)  # fmt: skip
    sys.unraisablehook = _dropped
    try:
        try:
            main(argv)
        finally:
            try:
                with _WATCH_LOCK:  # the watcher sends nothing from now on
                    _WATCH["run"] = None
            finally:
                # Restored first: a signal from now on takes its usual course (SIGTERM's default
                # action ends the process, Ctrl-C raises inside this `try`), and one before it is in
                # the flag, read next.
                for signum in handled:
                    signal.signal(signum, signal.SIG_DFL if previous[signum] is None else previous[signum])
                # A hook set on top of ours during the run stays (orbax's race filter does, after a
                # failed read, for the reports that come at exit); ours then only passes on.
                if sys.unraisablehook is _dropped:
                    sys.unraisablehook = _WATCH["hook"]
        stop_if_terminated()  # came after the last loop's check
    except UserError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    except Terminated:
        print("error: terminated", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        _SIGNALS.clear()  # this run's: a later one in the same process (a test, a notebook) starts afresh


def use_compilation_cache() -> None:
    """Keeps compiled programs on disk (JAX's persistent cache, for compiles over a second), so a
    new process skips XLA compilation it has done before: on a GPU, compiling an analysis' padded
    batch shapes costs more than running them. `JAX_COMPILATION_CACHE_DIR` chooses another
    directory and `JAX_ENABLE_COMPILATION_CACHE=false` turns it off."""
    if "jax" not in sys.modules:
        # jax reads its flags' environment variables when it is imported; set this way, a CLI's
        # `--help` (parsed after this) does not wait for jax to load.
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(CACHE_ROOT / "xla"))
        return
    import jax

    # jax.config sets each flag as an attribute at run time, which its class does not declare.
    if jax.config.jax_compilation_cache_dir is None:  # type: ignore[attr-defined]
        jax.config.update("jax_compilation_cache_dir", str(CACHE_ROOT / "xla"))
