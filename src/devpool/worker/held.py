"""Messages a worker holds back, kept where the controller finds them if it dies first.

A passing test's reports do not need to reach the controller while the test runs: they go in
one write with the next test's start (or the batch's end), so a test costs one write to the
event pipe, and one wake-up of the controller, instead of one per phase. What is held is
also written, each time it grows, to this file beside the worker's log (a write to the page
cache wakes nobody). A worker that dies or is ended meanwhile (a crash, a timeout) has its
held messages read from here after its pipe's last bytes: the controller still sees that
the setup passed before the body hung, as pytest would have reported it.

The file holds one JSON line per message after an 8-byte length; a length of 0 means that
everything held has been sent. The worker clears it before writing to the pipe, so a
message is never read twice (a kill between the two loses what the pipe did not get, as
before this file existed).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from devpool.worker import protocol, wire

_LENGTH = 8


def held_file(stacks: Path) -> Path:
    """Where the worker whose stacks go to `stacks` keeps what it holds back."""
    return stacks.with_suffix(".held")


class HeldFile:
    """The worker's side: the file it rewrites with everything held so far."""

    def __init__(self, path: Path | None) -> None:
        self.fd = -1
        self.path = path
        if path is not None:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.full = False

    def put(self, held: bytes) -> None:
        """Everything held now (what was held before, and more)."""
        if self.fd >= 0:
            os.pwrite(self.fd, len(held).to_bytes(_LENGTH, "little") + held, 0)
            self.full = True

    def clear(self) -> None:
        """What was held is being sent."""
        if self.full:
            os.pwrite(self.fd, bytes(_LENGTH), 0)
            self.full = False

    def close(self, remove: bool = False) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        if remove and self.path is not None:
            self.path.unlink(missing_ok=True)


def read_held(path: Path) -> bytes:
    """The controller's side, after the worker ended: what it held and never sent (the file
    goes)."""
    try:
        with open(path, "rb") as kept:
            length = int.from_bytes(kept.read(_LENGTH), "little")
            data = kept.read(length) if length else b""
    except OSError:
        return b""
    path.unlink(missing_ok=True)
    return data


class HeldReader(wire.Reader):
    """A local worker's event reader: at end of file, what it held back and never sent."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def ended(self) -> list[protocol.Message]:
        self._buffer = b""  # a message cut off by the death: the held file's copy is whole
        return self.feed(read_held(self.path))
