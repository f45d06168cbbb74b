"""Errors a user can cause: each carries one sentence that names what was wrong."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class DevpoolError(Exception):
    """A mistake in the user's input (option, marker, config file, folder); exit code 4."""


def did_you_mean(word: str, known: Iterable[str], prefix: str = "") -> str:
    """'; did you mean max-parallel?' when one known word is close to `word`, else ''.

    Keys are compared with '_' read as '-' ([tool.devpool] keys are written with '-')."""
    choices = sorted(set(known))
    spelled = word.replace("_", "-").lower()
    by_form = {choice.replace("_", "-").lower(): choice for choice in choices}
    if spelled in by_form and by_form[spelled] != word:
        return f"; did you mean {prefix}{by_form[spelled]}?"
    close = difflib.get_close_matches(spelled, list(by_form), n=1, cutoff=0.75)
    return f"; did you mean {prefix}{by_form[close[0]]}?" if close else ""


def check_keys(
    table: Mapping[Any, object], known: Iterable[str], name: str, where: str = ""
) -> None:
    """Refuse the first key of a devpool table that is not known, naming the table and the key.

    name: the table as written in TOML, e.g. "tool.devpool.profiles.ci"; where: the file."""
    known = sorted(set(known))
    for key in table:
        if key not in known:
            hint = did_you_mean(str(key), known) or f"; known keys: {', '.join(known)}"
            place = f"{where}: " if where else ""
            raise DevpoolError(f"{place}[{name}] has unknown key {key!r}{hint}")
