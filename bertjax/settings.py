"""One config system for every tool: a typed, frozen dataclass per tool declares each setting once
(type, default, help, choices), and everything else is generated from it.

- The command line: `add_flags(parser, Schema)` makes one flag per field (`max_length` is
  `--max-length`; a bool that defaults to False is a switch, one that defaults to True a `--no-...`
  switch), with its help text, its choices and its default in `--help`.
- The API's keyword arguments: `from_kwargs(Schema, kwargs)` takes the fields by name, each as the
  flag would give it or already typed, and refuses an unknown one.
- YAML: every analysis CLI takes `--config FILE.yaml` (`from_flags`: values under the flags given
  on the command line) and `--print-config` (the resolved settings as YAML, to edit and pass back); the training CLIs read YAML plus dotted `key=value` overrides (`load_config`), and draw their own
  few flags from a settings dataclass per command too (`add_flags(..., file_supplies=False)`).
- Commands that share one schema each take named sections of it (`Section`, `sections=`), which
  partition its settings (`check_sections`): the heads tools' RolesConfig.

Each field's type is its annotation evaluated (`field_types`), one of the few the checks know
(`check_types` holds every value to it); a dataclass with any other is refused when its flags,
keywords or settings are first built.

The schemas are OmegaConf structured configs: OmegaConf merges the YAML into the dataclass, checks
each value against the field's annotation and reports the key of a wrong one, as it has for the
training configs since the first release. Argparse (standard library) draws the flags. Tyro, tried
against it (issue 51), gave the same flags and `--help` time; its gaps are lists (space-separated
words, where every command takes `prev,next`) and boxed help, and it takes no `key=value`
overrides (docs/cli.md). Only argparse and this module are imported before the flags are parsed;
OmegaConf (~0.1 s) only when YAML is read or written.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import inspect
import io
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from bertjax import runinfo
from bertjax.errors import UserError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    flag: str | None = None,
    choices: Sequence[Any] | None = None,
    aliases: Sequence[str] = (),
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    shown: str | None = None,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A field of a tool's settings and its flag: `help` (required: every flag explains itself);
    `flag` the option string when it is not the field's name in kebab case; `choices` checked by the
    parser; `aliases` old spellings kept for one release (each says so when used); `parse` turns
    the flag's text into the field's value (also a text given to the API); `shown` the default as
    `--help` states it, where the value itself would not read well. A field without a default is
    required. `default_factory` as dataclasses.field's (a list default in a training config)."""
    metadata = {"help": help, "flag": flag, "choices": None if choices is None else tuple(choices),
                "aliases": tuple(aliases), "metavar": metavar, "parse": parse, "shown": shown}  # fmt: skip
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata={"setting": metadata})
    return dataclasses.field(default=default, metadata={"setting": metadata})


def internal(default: Any, why: str) -> Any:
    """A field that no flag sets: derived from other settings, or set by the tool itself (`why`
    says which; the API refuses it as a keyword too)."""
    return dataclasses.field(default=default, metadata={"internal": why})


def flag_name(schema: type, field: dataclasses.Field) -> str:
    spec = field.metadata["setting"]
    if spec["flag"] is not None:
        return spec["flag"]
    name = field.name.replace("_", "-")
    if field_types(schema)[field.name] is bool and field.default is True:
        return f"--no-{name}"
    return f"--{name}"


def keyword(field: dataclasses.Field) -> str:
    """A setting's keyword in the API: its flag's name where the flag is named otherwise than the
    field (clark's `--task`, field `inputs`), else the field's name."""
    flag = field.metadata["setting"]["flag"]
    return field.name if flag is None else flag.removeprefix("--").replace("-", "_")


def flag_fields(schema: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(schema) if "setting" in f.metadata]


@dataclasses.dataclass(frozen=True)
class Section:
    """A named part of `schema`'s settings, which a command takes whole or not at all: where
    several commands share one schema, each names the sections it takes (`sections=` of
    `add_flags`, `from_flags`, `from_kwargs`, `with_settings`, `print_config_if_asked`), and
    `check_sections` holds the schema's sections to a partition of its settings."""

    schema: type
    name: str
    fields: tuple[str, ...]


