"""What every output directory records in its `run.json` (versions, commit, device, file hashes),
and how it is written: whole or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import jax

from bertjax.errors import UserError

PACKAGES = ("bertjax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy", "transformers", "tokenizers", "spacy")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5, check=False
        )
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether the checkout differs from its commit (then the commit alone does not say what ran);
    None outside a checkout."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["git_commit"] = git_commit()
    found["git_dirty"] = git_dirty()
    return found


def environment() -> dict[str, Any]:
    devices = jax.devices()
    return {
        "versions": versions(),
        "devices": {"count": len(devices), "kind": devices[0].device_kind, "platform": devices[0].platform},
        "processes": jax.process_count(),
        "host": platform.node(),
        "command": sys.argv,
        # Paths in the settings are as typed; relative ones are relative to this.
        "cwd": os.getcwd(),
    }


def write_run_json(directory: Path, info: dict[str, Any]) -> None:
    """Atomically writes `run.json` (the settings and timings given, plus the environment)."""
    path = Path(directory) / "run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**info, **environment()}, indent=2, default=str) + "\n")
    tmp.replace(path)


# Names what made an output directory, so that --overwrite can tell an earlier output of the same
# kind from anything else that holds a run.json (a training workdir does).
OUTPUT_MARKER = ".bertjax-output"
ANALYSIS_OUTPUT = "analysis output"


@contextlib.contextmanager
def atomic_out(out: str | Path, overwrite: bool = False, kind: str = ANALYSIS_OUTPUT) -> Iterator[Path]:
    """A temporary directory beside `--out` to write into; renamed to `--out` when the block
    completes, removed if it raises, so an output directory is never half-written. Checks that
    `--out` can be written before any work starts. `overwrite` replaces an earlier output of the
    same `kind` (marked so by this function) and nothing else, so a mistyped `--out` cannot delete a
    training run or a folder of other files."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise UserError(f"--out {out} is not empty; pass --overwrite to replace it")
        marker = out / OUTPUT_MARKER
        if not marker.is_file() or marker.read_text().strip() != kind:
            raise UserError(
                f"--out {out} is not an earlier {kind} (it has no {OUTPUT_MARKER} saying so); --overwrite replaces only those"
            )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        # mkdtemp makes it private (0700); the output gets the mode any new directory would.
        tmp.chmod(0o777 & ~_umask())
        (tmp / OUTPUT_MARKER).write_text(kind + "\n")
    except OSError as e:
        raise UserError(f"--out {out}: cannot write there ({e.strerror})") from None
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
