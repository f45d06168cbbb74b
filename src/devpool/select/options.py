"""[tool.devpool.select]: what selection treats as inputs, identity and noise."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devpool.config import SELECT_KEYS
from devpool.config.values import select_mode
from devpool.errors import DevpoolError, check_keys

DEFAULT_IGNORE = ("*.md", "*.rst", "docs/*", "LICENSE*", ".gitignore")
DEFAULT_KEY_PACKAGES = ("pytest",)
DEFAULT_FULL_ON = ("main", "master", "merge-queue", "schedule")
DEFAULT_KEEP = 5  # generations kept per bucket (and identity, in a database)


@dataclass(frozen=True)
class SelectOptions:
    """The [tool.devpool.select] table, checked."""

    inputs: tuple[str, ...] = ()  # globs: compatibility inputs, a change means a full run
    ignore: tuple[str, ...] = DEFAULT_IGNORE  # globs: changes that affect no test
    key_packages: tuple[str, ...] = DEFAULT_KEY_PACKAGES  # exact versions in the identity
    max_age_days: float = 14.0
    full_on: tuple[str, ...] = DEFAULT_FULL_ON  # where `auto` runs everything and records
    keep: int = DEFAULT_KEEP  # the newest generations kept, older ones dropped on writing

    def ignored(self, rel: str) -> bool:
        """Whether a changed file matches the ignore globs."""
        return matches(rel, self.ignore)


def select_options(table: Mapping[str, Any], where: str) -> SelectOptions:
    """Read [tool.devpool.select] (absent, or a mode string: the defaults)."""
    section = table.get("select")
    if not isinstance(section, Mapping):
        return SelectOptions()
    check_keys(section, SELECT_KEYS, "tool.devpool.select", where)
    values: dict[str, Any] = {}
    for key in ("inputs", "ignore", "key-packages", "full-on"):
        if key in section:
            items = section[key]
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise DevpoolError(
                    f"{where}: [tool.devpool.select] {key} must be a list of strings"
                )
            values[key.replace("-", "_")] = tuple(items)
    if "max-age-days" in section:
        age = section["max-age-days"]
        if isinstance(age, bool) or not isinstance(age, (int, float)) or age <= 0:
            raise DevpoolError(f"{where}: [tool.devpool.select] max-age-days must be a number > 0")
        values["max_age_days"] = float(age)
    if "keep" in section:
        keep = section["keep"]
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise DevpoolError(f"{where}: [tool.devpool.select] keep must be a whole number >= 1")
        values["keep"] = keep
    return SelectOptions(**values)


def matches(rel: str, globs: tuple[str, ...] | list[str]) -> bool:
    """Whether a posix path relative to the rootdir matches one of the globs.

    `*` crosses folders (fnmatch), and a glob without a folder also matches the file name
    in any folder, as .gitignore does."""
    name = rel.rsplit("/", 1)[-1]
    return any(
        fnmatch.fnmatchcase(rel, g) or ("/" not in g and fnmatch.fnmatchcase(name, g))
        for g in globs
    )


def mode_of(option: str | None, table: Mapping[str, Any]) -> str:
    """The select mode: the command line's, else [tool.devpool] select, else off."""
    raw: object = option if option is not None else table.get("select", "off")
    try:
        return select_mode(raw)
    except ValueError:
        return "off"  # the controller reports the bad value; a worker just does not record