def check_sections(schema: type, sections: Sequence[Section]) -> None:
    """TypeError unless `sections` are `schema`'s and hold each of its settings exactly once, so
    that a setting added to the schema without a section, which no command sharing it would take,
    fails at import."""
    names = [f.name for f in flag_fields(schema)]
    given = [n for s in sections for n in s.fields]
    problems = [f"section {s.name!r} is {s.schema.__name__}'s" for s in sections if s.schema is not schema]
    problems += [f"{n!r} in no section" for n in names if n not in given]
    problems += [f"{n!r} in {given.count(n)} sections" for n in dict.fromkeys(given) if given.count(n) > 1]
    problems += [f"{n!r} is no setting" for n in dict.fromkeys(given) if n not in names]
    if problems:
        raise TypeError(f"{schema.__name__}'s sections: {'; '.join(problems)}")


def taken(schema: type, sections: Sequence[Section] | None) -> set[str]:
    """The names of `schema`'s settings that a command taking `sections` takes: those of its
    sections of `schema`, or every one where it names none of `schema`'s (None: no schema is
    divided; track takes all of TrackConfig and some sections of RolesConfig)."""
    mine = [s for s in sections or () if s.schema is schema]
    if not mine:
        return {f.name for f in flag_fields(schema)}
    return {n for s in mine for n in s.fields}


# -- a setting's type: resolved from its real annotation, and one of a few -----------------------
# `typing.get_type_hints` evaluates the annotations whether or not the declaring module postpones
# them (`from __future__ import annotations`, under which `field.type` is only text). A check that
# read that text passed `n="8"` in a module without the import and `"x"` for an `Optional[int]`,
# and let a type it did not know through unchecked.

_SCALARS = (int, float, str, bool)


def _is_section(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _options(kind: Any) -> tuple[Any, ...]:
    """The members of a union (`X | None`, `Optional[X]`); any other type alone."""
    return typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)


def _bare(kind: Any) -> Any:
    """`X` of `X | None`; any other type as it is."""
    options = [option for option in _options(kind) if option is not type(None)]
    return options[0] if len(options) == 1 else kind


def _is_words(kind: Any) -> bool:
    """Whether `kind` is a few words, `Literal["auto"]`."""
    words = typing.get_args(kind)
    return typing.get_origin(kind) is typing.Literal and bool(words) and all(isinstance(w, str) for w in words)


def _is_number_or_words(kind: Any) -> bool:
    """Whether `kind` is one number type and words besides (τ's `float | Literal["auto"]`), with or
    without None: a value that is a number unless it is one of the words."""
    options = [option for option in _options(kind) if option is not type(None)]
    numbers = [option for option in options if option in (int, float)]
    return len(numbers) == 1 and len(options) > 1 and all(option in numbers or _is_words(option) for option in options)


