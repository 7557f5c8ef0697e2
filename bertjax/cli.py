"""What every `python -m ...` entry point shares: logging set-up and the one-line user errors."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from bertjax.errors import UserError


def run(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> None:
    """Runs `main(argv)`; a `UserError` becomes `error: <message>` on stderr and exit status 2."""
    # force: absl (imported with jax) has already configured the root logger at WARNING.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    try:
        main(argv)
    except UserError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
