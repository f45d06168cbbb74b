"""Without --devices devpool stays out of the way, but says so once when tests need devices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest


class DormantNotice:
    """Registered when no --devices is given: one line when device-marked tests were collected.

    Those tests then run in the pytest process itself, without device leases: nothing
    keeps two of them, or two runs, off the same card. A newcomer should learn that."""

    def __init__(self, unused: Sequence[str] = ()) -> None:
        self.marked = 0
        self.unused = list(unused)  # devpool options on the command line, idle without devices

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # trylast: after every collection hook, so markers a conftest adds count too.
        self.marked = sum(
            1
            for item in session.items
            if any(item.get_closest_marker(name) for name in ("device_count", "nodes", "ranks"))
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.unused:
            verb = "has" if len(self.unused) == 1 else "have"
            terminalreporter.write_line(
                f"devpool: off: {', '.join(self.unused)} {verb} no effect without --devices",
                yellow=True,
            )
        if not self.marked:
            return
        tests = "1 test needs" if self.marked == 1 else f"{self.marked} tests need"
        terminalreporter.write_line(
            f"devpool: off: {tests} devices or ranks (device_count, nodes, ranks) and ran "
            "without device leases, each in one process; "
            'turn devpool on with --devices auto, or devices = "auto" under [tool.devpool] '
            "in pyproject.toml",
            yellow=True,
        )
