"""The one config system (bertjax.settings): each analysis tool's settings declared once in a
dataclass, its flags, API keywords and YAML generated from it."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from analysis.ablation.options import KovalevaConfig, MichelConfig
from analysis.attention.options import ClarkConfig
from analysis.heads import config as heads
from bertjax import settings
from bertjax.errors import UserError

# Each analysis CLI: its inputs, settings it accepts, and the schemas its flags fill.
COMMANDS = {
    "analysis.roles": (["--ckpt", "c"], ["--n", "7", "--roles", "local,cls", "--no-special-rows"], [heads.RolesConfig]),
    "analysis.track": (
        ["--run", "w"],
        ["--steps", "1,5", "--correction", "holm"],
        [heads.RolesConfig, heads.TrackConfig],
    ),
    "analysis.finetune_effect": (["--pre", "p", "--post", "q:mrpc"], ["--n", "9"], [heads.RolesConfig]),
    "analysis.clark": (["--ckpt", "c"], ["--analyses", "surface,probes", "--task", "mrpc"], [ClarkConfig]),
    "analysis.ablate": (["--ckpt", "c"], ["--analyses", "mask", "--n", "5"], [KovalevaConfig]),
    "analysis.prune": (["--ckpt", "c"], ["--n", "8", "--reestimate"], [MichelConfig]),
    "analysis.report": (["run"], ["--examples", "2"], [heads.ReportConfig]),
}
# What a heads tool sets differently in the shared RolesConfig.
TOOLS = {"analysis.roles": heads.ROLES_TOOL, "analysis.track": heads.TRACK_TOOL,
         "analysis.finetune_effect": heads.EFFECT_TOOL}  # fmt: skip
# The flags a command declares by hand: where its inputs go (a series, a pair of checkpoints), the
# short form of `--figures none`, and the YAML and help flags every command has.
BY_HAND = {"-h", "-v", "--config", "--print-config", "--no-figures", "--run", "--ckpt", "--pre", "--post"}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_is_a_declared_setting(name):
    """No flag is written twice: each is a field of the tool's schema (help, type, default from
    there), or one of the few a command declares by hand."""
    _, _, schemas = COMMANDS[name]
    parser = importlib.import_module(name).build_parser()
    fields = {f.name: f for schema in schemas for f in settings.flag_fields(schema)}
    for action in parser._actions:
        if set(action.option_strings) & BY_HAND:
            continue
        assert action.dest in fields, f"python -m {name}: {action.option_strings or action.dest} is no setting"
        field, tool = fields[action.dest], TOOLS.get(name, {}).get(action.dest, {})
        assert action.help.startswith(tool.get("help", field.metadata["setting"]["help"]))
        if field.default is not dataclasses.MISSING and action.default is not None and action.nargs != 0:
            converted = action.type(action.default) if isinstance(action.default, str) else action.default
            assert converted == tool.get("default", field.default), f"{name} {action.dest}: {action.default!r}"


@pytest.mark.parametrize("name", COMMANDS)
def test_print_config_reads_back_through_config(name, tmp_path, capsys):
    inputs, given, _ = COMMANDS[name]
    module = importlib.import_module(name)
    first = module.parse_args(inputs + given)
    with pytest.raises(SystemExit) as done:
        module.parse_args([*inputs, *given, "--print-config"])
    assert done.value.code == 0
    path = tmp_path / "settings.yaml"
    path.write_text(capsys.readouterr().out, encoding="utf-8")
    assert first != module.parse_args(inputs)  # the settings given are in the file, not the defaults
    again = module.parse_args([*inputs, "--config", str(path)])
    assert again == first


def test_a_flag_given_overrides_the_file_even_at_its_default(tmp_path):
    from analysis import roles

    path = tmp_path / "s.yaml"
    path.write_text("n: 12\nbatch_size: 8\ntau: '2.5'\nroles: [local, prev]\n", encoding="utf-8")
    config = roles.parse_args(["--ckpt", "c", "--config", str(path), "--n", "1000"])
    assert (config.n, config.batch_size, config.tau, config.roles) == (1000, 8, "2.5", ("local", "prev"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nn: 3\n", "unknown setting 'nn'"),
        ("n: many\n", "n: Value 'many' of type 'str' could not be converted to Integer"),
        ("- n\n", "expected a mapping of settings"),
        ("n: [1\n", "not valid YAML"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_key(text, message, tmp_path):
    from analysis import roles

    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")):
        roles.parse_args(["--ckpt", "c", "--config", str(path)])
    with pytest.raises(UserError, match="does not exist"):
        roles.parse_args(["--ckpt", "c", "--config", str(tmp_path / "none.yaml")])


def test_a_file_may_hold_the_settings_of_every_schema_a_command_fills(tmp_path):
    from analysis import track

    path = tmp_path / "s.yaml"
    path.write_text("n: 3\nsas_n: 20\ncorrection_scope: series\n", encoding="utf-8")
    config, runs = track.parse_args(["--run", "w", "--config", str(path)])
    assert (config.roles.n, config.sas_n, config.correction_scope, runs) == (3, 20, "series", ["w"])
    path.write_text("block_score: entropy\n", encoding="utf-8")  # a roles-only setting: not track's
    with pytest.raises(UserError, match="unknown setting 'block_score'"):
        track.parse_args(["--run", "w", "--config", str(path)])


def test_the_api_takes_the_flags_text_or_typed_values():
    typed = settings.from_kwargs(heads.RolesConfig, {"roles": ("local",), "tau": 2.5, "n": 4}, ckpt="c")
    text = settings.from_kwargs(heads.RolesConfig, {"roles": "local", "tau": "2.5", "n": 4}, ckpt="c")
    assert typed == text and typed.tau == "2.5"
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        settings.from_kwargs(heads.RolesConfig, {"analyses_explicit": True}, ckpt="c")
    with pytest.raises(TypeError, match="unexpected keyword argument"):  # internal: no flag sets it
        settings.from_kwargs(ClarkConfig, {"analyses_explicit": True}, skip=("ckpt",), ckpt="c")
    with pytest.raises(UserError, match="n: expected an integer"):
        settings.from_kwargs(heads.RolesConfig, {"n": "8"}, ckpt="c")


def test_a_missing_required_setting_names_its_flag():
    with pytest.raises(UserError, match="required: --ckpt"):
        settings.make(heads.RolesConfig, {})


def test_the_api_signatures_list_every_setting_with_the_tools_default():
    import inspect

    from analysis import api

    track = inspect.signature(api.track).parameters
    assert (track["persistence"].default, track["correction_scope"].default, track["figures"].default) == (2, "step", "all")  # fmt: skip
    assert "block_score" not in track and "step" not in track  # roles' only
    assert inspect.signature(api.roles).parameters["figures"].default == heads.DEFAULT_ROLES_FIGURES
    effect = inspect.signature(api.finetune_effect).parameters
    assert "tau" not in effect and effect["attention"].default == "weights"
    assert inspect.signature(api.clark).parameters["cluster_n"].default == 300
    assert inspect.signature(api.prune).parameters["random_seeds"].default == 3
    for function, schema in ((api.ablate, KovalevaConfig), (api.clark, ClarkConfig)):
        assert {f.name for f in settings.flag_fields(schema)} - {"ckpt"} <= set(inspect.signature(function).parameters)
