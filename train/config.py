"""Typed run configs: dataclass schemas, YAML files under `configs/`, dotted command-line overrides.

`load_config(Schema, path, ["train.steps=200", ...])` merges, in order, the schema's defaults, the
YAML file and the overrides, with OmegaConf type checking; an unknown key or a wrong type is a
`UserError` naming the key. The resolved config is what a run saves next to its outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from bertjax import runinfo
from bertjax.errors import UserError

T = TypeVar("T")


def load_config(schema: type[T], path: str | Path | None, overrides: Sequence[str] = ()) -> T:
    """Defaults ← YAML file ← `dotted.key=value` overrides, type-checked against `schema`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.structured(schema)
    where = ""
    try:
        if path is not None:
            where = f"{path}: "
            if not Path(path).is_file():
                raise UserError(f"{path}: config file does not exist")
            cfg = OmegaConf.merge(cfg, _load_yaml(Path(path)))
        for item in overrides:
            where = f"override {item!r}: "
            key, sep, _ = item.partition("=")
            if not sep or not key:
                raise UserError(f"{item}: an override must look like key=value")
            # from_dotlist types the value as YAML would; update() then reaches list items too.
            value = OmegaConf.select(OmegaConf.from_dotlist([item]), key)
            if OmegaConf.select(cfg, key, default=_MISSING) is _MISSING and not _is_open(cfg, key):
                raise UserError(f"{item}: unknown config key {key!r}")
            OmegaConf.update(cfg, key, value, merge=True)
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        message = str(e).splitlines()[0]
        raise UserError(f"{where}{key + ': ' if key else ''}{message}") from None


_MISSING = object()


def _load_yaml(path: Path) -> Any:
    import yaml
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{path}: not valid YAML ({where}{problem})") from None


def _is_open(cfg: Any, key: str) -> bool:
    """Whether `key` may be created: only inside a dict-typed (not a dataclass) node."""
    from omegaconf import DictConfig, OmegaConf

    parent_key = key.rpartition(".")[0]
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    return isinstance(parent, DictConfig) and OmegaConf.get_type(parent) is dict


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def save_resolved(config: Any, path: Path) -> None:
    from omegaconf import OmegaConf

    with runinfo.atomic_file(path, overwrite=True) as f:  # a resumed run's, checked the same
        f.write(OmegaConf.to_yaml(OmegaConf.structured(config)))
