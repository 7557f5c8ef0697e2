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
    assert (config.n, config.batch_size, config.tau, config.roles) == (1000, 8, 2.5, ("local", "prev"))


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
    assert typed == text and typed.tau == 2.5
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        settings.from_kwargs(heads.RolesConfig, {"analyses_explicit": True}, ckpt="c")
    with pytest.raises(TypeError, match="unexpected keyword argument"):  # internal: no flag sets it
        settings.from_kwargs(ClarkConfig, {"analyses_explicit": True}, ckpt="c")
    with pytest.raises(UserError, match="n: expected an integer"):
        settings.from_kwargs(heads.RolesConfig, {"n": "8"}, ckpt="c")


def test_a_keyword_may_be_named_as_its_flag_where_the_field_is_named_otherwise():
    # clark's `--task` sets the field `inputs`: the flag's name is the keyword the docs promise.
    by_flag = settings.from_kwargs(ClarkConfig, {"task": "mrpc"}, ckpt="c")
    assert by_flag == settings.from_kwargs(ClarkConfig, {"inputs": "mrpc"}, ckpt="c")
    assert by_flag.inputs == "mrpc"
    with pytest.raises(TypeError, match="got both task= and inputs="):
        settings.from_kwargs(ClarkConfig, {"task": "mrpc", "inputs": "qnli"}, ckpt="c")


def test_a_missing_required_setting_names_its_flag():
    with pytest.raises(UserError, match="required: --ckpt"):
        settings.make(heads.RolesConfig, {})


def test_the_api_signatures_list_every_setting_with_the_tools_default():
    import inspect

    from analysis import api

    track = inspect.signature(api.track).parameters
    assert (track["persistence"].default, track["correction_scope"].default, track["figures"].default) == (2, "step", ("all",))  # fmt: skip
    assert "block_score" not in track and "step" not in track  # roles' only
    assert inspect.signature(api.roles).parameters["figures"].default == heads.DEFAULT_ROLES_FIGURES
    effect = inspect.signature(api.finetune_effect).parameters
    assert "tau" not in effect and effect["attention"].default == "weights"
    assert inspect.signature(api.clark).parameters["cluster_n"].default == 300
    assert inspect.signature(api.prune).parameters["random_seeds"].default == 3
    for function, schema in ((api.ablate, KovalevaConfig), (api.clark, ClarkConfig)):
        assert {settings.keyword(f) for f in settings.flag_fields(schema)} - {"ckpt"} <= set(
            inspect.signature(function).parameters
        )
    assert "task" in inspect.signature(api.clark).parameters  # clark's --task, whose field is `inputs`


# The sets the heads tools took before the sections (issue 51): RolesConfig's settings but those of
# the skip tables `("ckpt", *ROLES_ONLY)` (track) and `("ckpt", *ROLES_ONLY, *TEST_SETTINGS)`
# (finetune_effect), written out here so that the sections are held to them.
OLD_ROLES_ONLY = ("step", "block_score", "block_first_sep", "syntactic_average")
OLD_TEST_SETTINGS = ("tau", "alpha", "test", "correction", "bootstrap", "bootstrap_seed")


def _roles_settings() -> set[str]:
    return {f.name for f in settings.flag_fields(heads.RolesConfig)}


def test_the_roles_sections_partition_its_settings_and_a_setting_in_none_fails():
    settings.check_sections(heads.RolesConfig, heads.ROLES_SECTIONS)  # as at import
    assert set(heads.ROLES_SECTIONS) >= {*heads.TRACK_SECTIONS, *heads.EFFECT_SECTIONS}
    # A field added to RolesConfig (a subclass here) without a section of its own fails loudly.
    field = ("planted", int, settings.setting(0, help="a new setting"))
    planted = dataclasses.make_dataclass("Planted", [field], bases=(heads.RolesConfig,), frozen=True)
    sections = [dataclasses.replace(s, schema=planted) for s in heads.ROLES_SECTIONS]
    with pytest.raises(TypeError, match="'planted' in no section"):
        settings.check_sections(planted, sections)
    checkpoint, *rest = heads.ROLES_SECTIONS
    with pytest.raises(TypeError, match="'ckpt' in 2 sections"):
        settings.check_sections(heads.RolesConfig, [checkpoint, *rest, checkpoint])
    with pytest.raises(TypeError, match="'ckpt' in no section"):
        settings.check_sections(heads.RolesConfig, rest)
    with pytest.raises(TypeError, match="'max_len' is no setting"):
        settings.check_sections(heads.RolesConfig, [*heads.ROLES_SECTIONS, settings.Section(heads.RolesConfig, "typo", ("max_len",))])  # fmt: skip
    with pytest.raises(TypeError, match="section 'checkpoint' is RolesConfig's"):
        settings.check_sections(planted, [checkpoint, *sections[1:]])


