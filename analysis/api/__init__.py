"""The analyses as Python functions, for notebooks: one call each, mirroring the CLIs.

`roles(ckpt, task=..., n=...)`, `track(ckpt=[...])`, `finetune_effect(pre, post)`, `clark(ckpt)`,
`ablate(ckpt)`, `prune(ckpt)` and `report(run_dir)` take the flags of `python -m analysis.roles`,
`analysis.track`, ... as keyword arguments with the same names (`--max-length` is `max_length=`,
`--no-special-rows` is `special_rows=False`, `--no-figures` is `figures="none"`) and defaults,
check them with the same checks, and raise the CLI's one-line error as a `UserError`. They return
a result holding every CSV as a DataFrame (its rows as written), the per-sequence scores where the
CLI saves them, the settings and run.json; in Jupyter a roles or track result shows the report's
role grid and head cards, the others their figures and tables. `head_view` shows one head's
attention on a sentence or pair of one's own.

The entry points parse their flags into the same config, and a command and a call are one code
path, the runner of `analysis.tools` (`execute`): compute, then the one writer of the tool. The one
difference is `out`: a call without `out=` computes and writes nothing; its result is held in memory
(`save(path)` writes it as `--out` would), so that repeated calls in a kernel need no fresh
directory each. `report`'s page is its result: written where `out` says, by default into RUN_DIR.

The heads analyses are in `analysis.api.heads`, Clark et al.'s in `analysis.api.attention`,
Kovaleva et al.'s and Michel et al.'s in `analysis.api.ablation`; the results' shared parts in
`analysis.api.common`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from analysis import tools
from bertjax.errors import UserError

# The names above by the module that defines them, imported on first use: a CLI (or a notebook)
# that runs one analysis family does not wait for the others' imports (`analysis.track` for
# Kovaleva's, Michel's and Clark's: scipy.stats, spaCy's pipeline code, the probes). Each tool's
# come from its row of `analysis.tools.TOOLS`; the names no tool owns are listed here.
_SHARED = {"FigureFile": "analysis.api.common", "TablesResult": "analysis.api.common",
           "HeadView": "analysis.api.heads", "head_view": "analysis.api.heads"}  # fmt: skip
_LAZY = _SHARED | tools.api_names()

if TYPE_CHECKING:
    from collections.abc import Callable

    from analysis.api.ablation import (
        AblateResult,
        PruneResult,
        ablate_config,
        prune_config,
        run_ablate,
        run_prune,
    )
    from analysis.api.attention import ClarkResult, clark_config, run_clark
    from analysis.api.common import FigureFile, TablesResult
    from analysis.api.heads import (
        FinetuneEffectResult,
        HeadView,
        Report,
        RolesResult,
        TrackResult,
        head_view,
        roles_config,
        run_finetune_effect,
        run_report,
        run_roles,
        run_track,
    )

    # The calls `analysis.tools.api_function` makes from the rows.
    ablate: Callable[..., AblateResult]
    clark: Callable[..., ClarkResult]
    finetune_effect: Callable[..., FinetuneEffectResult | None]
    prune: Callable[..., PruneResult]
    report: Callable[..., Report]
    roles: Callable[..., RolesResult | None]
    track: Callable[..., TrackResult | None]


def __getattr__(name: str) -> Any:
    # A tool registered after this module was imported (a package's analysis) is found too.
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in tools.TOOLS:
        return tools.api_function(name)
    raise AttributeError(f"module 'analysis.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *tools.TOOLS})


__all__ = [
    "AblateResult", "ClarkResult", "FigureFile", "FinetuneEffectResult", "HeadView", "PruneResult", "Report",
    "RolesResult", "TablesResult", "TrackResult", "UserError", "ablate", "ablate_config", "clark", "clark_config",
    "finetune_effect", "head_view", "prune", "prune_config", "report", "roles", "roles_config", "run_ablate",
    "run_clark", "run_finetune_effect", "run_prune", "run_report", "run_roles", "run_track", "track",
]  # fmt: skip
