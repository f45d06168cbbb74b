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
from collections.abc import Sequence
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


class Outbox:
    """The worker's messages to the controller: sent in one write with those held before
    them, or held for the next write (and meanwhile kept in the held file)."""

    def __init__(self, fd_out: int) -> None:
        self.fd_out = fd_out  # -1 in a template: a forked child gets its own pipe
        # A passing test's reports and its finish wait for the next message (the next test's
        # start, or the batch's done): one write per test. Those held while test code runs
        # are also in the held file, for the controller if this process dies.
        self.held: list[protocol.Message] = []
        self._kept, self._kept_count = b"", 0  # the encoded head of held, in the held file
        self.file = HeldFile(None)

    def keep_in(self, path: Path) -> None:
        """Keep what is held in the file at path from now on."""
        self.file.close()
        self.file = HeldFile(path)

    def send(self, *messages: protocol.Message) -> None:
        """Send messages after those held (they keep their order), in one write."""
        held, self.held = self.held[self._kept_count :], []
        encoded, self._kept, self._kept_count = self._kept, b"", 0
        self.file.clear()  # before the write: no message is read twice
        wire.write(self.fd_out, *held, *messages, encoded=encoded)

    def send_held(self) -> None:
        if self.held:
            self.send()

    def hold(self, message: protocol.Message, keep: bool) -> None:
        """Hold a message for the next write; keep: test code runs before that write (held file)."""
        self.held.append(message)
        if keep:
            fresh = self.held[self._kept_count :]
            self._kept += b"".join(protocol.encode(m) for m in fresh)
            self._kept_count = len(self.held)
            self.file.put(self._kept)

    def insert(self, at: int, messages: Sequence[protocol.Message]) -> None:
        """Hold messages at a place among those held (the held file is not rewritten)."""
        if at < self._kept_count:  # never: the teardown report is held, not kept
            self._kept, self._kept_count = b"", 0
        self.held[at:at] = messages


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
