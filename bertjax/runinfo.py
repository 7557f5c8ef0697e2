"""What every output directory records in its `run.json`: versions, commit, device, file hashes."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import jax

PACKAGES = ("bertjax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy", "transformers", "tokenizers", "spacy")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["git_commit"] = git_commit()
    return found


def environment() -> dict[str, Any]:
    devices = jax.devices()
    return {
        "versions": versions(),
        "devices": {"count": len(devices), "kind": devices[0].device_kind, "platform": devices[0].platform},
        "processes": jax.process_count(),
        "host": platform.node(),
        "command": sys.argv,
    }


def write_run_json(directory: Path, info: dict[str, Any]) -> None:
    """Atomically writes `run.json` (the settings and timings given, plus the environment)."""
    path = Path(directory) / "run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**info, **environment()}, indent=2, default=str) + "\n")
    tmp.replace(path)
