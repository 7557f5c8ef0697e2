"""The import rules of docs/layout.md hold: entry points are leaves, and packages import one way.

Parsed with `ast` (every import, including ones inside functions), so a rule broken anywhere in the
code fails here, not in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "bertjax", "sieves", "train", "benchmarks")
# What each top-level package may import of the others (itself always).
ALLOWED = {
    "bertjax": set(),
    "sieves": {"bertjax"},
    # The probes inside pre-training score with the sieves (docs/layout.md).
    "train": {"sieves", "bertjax"},
    "analysis": {"sieves", "bertjax"},
    "benchmarks": {"analysis", "sieves", "bertjax", "train"},
}
# Inside analysis: the shared layer imports no analysis family.
FAMILIES = ("analysis.heads", "analysis.attention", "analysis.ablation")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def imported(path: Path) -> set[str]:
    """Every module `path` imports, with `from package import module` resolved to the module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(
                f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES
            )
    return names


def is_entry_point(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


ENTRY_POINTS = {name for name, path in MODULES.items() if name.startswith("analysis.") and is_entry_point(path)}


def test_the_analysis_entry_points_are_found():
    expected = {"analysis.roles", "analysis.track", "analysis.finetune_effect", "analysis.clark", "analysis.ablate",
                "analysis.prune", "analysis.report"}  # fmt: skip
    assert expected <= ENTRY_POINTS
    # Entry points sit at the top of `analysis`, so `python -m analysis.X` stays short.
    assert all(name.count(".") == 1 for name in ENTRY_POINTS)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_an_entry_point(name: str):
    leaked = imported(MODULES[name]) & (ENTRY_POINTS - {name})
    assert not leaked, f"{name} imports the entry point(s) {sorted(leaked)}; move what it needs into a library module"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_packages_import_one_way(name: str):
    own = name.split(".")[0]
    others = {m.split(".")[0] for m in imported(MODULES[name])} & (set(PACKAGES) - {own})
    assert others <= ALLOWED[own], f"{name} imports {sorted(others - ALLOWED[own])}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("analysis.common")))
def test_the_shared_layer_imports_no_family(name: str):
    families = {m for m in imported(MODULES[name]) if m.startswith(FAMILIES)}
    assert not families, f"{name} imports {sorted(families)}: the shared layer must not depend on an analysis family"


def test_a_planted_entry_point_import_is_caught(tmp_path: Path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from analysis import roles\n    return roles\n")
    assert imported(planted) & ENTRY_POINTS == {"analysis.roles"}
