"""SIGTERM in the controller: a CI step's timeout ends the run as Ctrl-C would."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, ended as Ctrl-C: pytest's banner names the signal, with no source line."""


# pytest's banner shows the exception as Python prints it: `SIGTERM: ...`, not a class path.
Terminated.__module__, Terminated.__name__, Terminated.__qualname__ = "builtins", *["SIGTERM"] * 2


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A CI step timeout sends SIGTERM: end the run as Ctrl-C would, workers and leases freed."""

    def interrupt(signum: int, frame: object) -> None:
        raise Terminated("the run was ended as at Ctrl-C, its workers and leases freed")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