@pytest.mark.parametrize(
    ("name", "old"),
    [
        ("roles", _roles_settings()),
        ("track", _roles_settings() - {"ckpt", *OLD_ROLES_ONLY}),
        ("finetune_effect", _roles_settings() - {"ckpt", *OLD_ROLES_ONLY, *OLD_TEST_SETTINGS}),
    ],
)
def test_a_heads_tools_settings_are_its_sections_as_its_skip_table_left_them(name, old):
    """Its flags, its --print-config keys and its call's keywords: the settings of the sections it
    composes, the same RolesConfig settings its skip table left it."""
    import argparse
    import inspect

    import yaml

    from analysis import api, tools

    tool = tools.TOOLS[name]
    sections = tools.load(tool.takes)
    composed = {n for s in sections for n in s.fields}
    assert composed == old
    parser = argparse.ArgumentParser()
    tools.add_tool_flags(parser, tool)
    assert {a.dest for a in parser._actions} & _roles_settings() == old
    config = api.roles_config("c", {})
    assert set(yaml.safe_load(settings.to_yaml(config, sections))) == old
    # A call takes its checkpoints by position (roles' `ckpt`) or as objects (track's series).
    keywords = set(inspect.signature(getattr(api, name)).parameters) - {"ckpt"}
    assert keywords & _roles_settings() == old - {"ckpt"}


# -- a setting's type: from the real annotation, whether or not the module postpones annotations ---
# Each toy module is compiled from this text twice: with `from __future__ import annotations` (its
# annotations stay text, `field.type == "int"`) and without (`field.type is int`). A check that
# read the annotation's text passed `n="8"` in the second and `"x"` for `Optional[int]` in both.
TOY = """
import dataclasses
from pathlib import Path
from typing import Literal, Optional

from bertjax.settings import check, setting


class Custom:
    pass


def ints(text):
    return tuple(int(x) for x in text.split(","))


@dataclasses.dataclass(frozen=True)
class Toy:
    n: int = setting(8, help="a count")
    limit: Optional[int] = setting(None, help="an optional count")
    step: int | None = setting(None, help="an optional step")
    alpha: float = setting(0.5, help="a level")
    name: str = setting("a", help="a name")
    on: bool = setting(False, help="a switch")
    roles: tuple[str, ...] = setting(("local",), help="roles")
    steps: tuple[int, ...] | None = setting(None, parse=ints, help="steps")
    shard: tuple[int, int] | None = setting(None, parse=ints, help="job I of N")

    def __post_init__(self):
        check(self)


@dataclasses.dataclass(frozen=True)
class Bad:
    n: int = setting(8, help="a count")
    odd: {annotation} = setting(None, help="a setting of a type no check knows")

    def __post_init__(self):
        check(self)
"""
# Words are a type (`Literal['auto']`), and a number or words (τ's `float | Literal['auto']`); not
# other literals, nor text or words (which would a flag's text be?).
UNKNOWN = ["dict[str, int]", "Custom", "Path", "Literal[1, 2]", "str | Literal['a']", "int | str", "list[dict]",
           "tuple[Custom, ...]"]  # fmt: skip


def toy_module(postponed: bool, monkeypatch, annotation: str = "int") -> object:
    """The TOY text as a module of its own (registered, as get_type_hints finds a class's globals)."""
    import __future__

    import sys
    import types

    name = f"toy_settings_{'postponed' if postponed else 'eager'}"
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    flags = __future__.annotations.compiler_flag if postponed else 0
    exec(
        compile(TOY.replace("{annotation}", annotation), name, "exec", flags=flags, dont_inherit=True), module.__dict__
    )
    return module


@pytest.mark.parametrize("postponed", [False, True], ids=["eager", "postponed"])
def test_check_types_reads_the_real_annotation(postponed, monkeypatch):
    toy = toy_module(postponed, monkeypatch)
    annotation = {f.name: f.type for f in dataclasses.fields(toy.Toy)}["n"]
    assert annotation == ("int" if postponed else int)  # the case this parametrization is about
    for values, message in [
        ({"n": "8"}, "n: expected an integer, got '8'"),
        ({"n": True}, "n: expected an integer, got True"),  # a bool is an int to Python, not to a setting
        ({"n": 8.0}, "n: expected an integer, got 8.0"),
        ({"limit": "x"}, "limit: expected an integer or None, got 'x'"),
        ({"step": "3"}, "step: expected an integer or None, got '3'"),
        ({"alpha": "0.5"}, "alpha: expected a number, got '0.5'"),
        ({"alpha": False}, "alpha: expected a number, got False"),
        ({"name": 3}, "name: expected text, got 3"),
        ({"on": "no"}, "on: expected True or False, got 'no'"),
        (
            {"roles": ("local", 3)},
            "roles: expected a list of strings (or a flag's comma-separated text), got ('local', 3)",
        ),
        ({"steps": (1, "2")}, "steps: expected a list of integers or None, got (1, '2')"),
        ({"shard": (0,)}, "shard: expected a pair of integers or None, got (0,)"),
    ]:
        with pytest.raises(UserError) as refused:
            toy.Toy(**values)
        assert str(refused.value) == message
    for values in [{"limit": None}, {"limit": 3}, {"step": 3}, {"alpha": 1}, {"roles": ["local", "cls"]},
                   {"steps": (1, 2)}, {"shard": (0, 2)}, {"on": True}]:  # fmt: skip
        toy.Toy(**values)


