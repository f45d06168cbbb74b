"""Which of a test's warnings plain pytest would have shown once for the whole run.

Two kinds: a warning a module raised while it was imported (a process imports a module
once), and one a fixture wider than a test raised while it was set up (plain pytest sets a
module-, class-, package- or session-scoped fixture up once per parameter). Plain pytest
shows them under the first test that imported the module or needed the fixture; each worker
that runs such a test imports or sets up again, and would show them again. So the worker
names what raised each such warning ("import lazylib", "module test_x.py::data[0]", with
the fixture, its node and parameter), and the controller keeps one of each (run/warned.py).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest


def _importing(frame: FrameType | None) -> str | None:
    """'import NAME' when a module's own code (being imported) is on the stack."""
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            spec = frame.f_globals.get("__spec__")
            if spec is not None and getattr(spec, "_initializing", False):
                return f"import {frame.f_globals.get('__name__')}"
        frame = frame.f_back
    return None


class OnceWarnings:
    """A worker plugin: notes, as each warning of a test is caught, what raised it once."""

    def __init__(self) -> None:
        self.once: dict[int, dict[str, Any]] = {}  # id of a caught warning → what raised it
        self.setup: dict[str, Any] | None = None  # the wider fixture being set up now

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, Any]:
        # Inside pytest's catch_warnings(record=True) for the test: its showwarning is the
        # append of the list it records the test's warnings in.
        append = getattr(warnings, "_showwarnmsg_impl", None)
        log = getattr(append, "__self__", None)
        if not isinstance(log, list) or getattr(append, "__name__", "") != "append":
            return (yield)

        def note(message: Any) -> None:
            log.append(message)
            imported = _importing(sys._getframe(1))  # noqa: SLF001
            what = {"key": imported} if imported is not None else self.setup
            if what is not None:
                self.once[id(message)] = what

        warnings._showwarnmsg_impl = note  # type: ignore[attr-defined]  # noqa: SLF001
        try:
            return (yield)
        finally:
            if getattr(warnings, "_showwarnmsg_impl", None) is note:
                warnings._showwarnmsg_impl = append  # type: ignore[attr-defined]  # noqa: SLF001

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
        outer = self.setup
        if fixturedef.scope != "function":
            node = getattr(getattr(request, "node", None), "nodeid", "?")
            index = getattr(request, "param_index", 0)
            name = fixturedef.argname
            key = f"{fixturedef.scope} {node}::{name}[{index}]"
            self.setup = {"key": key, "node": node, "fixture": name, "param": index}
        try:
            return (yield)
        finally:
            self.setup = outer

    def once_of(self, message: Any) -> dict[str, Any] | None:
        """What raised this warning of the last test once, if plain pytest shows it once."""
        return self.once.get(id(message))

    def pytest_runtest_logstart(self) -> None:
        # The last test's warnings were all told (after its logfinish): ids may be reused.
        self.once.clear()
