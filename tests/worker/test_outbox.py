"""Unit tests for devpool.worker.held's Outbox: what a worker holds back, and in what order."""

from __future__ import annotations

import os
from pathlib import Path

from devpool.worker import protocol, wire
from devpool.worker.held import Outbox, read_held


def _read_all(fd: int) -> list[protocol.Message]:
    os.set_blocking(fd, False)
    reader = wire.Reader()
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return reader.feed(data)


def test_held_messages_go_first_in_one_write_and_the_held_file_is_cleared(tmp_path: Path) -> None:
    read, write = os.pipe()
    outbox = Outbox(write)
    outbox.keep_in(tmp_path / "w.held")
    start = protocol.Start(nodeid="t.py::a", location=["t.py", 1, "a"])
    finish = protocol.Finish(nodeid="t.py::a", location=["t.py", 1, "a"])
    outbox.hold(start, keep=True)
    outbox.hold(finish, keep=False)

    assert read_held(tmp_path / "w.held")  # the kept part is there for the controller
    outbox.hold(start, keep=True)
    outbox.send(protocol.Shown(text="x"))

    assert _read_all(read) == [start, finish, start, protocol.Shown(text="x")]
    assert outbox.held == []
    assert read_held(tmp_path / "w.held") == b""  # sent: nothing left to read twice
    os.close(read)
    os.close(write)


def test_inserted_messages_keep_their_place_among_the_held() -> None:
    read, write = os.pipe()
    outbox = Outbox(write)
    first, last = protocol.Shown(text="1"), protocol.Shown(text="3")
    outbox.hold(first, keep=False)
    outbox.hold(last, keep=False)
    outbox.insert(1, [protocol.Shown(text="2")])
    outbox.send_held()

    assert [m.text for m in _read_all(read) if isinstance(m, protocol.Shown)] == ["1", "2", "3"]
    os.close(read)
    os.close(write)
