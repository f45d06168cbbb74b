"""The controller's end of every worker's event pipe, for any backend.

Each worker's events arrive as JSON lines on a non-blocking pipe (for a Ray worker, a
local pipe its bridge thread fills). One selector watches them all.
"""

from __future__ import annotations

import os
import selectors
from collections.abc import Callable
from typing import Any

from devpool.worker import protocol


def read_available(fd: int) -> tuple[bytes, bool]:
    """Everything a non-blocking fd holds now, and whether it reached end of file."""
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, OSError):
            return b"".join(chunks), False
        if not data:
            return b"".join(chunks), True
        chunks.append(data)


class _Callback:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback


class EventPipes:
    """Watches workers' event pipes; a worker has `fd_out` and a `reader` (wire.Reader)."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()

    def watch(self, worker: Any) -> None:
        self.selector.register(worker.fd_out, selectors.EVENT_READ, worker)

    def call(self, fd: int, callback: Callable[[], None]) -> None:
        """Call back when fd is readable (a fork server's socket), instead of reading it."""
        self.selector.register(fd, selectors.EVENT_READ, _Callback(callback))

    def uncall(self, fd: int) -> None:
        if fd in self.selector.get_map():
            self.selector.unregister(fd)

    def forget(self, worker: Any) -> None:
        if worker.fd_out in self.selector.get_map():
            self.selector.unregister(worker.fd_out)

    def poll(self, timeout: float) -> list[tuple[Any, list[protocol.Message], bool]]:
        """Events that arrived within timeout: (worker, messages, reached_eof)."""
        results = []
        for key, _ in self.selector.select(timeout):
            worker = key.data
            if isinstance(worker, _Callback):
                worker.callback()
                continue
            data, eof = read_available(worker.fd_out)
            messages = worker.reader.feed(data)
            if eof:
                self.forget(worker)
                messages += worker.reader.ended()
            results.append((worker, messages, eof))
        return results

    def drain(self, worker: Any) -> list[protocol.Message]:
        """Whatever an exited worker still had in its pipe; stops watching that pipe."""
        data, _ = read_available(worker.fd_out)
        self.forget(worker)
        return [*worker.reader.feed(data), *worker.reader.ended()]

    def empty(self) -> bool:
        return not any(not isinstance(k.data, _Callback) for k in self.selector.get_map().values())

    def close(self) -> None:
        self.selector.close()
