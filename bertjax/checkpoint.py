"""The on-disk layout of bertjax training checkpoints, and reading their parameters alone.

A training run's workdir holds `checkpoints/`, an orbax `CheckpointManager` directory with one
folder per saved step. Each step has the items

- `params`: the model parameters as a flat dict `{"bert/encoder/layer/0/...": array}` (flat string
  keys survive any orbax version and any sharding unchanged);
- `meta`: JSON (see `make_meta`) with the architecture, the HF-style model config, the shapes of
  the params, the tokenizer location (relative to the workdir) and the resolved run config;

plus the items the trainer adds for an exact resume (optimizer state, data position, RNG). The
checkpoint *policy* (when to save, what to keep, resume order) lives in `train.checkpoints`; this
module only fixes the layout so analysis can load params without knowing about training.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from bertjax.errors import UserError

CHECKPOINTS = "checkpoints"
PARAMS = "params"
META = "meta"
SEP = "/"


def flatten_params(state: nnx.State) -> dict[str, jax.Array]:
    return {SEP.join(str(p) for p in path): v.get_value() for path, v in nnx.to_flat_state(state)}


def unflatten_params(abstract_state: nnx.State, flat: dict[str, Any]) -> nnx.State:
    """The inverse of `flatten_params`, shaped like `abstract_state` (from `nnx.split`)."""
    return nnx.from_flat_state(
        [(path, v.replace(value=flat[path_key(path)])) for path, v in nnx.to_flat_state(abstract_state)]
    )


def make_meta(model: nnx.Module, tokenizer: str, run_config: dict[str, Any]) -> dict[str, Any]:
    params = flatten_params(nnx.state(model, nnx.Param))
    return {
        "architecture": type(model).__name__,
        "model_config": model.config.to_hf_dict(type(model).__name__),
        "param_shapes": {k: [list(v.shape), str(v.dtype)] for k, v in params.items()},
        "tokenizer": tokenizer,
        "run_config": run_config,
    }


def save_args(params: dict[str, jax.Array], meta: dict[str, Any]) -> dict[str, ocp.args.CheckpointArgs]:
    """The items every checkpoint has; the trainer adds its own to the same `Composite`."""
    return {PARAMS: ocp.args.StandardSave(params), META: ocp.args.JsonSave(meta)}


def path_key(path: tuple) -> str:
    return SEP.join(str(p) for p in path)


def checkpoint_dir(path: Path) -> Path | None:
    """The orbax manager directory for a run workdir or the directory itself; None if neither."""
    for candidate in (path / CHECKPOINTS, path):
        if candidate.is_dir() and any(_step_of(c) is not None for c in candidate.iterdir()):
            return candidate
    return None


def _step_of(folder: Path) -> int | None:
    if folder.is_dir() and folder.name.isdigit() and (folder / META).is_dir():
        return int(folder.name)
    return None


def available_steps(directory: Path) -> list[int]:
    return sorted(s for s in (_step_of(c) for c in directory.iterdir()) if s is not None)


def resolve_step(path: Path, step: int | None) -> tuple[Path, int]:
    """(manager directory, step) for a workdir, a checkpoints directory or one step's folder."""
    if _step_of(path) is not None:
        if step is not None and step != int(path.name):
            raise UserError(f"{path} is the checkpoint of step {path.name}, not of step {step}")
        return path.parent, int(path.name)
    directory = checkpoint_dir(path)
    if directory is None:
        raise UserError(f"{path}: no bertjax checkpoints found (expected {CHECKPOINTS}/<step>/)")
    steps = available_steps(directory)
    if step is None:
        return directory, steps[-1]
    if step not in steps:
        raise UserError(f"{directory}: no checkpoint for step {step}; available: {steps}")
    return directory, step


def _orbax_race(unraisable) -> bool:
    """Whether an unraisable error is what orbax and TensorStore report after a read or write has
    failed: orbax closes its event loop while other arrays' operations are in flight, and each
    completes as a TensorStore callback finding the loop closed (`RuntimeError: Event loop is
    closed`, ~120 tracebacks for a 1-layer model's save) or as an orbax coroutine collected
    unfinished, its TensorStore error unretrieved."""
    value, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
    closed_loop = isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
    return closed_loop or (code is not None and "orbax" in code.co_filename)


@contextlib.contextmanager
def orbax_race_reports_held() -> Iterator[None]:
    """Around an orbax read or write: the race's reports (`_orbax_race`) are dropped, so that a
    failure is the one line the caller raises. After a failure the filter stays, since the reports
    keep coming until the in-flight operations end, at the latest at exit; other unraisable errors
    are reported as before."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not _orbax_race(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    yield
    sys.unraisablehook = previous


def read_meta(directory: Path, step: int) -> dict[str, Any]:
    manager = ocp.CheckpointManager(directory, item_names=(META,), options=_read_only())
    try:
        return manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise UserError(f"{directory / str(step)}: unreadable checkpoint metadata ({e})") from None


def read_params(directory: Path, step: int, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
    """Restores the `params` item into the shapes (and shardings) of `abstract`."""
    # Orbax's array restore refuses relative paths (`--ckpt runs/tiny` would fail).
    manager = ocp.CheckpointManager(Path(directory).absolute(), item_names=(PARAMS,), options=_read_only())
    try:
        with orbax_race_reports_held():
            restored = manager.restore(step, args=ocp.args.Composite(**{PARAMS: ocp.args.StandardRestore(abstract)}))
    except (FileNotFoundError, KeyError) as e:
        raise UserError(f"{directory / str(step)}: cannot restore params ({e})") from None
    except Exception as e:  # noqa: BLE001 (orbax wraps TensorStore's errors, a truncated file among them, in a bare Exception)
        raise UserError(f"{directory / str(step)}: checkpoint step {step} is unreadable: {_unreadable(e)}") from None
    finally:
        # Its threads would otherwise outlive the error and print tracebacks at interpreter exit.
        manager.close()
    return restored[PARAMS]


def _unreadable(error: BaseException) -> str:
    """The array TensorStore could not read, and why, from an orbax exception chain."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        found = re.search(r'Error reading "([^"]+)"[^:]*: (.*)', str(error))
        if found:
            array = found.group(1).rsplit("/", 1)[0]  # the key is "<array>/<chunk index>"
            return f"array {array} ({found.group(2).splitlines()[0][:160]})"
        error = error.__cause__ or error.__context__
    return " ".join(str(seen[0]).split())[:200]


def _read_only() -> ocp.CheckpointManagerOptions:
    # save_interval_steps=0: what orbax would set itself, with a warning, for every manager opened.
    return ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