def _understood(kind: Any) -> bool:
    """Whether a setting may have the type `kind`: int, float, str or bool; words
    (`Literal["auto"]`); `X | None` of one that may; a number or words (`float | Literal["auto"]`);
    a tuple of scalars (`tuple[str, ...]`, `tuple[int, int]`); a list of scalars or of sections; a
    section (a dataclass of settings, a training config's `optimizer`)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind in _SCALARS or _is_words(kind):
        return True
    if origin in (typing.Union, types.UnionType):
        if _is_number_or_words(kind):
            return True
        return len(args) == 2 and type(None) in args and _understood(_bare(kind))
    if origin is tuple:
        items = args[:1] if args[1:] == (Ellipsis,) else args
        return bool(items) and all(item in _SCALARS for item in items)
    if origin is list:
        return len(args) == 1 and (args[0] in _SCALARS or _is_section(args[0]))
    return _is_section(kind)


@functools.cache
def field_types(schema: type) -> dict[str, Any]:
    """The type of each field of the settings dataclass `schema`, by name: its annotation
    evaluated, whether or not its module postpones annotations. Any type but those
    `_understood` names (here, or in a section of `schema`) is a programming error, a TypeError
    naming the class and the field, raised when the flags, the API's keywords or the settings are
    first built from `schema`: a setting no check understands is refused, not passed through."""
    try:
        kinds = typing.get_type_hints(schema)
    except NameError as e:
        raise TypeError(f"{schema.__qualname__}: an annotation names {e.name!r}, which its module does not define") from None  # fmt: skip
    for field in dataclasses.fields(schema):
        kind = kinds[field.name]
        if not _understood(kind):
            raise TypeError(
                f"{schema.__qualname__}.{field.name}: a setting cannot be {spelled(kind)} (it may be int, float, str, "
                "bool, Literal words, X | None, a number or words (float | Literal['auto']), a tuple of scalars, a "
                "list of scalars or sections, or a section: a settings dataclass)"
            )
        inner = _bare(kind)
        inner = typing.get_args(inner)[0] if typing.get_origin(inner) is list else inner
        if _is_section(inner):
            field_types(inner)
    return kinds


def spelled(kind: Any) -> str:
    """A type as an annotation spells it: `int | None`, `tuple[str, ...]`, `RolesConfig`."""
    if kind is type(None):
        return "None"
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return " | ".join(map(spelled, typing.get_args(kind)))
    if isinstance(kind, types.GenericAlias):
        args = ", ".join("..." if a is Ellipsis else spelled(a) for a in typing.get_args(kind))
        return f"{typing.get_origin(kind).__qualname__}[{args}]"
    if isinstance(kind, type):
        return kind.__qualname__
    return repr(kind).replace("typing.", "")


# The types a flag's text converts to by itself (also as `X | None`); any other needs `parse`.
_CONVERT = {int: int, float: float, str: str}


def comma_list(text: str) -> tuple[str, ...]:
    """A `tuple[str, ...]` setting from its flag's text, `prev,next`: the one place a list's text
    is split (a YAML file and the API give the list itself, or this text)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _number_or_word(kind: Any) -> Callable[[str], Any]:
    """A flag's text as `float | Literal["auto"]` (`_is_number_or_words`) takes
    it: one of the words as it is, else the number; anything else refused in one line (argparse
    prefixes the flag)."""
    options = [option for option in _options(kind) if option is not type(None)]
    words = [w for option in options if _is_words(option) for w in typing.get_args(option)]
    numbers = [option for option in options if option in (int, float)]

    def number_or_word(text: str) -> Any:
        if text in words:
            return text
        try:
            return numbers[0](text)
        except (IndexError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {describe(kind)}, got {text!r}") from None

    return number_or_word


def _converter(schema: type, field: dataclasses.Field) -> Callable[[str], Any]:
    spec = field.metadata["setting"]
    if spec["parse"] is not None:
        return spec["parse"]
    kind = _bare(field_types(schema)[field.name])
    if kind == tuple[str, ...]:
        return comma_list
    if _is_words(kind):
        return str  # refused where it is checked: by its choices, as the flag's parser refuses them
    if _is_number_or_words(kind):
        return _number_or_word(kind)
    if kind not in _CONVERT:
        raise TypeError(f"{schema.__qualname__}.{field.name}: a flag's text is no {spelled(kind)} by itself: needs parse=")  # fmt: skip
    return _CONVERT[kind]


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    schema: type,
    *,
    sections: Sequence[Section] | None = None,
    tool: Mapping[str, Mapping[str, Any]] | None = None,
    file_supplies: bool = True,
) -> None:
    """The flags of `schema`'s fields that a command taking `sections` takes (`taken`), in the
    schema's order, each with its help, choices and default. `tool` maps a field to what differs
    where several tools share a schema (`default`, `help`, `choices`): each tool states it once,
    and its API takes the same mapping (`from_kwargs`). `file_supplies`: a `--config` file of these settings may give a
    required one (`from_flags`); not where `--config` names another file (a training command's
    run config), whose required flags stay required of the command line. A positional list
    (`flag` without dashes, `tuple[str, ...]`) takes any number of words, each as it is: train's
    `key=value` overrides."""
    tool = tool or {}
    kinds = field_types(schema)
    unknown = sorted(set(tool) - {f.name for f in flag_fields(schema)})
    if unknown:
        raise TypeError(f"{schema.__name__}: no setting named {', '.join(unknown)}")
    takes = taken(schema, sections)
    for field in flag_fields(schema):
        if field.name not in takes:
            continue
        spec = {**field.metadata["setting"], **tool.get(field.name, {})}
        default = spec.get("default", field.default)
        names = [flag_name(schema, field), *spec["aliases"]]
        kwargs: dict[str, Any] = {"dest": field.name, "help": spec["help"]}
        if not names[0].startswith("-"):  # a positional argument, named by its metavar
            kwargs = {"metavar": names[0], "help": spec["help"]}
            if typing.get_origin(kinds[field.name]) in (list, tuple):
                kwargs.update(nargs="*", type=_CONVERT[typing.get_args(kinds[field.name])[0]])
            else:
                kwargs["type"] = _converter(schema, field)
            _config_may_supply(parser.add_argument(field.name, **kwargs), file_supplies)
            continue
        if kinds[field.name] is bool:
            kwargs.update(action="store_false" if default is True else "store_true", default=default)
        else:
            kwargs.update(type=_converter(schema, field), choices=spec["choices"], metavar=spec["metavar"])
            if spec["aliases"]:
                kwargs["action"] = _deprecated_aliases()
            if default is dataclasses.MISSING:
                kwargs["required"] = True
            elif spec["shown"] is not None:  # said in words; an absent flag leaves the field's default
                kwargs.update(default=None, help=f"{spec['help']} (default: {spec['shown']})")
            else:  # a list as its flag's text, which argparse converts as it would the flag's
                kwargs["default"] = ",".join(map(str, default)) if isinstance(default, tuple) else default
        _config_may_supply(parser.add_argument(*names, **kwargs), file_supplies)


