"""The run loop's clock: time.monotonic, unless a test's scripted backend keeps its own.

Every deadline, wait and duration in run/ is read here, so that tests/run/fake_backend.py
can move time forward by as long as the loop would have waited, and a 30-second timeout is
tested in a moment. Wall-clock stamps for the record stay time.time().
"""

from __future__ import annotations

import time
from collections.abc import Callable

_source: Callable[[], float] = time.monotonic


def now() -> float:
    """Seconds on the loop's monotonic clock."""
    return _source()


def use(source: Callable[[], float]) -> None:
    """Read the time from source from now on (a scripted backend's clock)."""
    global _source  # noqa: PLW0603 - one clock per process, as time.monotonic is
    _source = source