@pytest.mark.parametrize("postponed", [False, True], ids=["eager", "postponed"])
def test_flags_and_keywords_read_the_real_annotation(postponed, monkeypatch):
    import argparse

    toy = toy_module(postponed, monkeypatch)
    parser = argparse.ArgumentParser()
    settings.add_flags(parser, toy.Toy)
    args = parser.parse_args(["--n", "3", "--limit", "4", "--on", "--roles", "a,b", "--alpha", "1"])
    assert settings.from_flags(toy.Toy, parser, args, []) == toy.Toy(n=3, limit=4, on=True, roles=("a", "b"), alpha=1.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--limit", "x"])
    assert settings.from_kwargs(toy.Toy, {"roles": "a,b", "name": 3}) == toy.Toy(roles=("a", "b"), name="3")
    with pytest.raises(UserError, match=r"^limit: expected an integer or None, got 'x'$"):
        settings.from_kwargs(toy.Toy, {"limit": "x"})


@pytest.mark.parametrize("postponed", [False, True], ids=["eager", "postponed"])
@pytest.mark.parametrize("annotation", UNKNOWN)
def test_an_annotation_no_check_knows_is_refused_where_settings_are_built(annotation, postponed, monkeypatch):
    import argparse

    toy = toy_module(postponed, monkeypatch, annotation)
    refused = "^Bad.odd: a setting cannot be "
    with pytest.raises(TypeError, match=refused):
        settings.add_flags(argparse.ArgumentParser(), toy.Bad)
    with pytest.raises(TypeError, match=refused):
        settings.from_kwargs(toy.Bad, {"n": 3})
    with pytest.raises(TypeError, match=refused):
        settings.with_settings(toy.Bad)(lambda **settings: None)
    with pytest.raises(TypeError, match=refused):
        toy.Bad()  # check_types: not passed through as it was
    with pytest.raises(TypeError, match=refused):
        settings.load_config(toy.Bad, None)
    with pytest.raises(TypeError, match=refused):
        settings.describe_keys(toy.Bad)


def test_a_postponed_annotation_naming_nothing_is_refused_by_name(monkeypatch):
    toy = toy_module(True, monkeypatch, "Undefined")
    with pytest.raises(TypeError, match=r"^Bad: an annotation names 'Undefined', which its module does not define$"):
        toy.Bad()


def test_a_value_checked_against_a_type_no_setting_has_is_a_type_error():
    with pytest.raises(TypeError, match="no setting is of type dict"):
        settings.fits({}, dict[str, int])
    with pytest.raises(TypeError, match="no setting is of type 'int'"):  # the text of a type is no type
        settings.fits(3, "int")


@pytest.mark.parametrize(
    "name",
    [
        "analysis.heads.config:RolesConfig",
        "analysis.heads.config:TrackConfig",
        "analysis.heads.config:ReportConfig",
        "analysis.attention.options:ClarkConfig",
        "analysis.ablation.options:KovalevaConfig",
        "analysis.ablation.options:MichelConfig",
        "bertjax.show:ShowConfig",
        "train.config:PretrainConfig",  # with its sections (model, mesh, optimizer, …), as each below
        "train.config:FinetuneConfig",
        "train.config:PrepareConfig",
    ],
)
def test_every_settings_dataclass_of_the_project_has_types_the_checks_know(name):
    module, _, cls = name.partition(":")
    schema = getattr(importlib.import_module(module), cls)
    assert set(settings.field_types(schema)) == {f.name for f in dataclasses.fields(schema)}


def test_analysis_roles_has_one_default_per_setting_its_cli_api_and_dataclass_agree():
    """`figures` had two: "all" in the dataclass, "role_grid" from the CLI and the API."""
    import inspect

    from analysis import api, roles

    declared = heads.RolesConfig(ckpt="c")
    assert roles.parse_args(["--ckpt", "c"]) == declared
    assert settings.from_kwargs(heads.RolesConfig, {}, heads.ROLES_TOOL, ckpt="c") == declared
    signature = inspect.signature(api.roles).parameters
    for field in settings.flag_fields(heads.RolesConfig):
        if field.name not in ("ckpt", "out"):  # by position, without a default; written only when given
            assert signature[field.name].default == field.default, field.name
    assert declared.figures == heads.DEFAULT_ROLES_FIGURES
    for tool in (heads.TRACK_TOOL, heads.EFFECT_TOOL):  # the tools whose few figures are all drawn
        assert settings.default_of(heads.RolesConfig, "figures", tool) == ("all",)


# -- values parsed once into typed fields (issue 51 item 5) ---------------------------------------


@pytest.mark.parametrize("text", ["x", "AUTO", "3 heads", ""])
def test_tau_is_a_number_or_auto_from_a_flag_a_keyword_or_a_file(text, tmp_path, capsys):
    from analysis import roles

    assert roles.parse_args(["--ckpt", "c", "--tau", "2.5"]).tau == 2.5
    assert roles.parse_args(["--ckpt", "c", "--tau", "auto"]).tau == "auto"
    assert roles.parse_args(["--ckpt", "c"]).tau == 3.0
    with pytest.raises(SystemExit):
        roles.parse_args(["--ckpt", "c", "--tau", text])
    assert f"argument --tau: expected a number or 'auto', got {text!r}" in capsys.readouterr().err
    for value in (3, 3.0, "3"):  # one value, however it is given
        assert settings.from_kwargs(heads.RolesConfig, {"tau": value}, ckpt="c").tau == 3.0
    with pytest.raises(UserError, match=rf"^tau: expected a number or 'auto', got {text!r}$"):
        settings.from_kwargs(heads.RolesConfig, {"tau": text}, ckpt="c")
    path = tmp_path / "s.yaml"
    for written, value in (("3", 3.0), ("'2.5'", 2.5), ("auto", "auto")):
        path.write_text(f"tau: {written}\n", encoding="utf-8")
        assert roles.parse_args(["--ckpt", "c", "--config", str(path)]).tau == value
    path.write_text(f"tau: {text!r}\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"^--config {path}: tau: expected a number or 'auto', got {text!r}$"):
        roles.parse_args(["--ckpt", "c", "--config", str(path)])


def test_a_list_is_parsed_once_where_it_comes_in(tmp_path):
    """The flag's text, the API's list and a YAML list give one tuple, which every use site reads
    as it is: a use site that split the text again would fail on the tuple (no `split`)."""
    from analysis import roles
    from analysis.common.flags import select_figures, select_formats

    flag = roles.parse_args(["--ckpt", "c", "--figures", "coarse_overlap, role_grid", "--figure-format", "svg,png"])
    listed = settings.from_kwargs(heads.RolesConfig, {"figures": ["coarse_overlap", "role_grid"],
                                                      "figure_format": ("svg", "png")}, ckpt="c")  # fmt: skip
    text = settings.from_kwargs(heads.RolesConfig, {"figures": "coarse_overlap,role_grid", "figure_format": "svg,png"},
                                ckpt="c")  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text("figures: [coarse_overlap, role_grid]\nfigure_format: [svg, png]\n", encoding="utf-8")
    from_file = roles.parse_args(["--ckpt", "c", "--config", str(path)])
    assert flag == listed == text == from_file
    assert flag.figures == ("coarse_overlap", "role_grid") and flag.figure_format == ("svg", "png")
    assert select_figures(flag.figures, heads.ROLES_FIGURES) == ("role_grid", "coarse_overlap")  # the kinds' order
    assert select_formats(flag.figure_format) == ("png", "svg")
    assert roles.parse_args(["--ckpt", "c", "--no-figures"]).figures == roles.parse_args(["--ckpt", "c", "--figures", "none"]).figures  # fmt: skip
    assert select_figures(roles.parse_args(["--ckpt", "c", "--no-figures"]).figures, heads.ROLES_FIGURES) == ()


def test_a_run_written_before_the_typed_values_still_loads():
    """run.json of a run before τ was a number and the figures a list holds them as text."""
    from analysis.heads.report import settings_of

    old = settings_of({"ckpt": "c", "tau": "3", "figures": "role_grid,coarse_overlap", "figure_format": "png"})
    assert old == settings.from_kwargs(heads.RolesConfig, {"tau": 3.0, "figures": ("role_grid", "coarse_overlap")}, ckpt="c")  # fmt: skip
    assert settings_of({"ckpt": "c", "tau": "auto"}).tau == "auto"
    with pytest.raises(UserError, match=r"config\.tau must be float \| Literal\['auto'\], got 'x'"):
        settings_of({"ckpt": "c", "tau": "x"})
