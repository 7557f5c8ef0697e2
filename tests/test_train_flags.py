"""The training commands' flags are drawn from settings dataclasses (`bertjax.settings.add_flags`),
as the analyses' are, and resolve every shipped recipe to the config recorded before they were:
the config.yaml a run saves and the config its run.json and checkpoints hold, byte for byte
(`tests/fixtures/train_resolved/recipes.json`, recorded with the hand-written parsers)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from bertjax import cli, settings
from bertjax.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
RECIPES = json.loads((ROOT / "tests" / "fixtures" / "train_resolved" / "recipes.json").read_text(encoding="utf-8"))
# Each command's flags dataclass; -h and -v are every command's own (bertjax.cli.parser).
FLAGS = {"train.pretrain": "PretrainFlags", "train.finetune": "FinetuneFlags", "train.prepare": "PrepareFlags",
         "train.synthetic": "SyntheticFlags"}  # fmt: skip


class _Resolved(Exception):
    pass


def resolved(module: str, argv: list[str], monkeypatch) -> object:
    """The config `python -m module *argv` would run with: its `main` up to the work."""
    target = importlib.import_module(module)

    def stop(config, *args, **kwargs):
        raise _Resolved(config)

    monkeypatch.setattr(target, "prepare" if module == "train.prepare" else "run", stop)
    with pytest.raises(_Resolved) as got:
        target.main(argv)
    return got.value.args[0]


@pytest.fixture
def recipes_env(monkeypatch, shared_data):
    """The recorded paths: the recipes' `${oc.env:BERTJAX_DATA,../shared/data}` at its fallback, the
    GLUE directory and the parse cache as placeholders."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("BERTJAX_DATA", "../shared/data")
    return {"{GLUE}": str(shared_data / "glue"), "{CACHE}": str(cli.CACHE_ROOT)}


def _fill(value, places: dict[str, str]):
    text = json.dumps(value, ensure_ascii=False)
    for place, path in places.items():
        text = text.replace(place, path.replace("\\", "\\\\").replace('"', '\\"'))
    return json.loads(text)


@pytest.mark.parametrize("case", RECIPES)
def test_each_recipe_resolves_as_recorded(case, recipes_env, monkeypatch):
    recorded = _fill(RECIPES[case], recipes_env)
    module, *argv = recorded["command"]
    config = resolved(module, argv, monkeypatch)
    assert settings.resolved_yaml(config) == recorded["config.yaml"]
    assert json.loads(json.dumps(dataclasses.asdict(config))) == recorded["config"]


@pytest.mark.parametrize("case", ["pretrain-tiny-overrides", "finetune-flags", "prepare-overrides"])
def test_print_config_prints_the_resolved_config_which_reads_back(case, recipes_env, monkeypatch, capsys, tmp_path):
    recorded = _fill(RECIPES[case], recipes_env)
    module, *argv = recorded["command"]
    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).main([*argv, "--print-config"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert printed == recorded["config.yaml"]
    # The printed file as --config, with no overrides: the same config.
    path = tmp_path / "printed.yaml"
    path.write_text(printed, encoding="utf-8")
    flags = {"train.pretrain": ["--workdir", "w"], "train.prepare": ["--out", "o"],
             "train.finetune": ["--task", "sst2", "--ckpt", "m", "--workdir", "w"]}[module]  # fmt: skip
    again = resolved(module, [*flags, "--config", str(path)], monkeypatch)
    assert settings.resolved_yaml(again) == printed


@pytest.mark.parametrize("module", FLAGS)
def test_every_flag_is_a_setting_of_the_commands_flags_dataclass(module):
    target = importlib.import_module(module)
    schema = getattr(target, FLAGS[module])
    parser = target.build_parser()
    drawn = {a.dest for a in parser._actions} - {"help", "verbose"}
    assert drawn == {f.name for f in settings.flag_fields(schema)}
    # One default per field: each flag's is its field's (the overrides, positional, start empty).
    for action in parser._actions:
        field = next((f for f in dataclasses.fields(schema) if f.name == action.dest), None)
        if field is None or field.default is dataclasses.MISSING or not action.option_strings:
            continue
        assert action.default == field.default, f"python -m {module}: {action.option_strings}"


def test_a_required_flag_stays_required_beside_a_run_config(capsys):
    # --config names the run's config, not a file of the flags: --workdir is still argparse's to ask for.
    from train import pretrain

    with pytest.raises(SystemExit) as done:
        pretrain.main(["--config", "configs/pretrain/tiny.yaml"])
    assert done.value.code == 2
    assert "the following arguments are required: --workdir" in capsys.readouterr().err


def test_finetune_flags_are_typed_and_the_old_spelling_still_works(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    config = resolved("train.finetune", ["--task", "mrpc", "--init", "ckpt-dir", "--workdir", "w"], monkeypatch)
    assert (config.init, config.seeds) == ("ckpt-dir", 1)
    assert "warning: --init is deprecated, use --ckpt" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        importlib.import_module("train.finetune").main(["--task", "mrpc", "--ckpt", "c", "--workdir", "w", "--seeds", "x"])  # fmt: skip
    assert done.value.code == 2
    assert "--seeds: invalid int value: 'x'" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"unknown task 'nope' \(--task\)"):
        importlib.import_module("train.finetune").main(["--task", "nope", "--ckpt", "c", "--workdir", "w"])
