"""How settings are read: the [tool.devpool] table of a pyproject.toml, and one parser per
kind of option value, each raising ValueError with what the value should have been
(config.Option.parse)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devpool.errors import DevpoolError
from devpool.history.location import HistorySpec, history_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def read_table(pyproject: Path | None) -> dict[str, Any]:
    """The [tool.devpool] table of a pyproject.toml, {} when there is none."""
    if pyproject is None or not pyproject.is_file():
        return {}
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise DevpoolError(f"{pyproject} is not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("devpool", {})
    if not isinstance(table, dict):
        raise DevpoolError(f"{pyproject}: [tool.devpool] must be a table")
    return table


def positive_int(value: object) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if isinstance(value, bool) or number < 1:
        raise ValueError("a whole number ≥ 1")
    return number


def seconds(value: object) -> float:
    try:
        number = float(str(value))
    except ValueError:
        number = 0.0
    if isinstance(value, bool) or not number > 0:
        raise ValueError("a number of seconds > 0")
    return number


def count(value: object) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = -1
    if isinstance(value, bool) or number < 0:
        raise ValueError("a whole number ≥ 0")
    return number


def delay(value: object) -> float:
    try:
        number = float(str(value))
    except ValueError:
        number = -1.0
    if isinstance(value, bool) or not number >= 0:
        raise ValueError("a number of seconds ≥ 0")
    return number


def flaky_result(value: object) -> str:
    if value not in ("pass", "fail"):
        raise ValueError("'pass' (flaky tests do not gate) or 'fail' (they do)")
    return str(value)


SELECT_MODES = ("record", "on", "shadow", "auto", "off")


def select_mode(value: object) -> str:
    """--devpool-select / [tool.devpool] select: a mode, or the [tool.devpool.select] table."""
    if isinstance(value, Mapping):
        value = value.get("mode", "off")
    if value not in SELECT_MODES:
        raise ValueError("one of " + ", ".join(repr(m) for m in SELECT_MODES))
    return str(value)


def backend(value: object) -> str:
    if value not in ("local", "ray"):
        raise ValueError("'local' or 'ray'")
    return str(value)


def flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError("true or false")


def text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("a non-empty string")
    return value


def names(value: object) -> tuple[str, ...]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError("platform names, comma-separated (e.g. h100,h200)")
    clean = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not clean:
        raise ValueError("platform names, comma-separated (e.g. h100,h200), not nothing")
    return clean


def history(value: object) -> HistorySpec:
    return history_spec(text(value))


def fraction(value: object) -> float:
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        number = -1.0
    if isinstance(value, bool) or not 0 <= number < 1:
        raise ValueError("a share of each device's memory, e.g. '5%' or 0.05 (0 up to 100%)")
    return number


def isolation(value: object) -> str:
    if value not in ("worker", "module", "job"):
        raise ValueError(
            "'worker' (warm reuse), 'module' (a fresh process per test module) "
            "or 'job' (a fresh process per test)"
        )
    return str(value)


def leaks(value: object) -> str:
    if value not in ("warn", "fail", "off"):
        raise ValueError(
            "'warn' (report what a test left behind), 'fail' (the leak fails the test) "
            "or 'off' (check nothing)"
        )
    return str(value)