def _config_may_supply(action: argparse.Action, file_supplies: bool) -> None:
    """Marks a required setting's flag as one a `--config` file may give instead
    (`bertjax.cli.Parser` reads the mark), so that what `--print-config` writes reads back."""
    # An attribute of our own on argparse's Action, which declares none such.
    action.config_may_supply = action.required and file_supplies  # type: ignore[attr-defined]


def tool_defaults(tool: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    return {name: spec["default"] for name, spec in (tool or {}).items() if "default" in spec}


def default_of(schema: type, name: str, tool: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """The default of `schema`'s setting `name` where a tool states `tool` (as for `add_flags`):
    the tool's own, else the field's."""
    field = next(f for f in flag_fields(schema) if f.name == name)
    return tool_defaults(tool).get(name, field.default)


def _deprecated_aliases() -> type[argparse.Action]:
    from bertjax.cli import DeprecatedAliases  # cli imports this module's users, not the other way

    return DeprecatedAliases


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """`--config` and `--print-config`, the YAML side of a tool's settings."""
    parser.add_argument("--config", metavar="FILE",
                        help="YAML file of settings (keys as the flags, with underscores); a flag given on the "
                             "command line overrides the file")  # fmt: skip
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved settings as YAML (a file for --config) and stop")  # fmt: skip


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The dests of the flags `argv` sets (a flag given at its default value included), which a
    --config file must not override."""
    bare = copy.deepcopy(parser)
    for action in bare._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    for group in bare._mutually_exclusive_groups:
        group.required = False
    return set(vars(bare.parse_known_args(argv)[0]))


def from_flags(
    schema: type[T],
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    *,
    sections: Sequence[Section] | None = None,
    file_schemas: Sequence[type] = (),
    **fixed: Any,
) -> T:
    """The settings of `schema` from parsed flags: the schema's fields that `args` holds, under a
    `--config` file's values where one is given, and `fixed` (values the command derives from
    other flags) over both. A command whose flags fill several schemas names the others in
    `file_schemas`, so that the one file may hold the settings of all; `sections` as for
    `add_flags` (of any of these schemas: a setting the command does not take, a file may not set
    either)."""
    values = flag_values(schema, args)
    path = getattr(args, "config", None)
    if path is not None:
        given = given_flags(parser, argv)
        from_file = _yaml_settings(schema, Path(path), file_schemas, sections)
        values = {k: v for k, v in values.items() if k in given or k not in from_file} | {
            k: v for k, v in from_file.items() if k not in given
        }
    return make(schema, values | fixed)


def flag_values(schema: type, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of `schema` that the parsed flags `args` hold, by name; a None from a flag
    whose field takes no None is left out (the field's default, which its help says in words)."""
    kinds = {f.name: field_types(schema)[f.name] for f in flag_fields(schema)}
    values = {k: v for k, v in vars(args).items() if k in kinds and (v is not None or type(None) in _options(kinds[k]))}
    # A positional list's words come as argparse's list.
    words = {k: tuple(v) for k, v in values.items() if isinstance(v, list) and typing.get_origin(kinds[k]) is tuple}
    return values | words


def print_config_if_asked(args: argparse.Namespace, *configs: Any, sections: Sequence[Section] | None = None) -> None:
    """`--print-config`: the resolved settings of `configs` that a command taking `sections`
    takes (as for `add_flags`) as YAML on stdout, then exit 0."""
    if getattr(args, "print_config", False):
        print("".join(to_yaml(config, sections) for config in configs), end="")
        raise SystemExit(0)


def _check_config_file(path: Path, flag: str = "") -> None:
    if not path.exists():
        raise UserError(f"{flag}{path}: config file does not exist")
    if not path.is_file():  # a FIFO would block the read; a directory or device is no config
        raise UserError(f"{flag}{path}: not a regular file (a pipe, device or directory); give the file itself")


def _yaml_settings(
    schema: type, path: Path, others: Sequence[type], sections: Sequence[Section] | None
) -> dict[str, Any]:
    """A --config file's settings of `schema`, typed and checked against its annotations by
    OmegaConf; a key that is no setting of `schema` or `others` is refused by name."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _check_config_file(path, "--config ")
    data = _load_yaml(path)
    if data is None:
        return {}
    if not hasattr(data, "keys"):
        raise UserError(f"--config {path}: expected a mapping of settings, one per line (key: value)")
    known = {n for s in (schema, *others) for n in taken(s, sections)}
    unknown = sorted(set(data.keys()) - known)
    if unknown:
        raise UserError(f"--config {path}: unknown setting {unknown[0]!r} (choose from {', '.join(sorted(known))})")
    names = {f.name for f in flag_fields(schema)}
    try:
        # Resolved before the masking, so that `${oc.env:HOME}` and a reference to another key
        # mean what they mean in a training config.
        OmegaConf.resolve(data)
        mine = OmegaConf.masked_copy(data, sorted(names & set(data.keys())))
        merged = OmegaConf.merge(OmegaConf.structured(_flag_schema(schema)), mine)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise UserError(f"--config {path}: {key + ': ' if key else ''}{str(e).splitlines()[0]}") from None
    try:
        container = cast(dict[str, Any], OmegaConf.to_container(merged))  # a DictConfig's container is a dict
        return {k: typed(schema, k, v) for k, v in container.items() if k in mine}
    except UserError as e:
        raise UserError(f"--config {path}: {e}") from None


def _flag_schema(schema: type) -> type:
    """`schema`'s flag fields alone, every one optional: the shape a --config file is checked
    against (a required setting may come from the command line instead)."""
    hints = field_types(schema)
    fields = []
    for f in flag_fields(schema):
        # OmegaConf knows no words (`Literal`), and would refuse a list's text (`figures:
        # role_grid`, as files written before lists were tuples hold it): those come as written,
        # and `typed` reads them as the API's keywords.
        kind = Any if _holds_words(hints[f.name]) or typing.get_origin(_bare(hints[f.name])) is tuple else hints[f.name]
        if f.default is dataclasses.MISSING:
            fields.append((f.name, kind | None, dataclasses.field(default=None)))
        else:
            fields.append((f.name, kind, dataclasses.field(default=f.default)))
    return dataclasses.make_dataclass(f"{schema.__name__}File", fields)


def _holds_words(kind: Any) -> bool:
    return any(_is_words(option) for option in _options(kind))


def make(schema: type[T], values: Mapping[str, Any]) -> T:
    """`schema(**values)`, with a required setting that is missing reported as its flag."""
    missing = [
        flag_name(schema, f) for f in flag_fields(schema) if f.default is dataclasses.MISSING and f.name not in values
    ]
    if missing:
        raise UserError(f"the following arguments are required: {', '.join(missing)}")
    config = schema(**values)
    check(cast("DataclassInstance", config))  # whether or not the class checks itself: fails closed
    return config


def from_kwargs(
    schema: type[T],
    kwargs: Mapping[str, Any],
    tool: Mapping[str, Mapping[str, Any]] | None = None,
    sections: Sequence[Section] | None = None,
    **fixed: Any,
) -> T:
    """The settings of `schema` from an API call's keyword arguments, named as the fields or, where
    a field's flag is named otherwise, as the flag (`task=` for clark's `--task`, whose field is
    `inputs`): a text where the field takes another type is read as the flag's text would be
    (`roles="prev,next"`), a path becomes its text (run.json records text), and an unknown name is
    a TypeError as Python raises for any function. `tool` and `sections` as for `add_flags`;
    `fixed` over everything: a keyword naming one of its settings is unknown too (`ckpt`, given by
    position)."""
    names = taken(schema, sections) - set(fixed)
    fields = {f.name: f for f in flag_fields(schema) if f.name in names}
    # The field's own name stays a keyword too (`inputs=`, as run.json records it).
    by_flag = {keyword(f): name for name, f in fields.items() if keyword(f) != name}
    for word, name in by_flag.items():
        if word in kwargs and name in kwargs:
            raise TypeError(f"got both {word}= and {name}=, which name the same setting")
    kwargs = {by_flag.get(word, word): value for word, value in kwargs.items()}
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    values = tool_defaults(tool)
    for name, value in kwargs.items():
        if value is None and fields[name].metadata["setting"]["shown"] is not None:
            continue  # as the flag left out: the default its help states in words
        values[name] = typed(schema, name, value)
    named = {f.name for f in flag_fields(schema)}
    # `fixed` holds a call's positional settings too (`api.toy("a,b")`): read as the keywords are.
    return make(schema, values | {n: typed(schema, n, v) if n in named else v for n, v in fixed.items()})


def typed(schema: type, name: str, value: Any) -> Any:
    """`value`, given for `schema`'s setting `name` from outside the flags (an API keyword, a
    --config file, a run.json read back), in the field's type where it reads as one: a text where
    the field takes another type as the flag's text (`roles="prev,next"`, `tau="3"`), a list as a
    tuple, an integer as a float where the field takes a float (`tau=3` records 3.0, as `--tau 3`
    does), a path as its text (run.json records text). A text no reading takes is one line naming
    the setting; any other value stays as given, for check_types' message."""
    field = next(f for f in flag_fields(schema) if f.name == name)
    kind = field_types(schema)[name]
    options = _options(kind)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str) and _bare(kind) not in _CONVERT and kind is not bool:
        try:
            return _converter(schema, field)(value)
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise UserError(f"{name}: {e}"[:300]) from None
    if isinstance(value, int) and not isinstance(value, bool) and float in options and int not in options:
        return float(value)
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # a number where the flag takes text, as the flag's text would give it
    if isinstance(value, list) and typing.get_origin(_bare(kind)) is tuple and fits(value, kind):
        return tuple(value)
    return value


