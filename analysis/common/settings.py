"""A setting's type, checked before anything runs. The flags arrive typed by argparse; a call of
`analysis.api` or a run.json read back may hold anything (`n="8"`, `overwrite="no"`), and a wrong
type went on to a traceback far away (`'<' not supported between 'str' and 'int'`) or, worse, was
taken for true."""

from __future__ import annotations

import dataclasses

from bertjax.errors import UserError

# What each annotation of a settings dataclass reads as, in a message.
_NAMES = {
    "None": "None",
    "bool": "True or False",
    "int": "an integer",
    "float": "a number",
    "str": "text",
    "tuple[str, ...]": "a list of strings",
    "tuple[int, ...]": "a list of integers",
    "tuple[int, int]": "a pair of integers",
}


def fits(value: object, annotation: str) -> bool:
    """Whether `value` is of a settings field's annotation (`int | None`, `tuple[str, ...]`): bool
    is not taken for an integer, nor an integer-valued float for an integer; a list does for a tuple
    (JSON has no tuples). An annotation not listed above (a nested config) is not checked here."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    sequence = isinstance(value, (list, tuple))
    fit = {
        "None": value is None,
        "bool": isinstance(value, bool),
        "int": number and isinstance(value, int),
        "float": number,
        "str": isinstance(value, str),
        "tuple[str, ...]": sequence and all(isinstance(x, str) for x in value),
        "tuple[int, ...]": sequence and all(fits(x, "int") for x in value),
        "tuple[int, int]": sequence and len(value) == 2 and all(fits(x, "int") for x in value),
    }
    options = annotation.split(" | ")
    if not all(option in _NAMES for option in options):
        return True
    return any(fit[option] for option in options)


def describe(annotation: str) -> str:
    return " or ".join(_NAMES.get(option, option) for option in annotation.split(" | "))


def check_types(config: object) -> None:
    """Every field of the settings dataclass `config` holds a value of its annotated type, or one
    line naming the field as the API's keyword: `n: expected an integer, got '8'`."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if not fits(value, str(field.type)):
            raise UserError(f"{field.name}: expected {describe(str(field.type))}, got {value!r}"[:300])
