"""The project's settings as the `devpool` command sees them, without a pytest session.

The command reads the same [tool.devpool] table (and profile) a run would: from the
nearest pyproject.toml at or above the current folder, as pytest finds its rootdir.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devpool.config import OPTIONS, Settings, read_table, settings_from


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml in start or a folder above it; None when there is none."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def option_value(args: Sequence[str], name: str) -> str | None:
    """The last value of `--name VALUE` or `--name=VALUE` in a pytest argument list."""
    value = None
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith(f"{name}="):
            value = arg.split("=", 1)[1]
        elif arg == name and index + 1 < len(args):
            value = args[index + 1]
    return value


def project_settings(
    start: Path,
    pytest_args: Sequence[str] = (),
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Settings from the project's [tool.devpool] (and profile) under the --devices and
    --devpool-<name> values of a pytest argument list; overrides (dest → value) win."""
    pyproject = find_pyproject(start)
    options: dict[str, Any] = {"devpool_devices": option_value(pytest_args, "--devices")}
    for option in OPTIONS:
        if option.flag:
            if option.cli in pytest_args:
                options[option.dest] = True
            elif option.negatable and f"--devpool-no-{option.name}" in pytest_args:
                options[option.dest] = False
        else:
            options[option.dest] = option_value(pytest_args, option.cli)
    options.update({k: v for k, v in (overrides or {}).items() if v is not None})
    where = str(pyproject) if pyproject is not None else "pyproject.toml"
    return settings_from(options, read_table(pyproject), where, environ)