def with_settings(
    *schemas: type, tool: Mapping[str, Mapping[str, Any]] | None = None, sections: Sequence[Section] | None = None
) -> Callable[[F], F]:
    """An API function's signature with one keyword argument per setting of `schemas` that a
    command taking `sections` takes (as for `add_flags`) and that is no parameter of its own,
    each with the tool's default, where its code takes them as `**settings`: what `help()`,
    `inspect.signature` and a notebook's completion show."""

    def decorate(function: F) -> F:
        signature = inspect.signature(function)
        parameters = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        shown = {p.name for p in parameters}
        defaults = tool_defaults(tool)
        for schema in schemas:
            names = taken(schema, sections)
            for field in flag_fields(schema):
                if field.name in names and keyword(field) not in shown:
                    shown.add(keyword(field))
                    default = defaults.get(field.name, field.default)
                    parameters.append(
                        inspect.Parameter(
                            keyword(field),
                            inspect.Parameter.KEYWORD_ONLY,
                            default=default,
                            annotation=field_types(schema)[field.name],
                        )
                    )
        # inspect.signature reads __signature__, which no callable's type declares.
        function.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return function

    return decorate


def to_yaml(config: Any, sections: Sequence[Section] | None = None) -> str:
    """A tool's settings (those a command taking `sections` takes) as YAML, which `--config`
    reads back."""
    from omegaconf import OmegaConf

    names = taken(type(config), sections)
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items() if k in names}
    return OmegaConf.to_yaml(OmegaConf.create(values))


