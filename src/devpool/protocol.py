"""The controller⇄worker messages: JSON lines over a pair of pipes, one schema for both ends.

controller → worker:  {"op": "run", "job": 7, "nodeids": [...]}   {"op": "stop"}
worker → controller:  {"ev": "ready", "pid": 123, "collected": 40}
                      {"ev": "start", "nodeid": ..., "location": [...]}
                      {"ev": "report", "data": <pytest_report_to_serializable>}
                      {"ev": "finish", "nodeid": ..., "location": [...]}
                      {"ev": "missing", "nodeid": ...}       (the worker did not collect it)
                      {"ev": "done", "job": 7}
"""

from __future__ import annotations

import json
import os
from typing import Any

Message = dict[str, Any]


def encode(message: Message) -> bytes:
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


def write(fd: int, message: Message) -> None:
    """Write one whole message; pipes take it in one piece or block until they can."""
    data = encode(message)
    while data:
        written = os.write(fd, data)
        data = data[written:]


class Reader:
    """Splits a non-blocking byte stream into messages."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def read_lines(fd: int) -> Any:
    """Blocking generator of messages from fd, ending at EOF (the worker's command loop)."""
    reader = Reader()
    while True:
        data = os.read(fd, 65536)
        if not data:
            return
        yield from reader.feed(data)
