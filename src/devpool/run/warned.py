"""The warnings workers send, told to pytest as plain pytest would have recorded them.

A test's own warnings are told as they come. One that plain pytest shows once for the run
(a module's import raised it, or a wider fixture's setup: worker/warned.py) is held: each
worker that imported the module or set up the fixture raised it again. At the run's end one
of each is told, under the first test in collection order that raised it, and the run's
warnings are put in collection order, the order plain pytest's summary lists them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from devpool.worker.protocol import Warned
from devpool.worker.serialized import warning_from

_SCOPES = ("session", "package", "module", "class")


class WorkerWarnings:
    """Tells pytest the warnings the workers raised (pytest_warning_recorded)."""

    def __init__(self, config: pytest.Config, collected: Mapping[str, Any]) -> None:
        self.config = config
        self.items = collected  # node id → item, in collection order
        self.places = {nodeid: place for place, nodeid in enumerate(collected)}
        self.users: dict[str, str | None] = {}  # a fixture setup → the first test needing it
        self.received = 0  # warnings received so far: a test's keep the order it raised them
        self.held: dict[str, tuple[tuple[int, int, int], str, Warned]] = {}  # once → first
        self.told: dict[int, tuple[int, int, int]] = {}  # id of the terminal's entry → its order
        self.start: int | None = None  # where the run's warnings begin in the terminal's list

    def tell(self, nodeid: str, message: Warned) -> None:
        """One warning of a test (told under nodeid: a --devpool-repeat turn's own)."""
        self.received += 1
        place = self.places.get(message.nodeid, len(self.places))
        order = (place, len(_SCOPES), self.received)
        once = message.once
        if isinstance(once, dict) and once.get("key"):
            if once.get("fixture"):  # plain pytest set it up for its first test that needs it
                user = self._first_user(once)
                if user is not None:
                    # Its wider fixtures are set up before its body runs, widest first.
                    scope = str(once["key"]).split(" ", 1)[0]
                    rank = _SCOPES.index(scope) if scope in _SCOPES else len(_SCOPES)
                    nodeid, order = user, (self.places[user], rank, self.received)
            # Not by where it points: an import's warning names its first importer's line.
            key = f"{once['key']}\0{message.category}\0{message.message}"
            kept = self.held.get(key)
            if kept is None or order < kept[0]:
                self.held[key] = (order, nodeid, message)
            return
        self._record(nodeid, order, message)

    def _record(self, nodeid: str, order: tuple[int, int, int], message: Warned) -> None:
        shown = self._list()
        if self.start is None:
            self.start = len(shown)
        before = len(shown)
        location = message.location
        self.config.hook.pytest_warning_recorded.call_historic(
            kwargs={
                "warning_message": warning_from(message),
                "when": "runtest",
                "nodeid": nodeid,
                "location": tuple(location) if location else None,
            }
        )
        for entry in shown[before:]:
            self.told[id(entry)] = order

    def _first_user(self, once: dict[str, Any]) -> str | None:
        """The first test in collection order that needs this fixture setup (None: none)."""
        key = str(once["key"])
        if key not in self.users:
            node, name, param = str(once.get("node", "")), once["fixture"], once.get("param", 0)
            self.users[key] = next(
                (
                    nodeid
                    for nodeid, item in self.items.items()
                    if (not node or nodeid.startswith((f"{node}::", f"{node}/")))
                    and name in getattr(item, "fixturenames", ())
                    and _param(item, name) in (param, None)
                ),
                None,
            )
        return self.users[key]

    def _list(self) -> list[Any]:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        stats = getattr(terminal, "stats", None)
        return stats.setdefault("warnings", []) if isinstance(stats, dict) else []

    def finish(self) -> None:
        """The held warnings, one of each, then the run's warnings in collection order."""
        for order, nodeid, message in sorted(self.held.values(), key=lambda held: held[0]):
            self._record(nodeid, order, message)
        self.held = {}
        if self.start is None:
            return
        shown = self._list()
        last = (len(self.places) + 1, 0, 0)  # what was not told here keeps its place after
        run = shown[self.start :]
        run.sort(key=lambda entry: self.told.get(id(entry), last))
        shown[self.start :] = run


def _param(item: Any, name: str) -> int | None:
    """Which parameter of a parametrized fixture the test uses (None: not parametrized)."""
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    found = indices.get(name)
    return int(found) if isinstance(found, int) else None
