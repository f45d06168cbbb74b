"""The protocol on the wire (worker/protocol.py has the messages): JSON lines written whole
on a pipe, a stream split back into one channel's typed messages, a worker's queue of
commands, and each message type's handler on its reader.

Like protocol.py, this module imports nothing but the standard library: Ray's rank actors
use it too.
"""

from __future__ import annotations

import os
import select
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from devpool.worker.protocol import COMMANDS, EVENTS, Channel, Message, ProtocolError, Stop, encode


def write(fd: int, *messages: Message, encoded: bytes = b"") -> None:
    """Write whole messages, after some `encoded` already, in one write (pipes block till then)."""
    data = encoded + b"".join(encode(message) for message in messages)
    while data:
        written = os.write(fd, data)
        data = data[written:]


class Reader:
    """Splits a non-blocking byte stream into one channel's typed messages."""

    def __init__(self, channel: Channel = EVENTS) -> None:
        self._buffer = b""
        self._decode = channel.decode

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [self._decode(line) for line in lines if line.strip()]

    def ended(self) -> list[Message]:
        """At end of file: what the worker held back and never sent (worker/held.py)."""
        return []


C = TypeVar("C", bound=Message)


class Commands:
    """The worker's end of the command pipe: blocking reads, and a peek between tests."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._reader = Reader(COMMANDS)
        self._queue: deque[Message] = deque()
        self._eof = False

    def _read(self, timeout: float | None) -> None:
        if self._eof:
            return
        if select.select([self.fd], [], [], timeout)[0]:
            data = os.read(self.fd, 65536)
            self._eof = not data
            self._queue.extend(self._reader.feed(data))

    def next(self) -> Message | None:
        """The next command, waiting for it; None once the controller has gone."""
        while not self._queue and not self._eof:
            self._read(None)
        return self._queue.popleft() if self._queue else None

    def wait_for(self, kind: type[C], accept: Callable[[C], bool] = lambda _: True) -> C | None:
        """The next command of one kind that `accept` takes, waiting for it; the others stay
        queued in order, those of that kind it refuses are dropped. None once the controller
        has gone."""
        while True:
            for message in list(self._queue):
                if isinstance(message, kind):
                    self._queue.remove(message)
                    if accept(message):
                        return message
            if self._eof:
                return None
            self._read(None)

    def pending(self) -> list[Message]:
        """Commands that arrived already, without waiting (e.g. a cancel mid-batch)."""
        self._read(0)
        if self._eof and not self._queue:
            return [Stop()]
        return list(self._queue)

    def drop(self, kind: type[Message]) -> None:
        self._queue = deque(m for m in self._queue if not isinstance(m, kind))

    def take(self, kind: type[C]) -> list[C]:
        """Remove and return the commands of one kind that arrived already (no waiting)."""
        self._read(0)
        taken = [m for m in self._queue if isinstance(m, kind)]
        self.drop(kind)
        return taken


Handler = Callable[..., None]


def handlers(owner: object, channel: Channel) -> dict[type[Message], Handler]:
    """owner's `_on_<tag>` method for each type of the channel, by type; ProtocolError
    names the types it has no handler for."""
    table = {cls: getattr(owner, f"_on_{tag}", None) for tag, cls in channel.types.items()}
    lacking = sorted(cls.__name__ for cls, handler in table.items() if handler is None)
    if lacking:
        raise ProtocolError(f"{type(owner).__name__} handles no {', '.join(lacking)}")
    return {cls: handler for cls, handler in table.items() if handler is not None}
