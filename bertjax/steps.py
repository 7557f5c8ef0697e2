"""A training run's checkpoint folders on disk (`<workdir>/checkpoints/<step>/`), read without orbax
or JAX: a CLI checks a `--step` before its heavy imports (`bertjax.checkpoint` restores them)."""

from __future__ import annotations

from pathlib import Path

from bertjax.errors import UserError

CHECKPOINTS = "checkpoints"
META = "meta"


def checkpoint_dir(path: Path) -> Path | None:
    """The orbax manager directory for a run workdir or the directory itself; None if neither."""
    for candidate in (path / CHECKPOINTS, path):
        if candidate.is_dir() and any(step_of(c) is not None for c in candidate.iterdir()):
            return candidate
    return None


def step_of(folder: Path) -> int | None:
    """The step of one checkpoint's folder; None for any other path."""
    if folder.is_dir() and folder.name.isdigit() and (folder / META).is_dir():
        return int(folder.name)
    return None


def available_steps(directory: Path) -> list[int]:
    return sorted(s for s in (step_of(c) for c in directory.iterdir()) if s is not None)


def resolve_step(path: Path, step: int | None) -> tuple[Path, int]:
    """(manager directory, step) for a workdir, a checkpoints directory or one step's folder."""
    if step_of(path) is not None:
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
