"""SLOW lines: a test still running past --devpool-slow-timeout is said so, and again at each
multiple of it, as cargo-nextest does (`SLOW [> 60s] test_x.py::test_a`).

It follows the run's events (an attempt's `started` and any later move), so the loop needs
nothing of it; the controller asks it for lines whenever the loop flushes the record (at
least once a second).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class _Running:
    nodeid: str
    since: float  # monotonic
    said: int = 0  # multiples of the limit said so far


class SlowTests:
    """Which attempts run now, since when; the SLOW lines that are due."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._running: dict[tuple[int, int], _Running] = {}

    def event(self, event_type: str, fields: Mapping[str, Any]) -> None:
        if event_type == "report" and (
            fields.get("when") == "call" or fields.get("outcome") != "passed"
        ):
            # its result is on the terminal (a letter): nothing more is said of it while its
            # teardown runs, as pytest would say nothing (a line after the run's last letter
            # would make pytest write its percentage again on a line of its own)
            nodeid = fields.get("nodeid")
            for key in [k for k, r in self._running.items() if r.nodeid == nodeid]:
                del self._running[key]
            return
        if event_type != "attempt":
            return
        key = (int(fields.get("job", -1)), int(fields.get("attempt", 0)))
        if fields.get("state") == "started":
            self._running[key] = _Running(str(fields.get("nodeid", "?")), time.monotonic())
        else:
            self._running.pop(key, None)

    def due(self, now: float | None = None) -> list[str]:
        """The lines to print now: one per test that passed its next multiple of the limit."""
        now = time.monotonic() if now is None else now
        lines = []
        for running in self._running.values():
            passed = int((now - running.since) // self.limit)
            if passed > running.said:
                running.said = passed
                lines.append(f"SLOW [> {passed * self.limit:g}s] {running.nodeid}")
        return lines
