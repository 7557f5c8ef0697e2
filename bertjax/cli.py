"""What every `python -m ...` entry point shares: logging set-up and the one-line user errors."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import jax

from bertjax.errors import UserError

# Where bertjax keeps what it can recompute: parses, compiled XLA programs.
CACHE_ROOT = Path("~/.cache/bertjax").expanduser()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that it cleans up as it does for Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def run(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> None:
    """Runs `main(argv)`; a `UserError` becomes `error: <message>` on stderr and exit status 2,
    Ctrl-C exit status 130 and SIGTERM 143 (the shell's 128 + signal), after the same clean-up."""
    # force: absl (imported with jax) has already configured the root logger at WARNING.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    use_compilation_cache()
    # The trainer puts its own handler (save a checkpoint, then stop) in place while it trains.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        main(argv)
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
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def use_compilation_cache() -> None:
    """Keeps compiled programs on disk (JAX's persistent cache, for compiles over a second), so a
    new process skips XLA compilation it has done before: on a GPU, compiling an analysis' padded
    batch shapes costs more than running them. `JAX_COMPILATION_CACHE_DIR` chooses another
    directory and `JAX_ENABLE_COMPILATION_CACHE=false` turns it off."""
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(CACHE_ROOT / "xla"))
