"""A Ctrl-C or SIGTERM that comes while the run writes its results waits for them.

pytest handles an interrupt during the tests; one during pytest_sessionfinish (JUnit, the
run record, the duration history being written) would end the process with a traceback,
exit -2 and half-written files. The first such signal is noted and the run ends as
interrupted (exit 2) once the writes are done; a second one interrupts at once.
"""

from __future__ import annotations

import signal
from collections.abc import Generator
from typing import Any

import pytest


class FinishGuard:
    """The run's results are written whole: a Ctrl-C (or CI's SIGTERM) that comes while
    JUnit, the record and the history are written waits until they are, and the run then
    ends as interrupted (exit 2). A second one interrupts at once."""

    def __init__(self) -> None:
        self.late = _LateInterrupt()
        self.session: pytest.Session | None = None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        self.session = session
        self.late.install()
        return (yield)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self) -> None:
        self.late.restore()
        if self.late.signal is not None and self.session is not None:
            print(f"devpool: {self.late.signal} while the run wrote its results: written first")
            self.session.exitstatus = pytest.ExitCode.INTERRUPTED


class _LateInterrupt:
    """SIGINT and SIGTERM noted, not raised, once the run is writing its results."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self._noted)

    def _noted(self, signum: int, frame: object) -> None:
        if self.signal is not None:  # the second one: stop now
            self.restore()
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()
