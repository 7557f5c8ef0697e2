"""Every key of the training configs (`train.config`) is declared with its help, and the `--help` of
the command that reads it lists the key with its default, written so that `key=value` gives the
default back."""

from __future__ import annotations

import dataclasses
import importlib
import re
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

from bertjax import settings
from train import config as train_config

COMMANDS = {
    "train.pretrain": train_config.PretrainConfig,
    "train.finetune": train_config.FinetuneConfig,
    "train.prepare": train_config.PrepareConfig,
}


def _section(annotation: Any) -> type | None:
    options = typing.get_args(annotation) if typing.get_origin(annotation) is not list else ()
    found = [k for k in (annotation, *options) if isinstance(k, type) and dataclasses.is_dataclass(k)]
    return found[0] if found else None


def keys(config: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any, bool]]:
    """(key, field, default, is_section) for every key of the config instance `config`, the keys of
    an optional section that is off (its class's defaults) and of a list's item (`key.N.field`)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        key, value = f"{prefix}{field.name}", getattr(config, field.name)
        section = _section(hints[field.name])
        yield key, field, value, section is not None and value is not None
        if section is not None:
            yield from keys(section() if value is None else value, f"{key}.")
        elif typing.get_origin(hints[field.name]) is list and _section(typing.get_args(hints[field.name])[0]):
            yield from keys(typing.get_args(hints[field.name])[0](), f"{key}.N.")


@pytest.mark.parametrize("schema", COMMANDS.values(), ids=lambda s: s.__name__)
def test_every_key_has_help(schema):
    for key, field, _, _ in keys(schema()):
        help_text = field.metadata.get("setting", {}).get("help", "")
        assert help_text.strip(), f"{schema.__name__}: {key} has no help (declare it with bertjax.settings.setting)"


@pytest.mark.parametrize("name", COMMANDS)
def test_help_lists_every_key_with_its_default(name):
    schema = COMMANDS[name]
    # As a terminal shows it (wrapped), with the line breaks undone.
    shown = " ".join(importlib.import_module(name).build_parser().format_help().split())
    listed = {line.split()[0].rstrip(":") for line in settings.describe_keys(schema)}
    expected = {key for key, *_ in keys(schema())}
    assert listed == expected, f"python -m {name} --help: keys missing {expected - listed}, extra {listed - expected}"
    for key, _, default, is_section in keys(schema()):
        if is_section:
            assert re.search(rf"(^| ){re.escape(key)}: ", shown), f"python -m {name} --help: no line for {key}"
            continue
        found = re.search(rf"(^| ){re.escape(key)} \(default: (.*?)\)(: | |$)", shown)
        assert found, f"python -m {name} --help does not list {key} with its default"
        if isinstance(default, list) and default and dataclasses.is_dataclass(default[0]):
            continue  # the list's items shown by the keys they set; each item key is checked itself
        # The default as shown, given back as an override, is the default.
        back = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={found.group(2)}"]))["v"]
        assert back == default, f"python -m {name} --help: {key} (default: {found.group(2)}) reads as {back!r}"


def test_a_section_shows_its_own_defaults_and_an_optional_one_the_keys_it_takes():
    lines = settings.describe_keys(train_config.FinetuneConfig)
    # Fine-tuning's optimizer is AdamW at 2e-5, not the class's LAMB at 1e-3.
    assert any(line.startswith("  optimizer.name (default: adamw): ") for line in lines)
    assert any(line.startswith("  optimizer.learning_rate (default: 2e-05): ") for line in lines)
    lines = settings.describe_keys(train_config.PretrainConfig)
    assert any(line.startswith("  phase2 (default: null): ") for line in lines)
    assert any(line.startswith("  phase2.max_seq_length (default: 512): ") for line in lines)
    assert any(line.startswith("  heldout.corpora (default: []): ") for line in lines)
    assert any(line.startswith("  heldout.corpora.N.kind (default: plain): ") for line in lines)