def describe_keys(schema: Any, prefix: str = "") -> list[str]:
    """One line per key of a nested structured config (train's), `key (default: X): help`, for the
    `--help` of a command that takes `key=value` overrides. `schema` is a dataclass or an instance
    of one, whose values are then the defaults shown (fine-tuning's `optimizer` section is an
    `OptimizerConfig` with other defaults than the class's). A section (a dataclass field, or an
    optional one, `X | None`) gets a line of its own, then its keys; a list of sections, its items'
    keys as `key.N.field`, with the defaults an item takes for the keys it does not give."""
    cls = schema if isinstance(schema, type) else type(schema)
    hints = field_types(cls)
    lines = []
    for field in dataclasses.fields(cls):
        key = f"{prefix}{field.name}"
        default = _field_default(field) if isinstance(schema, type) else getattr(schema, field.name)
        spec = field.metadata.get("setting", {})
        text = f": {spec['help']}" if spec.get("help") else ""
        section = _section(hints[field.name])
        if section is not None and default is not None:
            lines.append(f"  {key}{text}")
            lines += describe_keys(default, f"{key}.")
            continue
        shown = spec.get("shown") or _shown(default)
        lines.append(f"  {key} (default: {shown}){text}")
        if section is not None:  # an optional section, off by default: the keys it takes when on
            lines += describe_keys(section, f"{key}.")
        elif typing.get_origin(hints[field.name]) is list:
            item = _section(typing.get_args(hints[field.name])[0])
            if item is not None:
                lines += describe_keys(item, f"{key}.N.")
    return lines


