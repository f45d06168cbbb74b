"""The controller⇄worker messages: JSON lines over a pair of pipes, one schema for both ends.

controller → worker:  {"op": "run", "job": 7, "tests": [{"nodeid", "display", "attempt"}, ...]}
                      {"op": "more", "job": 7, "seq": 1, "tests": [...]}  (the same batch
                          goes on: sent before the worker runs dry, so no round trip
                          separates two parts of a batch)
                      {"op": "cancel"}  (skip the rest of the batch)   {"op": "stop"}
                      {"op": "terminal", "stdin"?, "stdout"?, "stderr"?}  (the answer to
                          "debugger": paths of the controller's own streams, lent until
                          "debugger_left"; none for a worker on another host)
                      {"op": "stdin", "path": ...}  (-s, one test at a time: tests read the
                          controller's stdin)
worker → controller:  {"ev": "ready", "pid": 123, "collected": 40}
                      {"ev": "start", "nodeid": ..., "location": [...]}
                      {"ev": "report", "data": <pytest_report_to_serializable>}
                      {"ev": "finish", "nodeid": ..., "location": [...]}
                      {"ev": "missing", "nodeid": ...}       (the worker did not collect it)
                      {"ev": "renamed", "nodeid": ..., "as": ...}  (collected at the same
                          place under another parametrize id; its events use the
                          controller's id)
                      {"ev": "warning", "nodeid", "location", "message", "category",
                       "filename", "lineno", "line", "once"?}  (a warning a test raised;
                          once: {"key", and for a fixture "node", "fixture", "param"}:
                          the import or wider fixture setup that raised it, which plain
                          pytest shows once: worker/warned.py)
                      {"ev": "shown", "text": ...}  (what pytest wrote to the terminal
                          mid-test under --setup-show: worker/shown.py)
                      {"ev": "debugger", "pid"}  (a test is entering the debugger: it
                          waits for "terminal"; its deadline stops meanwhile)
                      {"ev": "debugger_left", "pid"}  (the terminal goes back)
                      {"ev": "quit", "msg", "returncode"}  (pytest.exit in a test, `q` at
                          the debugger's prompt: the run ends as plain pytest's does)
                      {"ev": "output", "pid": 123, "data": <base64 pickle>}  (its
                          plugins' config.workeroutput, at its session's end)
                      {"ev": "done", "job": 7, "skipped": [node ids not run],
                       "through": 2}  (the last "more" it had; a done with a lower
                          "through" than the controller sent is not the end: the
                          worker will still answer the "more" it had not seen)
"""

from __future__ import annotations

import importlib
import json
import os
import select
import warnings
from collections import deque
from typing import Any

from _pytest._io.saferepr import saferepr

Message = dict[str, Any]


# One encoder for every message: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def encode(message: Message) -> bytes:
    return (_encode(message) + "\n").encode()


def write(fd: int, *messages: Message) -> None:
    """Write whole messages in one write; pipes take them in one piece or block until they can."""
    data = b"".join(encode(message) for message in messages)
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


class Commands:
    """The worker's end of the command pipe: blocking reads, and a peek between tests."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._reader = Reader()
        self._queue: deque[Message] = deque()
        self._eof = False

    def _read(self, timeout: float | None) -> None:
        if self._eof:
            return
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            data = os.read(self.fd, 65536)
            if not data:
                self._eof = True
            self._queue.extend(self._reader.feed(data))

    def next(self) -> Message | None:
        """The next command, waiting for it; None once the controller has gone."""
        while not self._queue and not self._eof:
            self._read(None)
        return self._queue.popleft() if self._queue else None

    def wait_for(self, op: str) -> Message | None:
        """The next command of one kind, waiting for it; the others stay queued in order.
        None once the controller has gone."""
        while True:
            for message in self._queue:
                if message["op"] == op:
                    self._queue.remove(message)
                    return message
            if self._eof:
                return None
            self._read(None)

    def pending(self) -> list[Message]:
        """Commands that arrived already, without waiting (e.g. a cancel mid-batch)."""
        self._read(0)
        if self._eof and not self._queue:
            return [{"op": "stop"}]
        return list(self._queue)

    def drop(self, op: str) -> None:
        self._queue = deque(m for m in self._queue if m["op"] != op)

    def take(self, op: str) -> list[Message]:
        """Remove and return the commands of one kind that arrived already (no waiting)."""
        self._read(0)
        taken = [m for m in self._queue if m["op"] == op]
        if taken:
            self._queue = deque(m for m in self._queue if m["op"] != op)
        return taken


# ---- what pytest's own serialization leaves out ------------------------------------------

SUBTEST_CONTEXT = "_subtest.context"  # pytest's key for a subtest report's msg and kwargs


def shown_subtest_values(data: Message) -> None:
    """A subtest's parameters as pytest shows them (their repr), since JSON keeps only some
    types: the controller would show `n='-1'` for a value that was not a string."""
    context = data.get(SUBTEST_CONTEXT)
    if isinstance(context, dict) and isinstance(context.get("kwargs"), dict):
        context["kwargs"] = {key: saferepr(value) for key, value in context["kwargs"].items()}
        context["devpool_shown"] = True


class Shown:
    """A value known only by its repr (a subtest parameter from a worker)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def restore_subtest_values(data: Message) -> None:
    """The controller's side of shown_subtest_values, before pytest rebuilds the report."""
    context = data.get(SUBTEST_CONTEXT)
    if isinstance(context, dict) and context.pop("devpool_shown", False):
        context["kwargs"] = {key: Shown(str(text)) for key, text in context["kwargs"].items()}


def warning_message(message: warnings.WarningMessage) -> Message:
    """A warning a test raised, for the controller's warnings summary."""
    category = message.category
    return {
        "message": str(message.message),
        "category": f"{category.__module__}:{category.__qualname__}",
        "filename": message.filename,
        "lineno": message.lineno,
        "line": message.line,
    }


def warning_from(data: Message) -> warnings.WarningMessage:
    """The controller's copy of a worker's warning: its category where it can be imported
    (as the summary prints it), its text as the worker formatted it."""
    module, _, name = str(data.get("category", "")).partition(":")
    category: type[Warning] = UserWarning
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
        if isinstance(found, type) and issubclass(found, Warning):
            category = found
    except (ImportError, AttributeError, ValueError):
        pass
    text = str(data.get("message", ""))
    try:
        instance: Warning = category(text)
    except Exception:  # noqa: BLE001 - a category whose constructor wants other arguments
        instance = UserWarning(text)
    return warnings.WarningMessage(
        instance,
        category,
        str(data.get("filename", "")),
        int(data.get("lineno") or 0),
        line=data.get("line"),
    )
