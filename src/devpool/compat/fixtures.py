"""Every fixture definition a session knows, by name, across pytest's versions.

pytest has no public lookup of all fixture definitions. Up to 9.1 its FixtureManager keeps
them in `_arg2fixturedefs` (name → definitions); from 9.2 in `_arg2node2fixturedefs` (name →
node → definitions) with a legacy `_arg2nodeid2fixturedefs` beside it.
"""

from __future__ import annotations

from typing import Any

import pytest


def fixture_definitions(session: pytest.Session) -> dict[str, list[Any]]:
    """Fixture name → its FixtureDefs (each once), whichever pytest this is."""
    manager: Any = session._fixturemanager  # noqa: SLF001 - pytest has no public lookup
    flat = getattr(manager, "_arg2fixturedefs", None)
    if isinstance(flat, dict):  # pytest <= 9.1
        return {name: list(defs) for name, defs in flat.items()}
    found: dict[str, list[Any]] = {}
    for table in ("_arg2node2fixturedefs", "_arg2nodeid2fixturedefs"):  # pytest >= 9.2
        for name, by_place in (getattr(manager, table, None) or {}).items():
            definitions = found.setdefault(name, [])
            for defs in by_place.values():
                definitions += [d for d in defs if all(d is not seen for seen in definitions)]
    return found