def _field_default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def _section(annotation: Any) -> type | None:
    """The dataclass that `annotation` (`X` or `X | None`) names, if it names one."""
    kind = _bare(annotation)
    return kind if _is_section(kind) else None


def _shown(value: Any) -> str:
    """A default as the YAML of a config file or a `key=value` override writes it; of a section in a
    list, the keys it sets other than their defaults."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value or "''"
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(map(_shown, value))}]"
    if dataclasses.is_dataclass(value):
        changed = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)
                   if getattr(value, f.name) != _field_default(f)]  # fmt: skip
        return "{" + ", ".join(f"{name}: {_shown(v)}" for name, v in changed) + "}"
    return str(value)


# -- the training configs' loader: YAML file and dotted overrides ---------------------------------


def load_config(schema: type[T], path: str | Path | None, overrides: Sequence[str] = ()) -> T:
    """Defaults ← YAML file ← `dotted.key=value` overrides, type-checked against `schema` by
    OmegaConf; an unknown key or a wrong type is a `UserError` naming the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # A type OmegaConf would take for another, or not check, is refused first. (A class is
    # hashable: mypy takes type[T]'s __hash__ for T's unbound method.)
    field_types(schema)  # type: ignore[arg-type]
    cfg = OmegaConf.structured(schema)
    where = ""
    try:
        if path is not None:
            where = f"{path}: "
            _check_config_file(Path(path))
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
        return cast(T, OmegaConf.to_object(cfg))  # a structured config's object is the dataclass
    except OmegaConfBaseException as e:
        full_key = getattr(e, "full_key", None)
        message = str(e).splitlines()[0]
        raise UserError(f"{where}{full_key + ': ' if full_key else ''}{message}") from None


_MISSING = object()


# OmegaConf's words for a document its aliases expand past the node budget `_load_yaml` gives.
_ALIAS_BOMB = ("YAML node expansion exceeds", "YAML aliases expand the document")


