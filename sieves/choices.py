"""The names of the one-sided tests and of the corrections across tests (`sieves.stats`), in a
module of their own: the analyses' settings type their fields with them, and a command's `--help`
must not wait for scipy."""

from __future__ import annotations

from typing import Literal, get_args

Test = Literal["t", "z", "bootstrap"]
Correction = Literal["none", "holm", "bh"]
TESTS: tuple[Test, ...] = get_args(Test)
CORRECTIONS: tuple[Correction, ...] = get_args(Correction)
