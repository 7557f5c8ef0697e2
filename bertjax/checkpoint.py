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
from typing import TYPE_CHECKING, Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from bertjax.errors import UserError

# The folders' layout is bertjax.steps' (no JAX there), named here too as the callers always have.
from bertjax.steps import CHECKPOINTS as CHECKPOINTS
from bertjax.steps import META as META
from bertjax.steps import available_steps as available_steps
from bertjax.steps import checkpoint_dir as checkpoint_dir
from bertjax.steps import resolve_step as resolve_step

if TYPE_CHECKING:
    from bertjax.model import Model

PARAMS = "params"
SEP = "/"


def flatten_params(state: nnx.State) -> dict[str, jax.Array]:
    return {SEP.join(str(p) for p in path): v.get_value() for path, v in nnx.to_flat_state(state)}


def unflatten_params(abstract_state: nnx.State, flat: dict[str, Any]) -> nnx.State:
    """The inverse of `flatten_params`, shaped like `abstract_state` (from `nnx.split`)."""
    return nnx.from_flat_state(
        [(path, v.replace(value=flat[path_key(path)])) for path, v in nnx.to_flat_state(abstract_state)]
    )


def make_meta(model: Model, tokenizer: str, run_config: dict[str, Any]) -> dict[str, Any]:
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
        meta = manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise UserError(f"{directory / str(step)}: unreadable checkpoint metadata ({e})") from None
    problem = _meta_problem(meta)
    if problem:
        raise UserError(f"{directory / str(step)}: unreadable checkpoint metadata ({problem})")
    return meta


def _meta_problem(meta: Any) -> str | None:
    """What makes a step's meta unlike `make_meta`'s, in the fields the loaders read, or None: an
    edited or corrupt meta was a TypeError or AttributeError traceback wherever it was first read."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    if not isinstance(meta.get("param_shapes"), dict):
        return f"param_shapes is {type(meta['param_shapes']).__name__ if 'param_shapes' in meta else 'missing'}, not a JSON dict"
    # A loader needs the model's config (`pretrained.load_config` says so when it is missing); a
    # training step's own checks need only the shapes.
    for key, kind in (("model_config", dict), ("tokenizer", str)):
        if key in meta and not isinstance(meta[key], kind):
            return f"{key} is {type(meta[key]).__name__}, not a JSON {kind.__name__}"
    if not isinstance(meta.get("run_config"), dict | None):
        return f"run_config is {type(meta['run_config']).__name__}, not a JSON object"
    for name, entry in meta["param_shapes"].items():
        shape, dtype = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
        if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
            return f"param_shapes[{name!r}] is not [shape, dtype]"
        try:
            jax.numpy.dtype(dtype if isinstance(dtype, str) else "not a name")
        except TypeError:
            return f"param_shapes[{name!r}] has dtype {dtype!r}, which numpy does not know"
    return None


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
    link: BaseException | None = error
    while link is not None and link not in seen:
        seen.append(link)
        found = re.search(r'Error reading "([^"]+)"[^:]*: (.*)', str(link))
        if found:
            array = found.group(1).rsplit("/", 1)[0]  # the key is "<array>/<chunk index>"
            return f"array {array} ({found.group(2).splitlines()[0][:160]})"
        link = link.__cause__ or link.__context__
    return " ".join(str(seen[0]).split())[:200]


def _read_only() -> ocp.CheckpointManagerOptions:
    # save_interval_steps=0: what orbax would set itself, with a warning, for every manager opened.
    return ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