def _load_yaml(path: Path) -> Any:
    """A config file as OmegaConf reads it; text that is not UTF-8, not YAML, not a mapping or
    list, or whose aliases expand it far beyond its size is one line naming the file, and so is a
    key left `???` (OmegaConf's missing value, which a merge would silently take for the default)."""
    import yaml
    from omegaconf import OmegaConf

    try:
        raw = runinfo.read_input(path)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); save the config file as UTF-8") from None
    try:
        # OmegaConf caps the nodes a document expands to at 10 000, aliases or not: a long list
        # written out was refused as an alias bomb. Every node takes at least a character of the
        # text, so this budget passes any document without aliases and still stops one whose
        # aliases multiply it (OmegaConf also refuses a hundredfold expansion whatever the budget).
        cfg = OmegaConf.load(io.StringIO(text), max_yaml_expanded_nodes=10_000 + len(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if problem.startswith(_ALIAS_BOMB):
            raise UserError(f"{path}: its YAML aliases expand it far beyond its size (an alias bomb?); "
                            "write the values out") from None  # fmt: skip
        raise UserError(f"{path}: not valid YAML ({where}{problem})") from None
    except OSError:  # nothing is read from a file here: OmegaConf's word for a lone scalar
        raise UserError(f"{path}: expected a mapping of settings, one per line (key: value)") from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UserError(f"{path}: {missing[0]}: ??? (a missing value) is no setting; give a value or leave the key out")
    return cfg


def _is_open(cfg: Any, key: str) -> bool:
    """Whether `key` may be created: only inside a dict-typed (not a dataclass) node."""
    from omegaconf import DictConfig, OmegaConf

    parent_key = key.rpartition(".")[0]
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    return isinstance(parent, DictConfig) and OmegaConf.get_type(parent) is dict


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def resolved_yaml(config: Any) -> str:
    """A training config as its run's config.yaml holds it, which `--config` reads back; what a
    training command's `--print-config` prints."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(config))


def save_resolved(config: Any, path: Path) -> None:
    with runinfo.atomic_file(path, overwrite=True) as f:  # a resumed run's, checked the same
        f.write(resolved_yaml(config))


# -- a setting's type, checked before anything runs ----------------------------------------------
# The flags arrive typed by argparse; a call of `analysis.api` or a run.json read back may hold
# anything (`n="8"`, `overwrite="no"`), and a wrong type went on to a traceback far away (`'<' not
# supported between 'str' and 'int'`) or, worse, was taken for true.

# What a setting's type reads as in a message; a type not here, as its annotation spells it.
_NAMES = {
    type(None): "None",
    bool: "True or False",
    int: "an integer",
    float: "a number",
    str: "text",
    tuple[str, ...]: "a list of strings (or a flag's comma-separated text)",
    tuple[int, ...]: "a list of integers",
    tuple[int, int]: "a pair of integers",
}


def fits(value: object, kind: Any) -> bool:
    """Whether `value` is of the setting type `kind` (`int | None`, `tuple[str, ...]`, a section):
    bool is not taken for an integer (though Python's bool is an int), nor an integer-valued float;
    an integer is a number; a list does for a tuple (JSON has no tuples). A type no setting may
    have (`field_types`) is a TypeError, never a fit."""
    if not _understood(kind) and kind is not type(None):
        raise TypeError(f"no setting is of type {spelled(kind)}, so no value is checked against it")
    return _fits(value, kind)


def _fits(value: object, kind: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return number and isinstance(value, int)
    if kind is float:
        return number
    if kind is str:
        return isinstance(value, str)
    if _is_words(kind):
        return isinstance(value, str) and value in args
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in args)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        items = args[:1] * len(value) if origin is list or args[1:] == (Ellipsis,) else args
        return len(items) == len(value) and all(map(_fits, value, items))
    return isinstance(value, kind)  # a section


def describe(kind: Any) -> str:
    return " or ".join(
        " or ".join(map(repr, typing.get_args(option))) if _is_words(option) else _NAMES.get(option, spelled(option))
        for option in _options(kind)
    )


def check(config: DataclassInstance) -> None:
    """Every setting with choices holds one of them (the parser checks the flags; a call of the
    API or a --config file reaches the dataclass without it), then `check_types`: the choices
    first, so that a word outside a `Literal` field's is the line the flag's parser gives."""
    for field in flag_fields(type(config)):
        choices = field.metadata["setting"]["choices"]
        value = getattr(config, field.name)
        if choices is not None and value not in choices:
            raise UserError(f"{flag_name(type(config), field)} must be one of {', '.join(map(str, choices))}, got {value!r}")  # fmt: skip
    check_types(config)


def check_types(config: DataclassInstance) -> None:
    """Every field of the settings dataclass `config` holds a value of its type (`field_types`),
    or one line naming the field as the API's keyword: `n: expected an integer, got '8'`."""
    kinds = field_types(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if not fits(value, kinds[field.name]):
            raise UserError(f"{field.name}: expected {describe(kinds[field.name])}, got {value!r}"[:300])
