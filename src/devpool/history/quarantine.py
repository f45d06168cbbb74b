"""Quarantine: tests that run and are reported, but whose failures do not gate the run.

Entries come from `@pytest.mark.quarantine(reason=..., owner=..., until="YYYY-MM-DD")`
and from a table keyed by node id (`[tool.devpool.quarantine."tests/x.py::test_a"]` or
a TOML file given by --devpool-quarantine-file). A key may name a module or a class
too (`tests/x.py`, `tests/x.py::TestA`), and an entry may be scoped to platforms.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from devpool.errors import DevpoolError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KEYS = {"reason", "owner", "until", "platforms"}


@dataclass(frozen=True)
class Entry:
    """One quarantine: which tests, why, whose, until when, where."""

    key: str  # a node id, or a module/class prefix of node ids
    reason: str
    owner: str = ""
    until: dt.date | None = None
    platforms: tuple[str, ...] | None = None
    source: str = ""  # where it was written, for messages

    def covers(self, nodeid: str, platform: str, kind: str) -> bool:
        if self.platforms is not None and not {platform, kind} & set(self.platforms):
            return False
        base = nodeid.split("[", 1)[0]
        return nodeid == self.key or base == self.key or nodeid.startswith(self.key + "::")

    def expired(self, today: dt.date) -> bool:
        return self.until is not None and self.until < today

    def describe(self) -> str:
        parts = [self.reason]
        if self.owner:
            parts.append(f"owner {self.owner}")
        if self.until:
            parts.append(f"until {self.until.isoformat()}")
        return "; ".join(parts)


def _date(value: object, where: str) -> dt.date:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError:
        raise DevpoolError(f"{where}: until={value!r} is not a date like 2026-12-31") from None


def _entry(key: str, fields: Mapping[str, object], where: str) -> Entry:
    unknown = sorted(set(fields) - KEYS)
    if unknown:
        raise DevpoolError(
            f"{where}: unknown key {unknown[0]!r}; an entry takes {', '.join(sorted(KEYS))}"
        )
    reason = fields.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise DevpoolError(f'{where}: needs reason = "why it is quarantined"')
    owner = fields.get("owner", "")
    if not isinstance(owner, str):
        raise DevpoolError(f"{where}: owner must be a string")
    until = _date(fields["until"], where) if fields.get("until") is not None else None
    platforms = fields.get("platforms")
    if platforms is not None:
        if not isinstance(platforms, list) or not all(isinstance(p, str) for p in platforms):
            raise DevpoolError(f"{where}: platforms must be a list of platform names")
        platforms = tuple(platforms)
    return Entry(key, reason, owner, until, platforms, where)


def entries_from_table(table: Mapping[str, object], source: str) -> list[Entry]:
    """Entries of a [tool.devpool.quarantine] table or a quarantine file."""
    entries = []
    for key, fields in table.items():
        where = f"{source}: quarantine entry {key!r}"
        if not isinstance(fields, Mapping):
            raise DevpoolError(f"{where} must be a table with reason, owner, until, platforms")
        entries.append(_entry(key, fields, where))
    return entries


def entries_from_file(path: Path) -> list[Entry]:
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DevpoolError(f"cannot read quarantine file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise DevpoolError(f"quarantine file {path} is not valid TOML: {exc}") from None
    return entries_from_table(table.get("quarantine", table), str(path))


def entry_from_marker(item: pytest.Item) -> Entry | None:
    """The quarantine marker of one test, checked; None when it has none."""
    mark = item.get_closest_marker("quarantine")
    if mark is None:
        return None
    where = f"{item.nodeid}: @pytest.mark.quarantine"
    fields = dict(mark.kwargs)
    if mark.args:
        if len(mark.args) > 1 or "reason" in fields:
            raise DevpoolError(f"{where} takes reason=, owner=, until= as keywords")
        fields["reason"] = mark.args[0]
    return _entry(item.nodeid, fields, where)


@dataclass
class Quarantine:
    """Every entry of the session, and the tests each one matched."""

    entries: list[Entry]
    platform: str
    kind: str

    def __post_init__(self) -> None:
        self.matched: set[Entry] = set()

    def find(self, item: pytest.Item) -> Entry | None:
        entry = entry_from_marker(item)
        if entry is not None:
            return entry
        for candidate in self.entries:
            if candidate.covers(item.nodeid, self.platform, self.kind):
                self.matched.add(candidate)
                return candidate
        return None

    def unmatched(self) -> list[Entry]:
        return [e for e in self.entries if e not in self.matched and self._in_scope(e)]

    def _in_scope(self, entry: Entry) -> bool:
        return entry.platforms is None or bool({self.platform, self.kind} & set(entry.platforms))


def expired(entries: Iterable[Entry], today: dt.date) -> list[Entry]:
    return [entry for entry in entries if entry.expired(today)]
