"""What a worker's end leaves to tell: its exit in words, a test's own output, the log's tail."""

from __future__ import annotations

import signal

from devpool.report.terminal import tail
from devpool.run.attempts import Attempt
from devpool.run.pool import Slot


def own_output(slot: Slot, attempt: Attempt) -> str:
    """What the worker wrote to its log since this attempt started: its output, no other's."""
    try:
        with open(slot.worker.log, "rb") as log:
            log.seek(attempt.output_from)
            data = log.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()[-60:]
    if not any(line.strip() for line in lines):
        return ""  # no header over nothing in CRASHED and TIMEOUT blocks
    return "---- worker output during this test (tail) ----\n" + "\n".join(lines)


def describe_exit(code: int | None) -> str:
    """'exited with code 1', 'was killed by SIGKILL (signal 9)', or 'vanished'."""
    if code is None:
        return "vanished"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (signal {-code})"
    return f"exited with code {code}"


def worker_log_tail(slot: Slot) -> str:
    """The end of a worker's own output, for the log of a test it died before ("" if none)."""
    lines = tail(slot.worker.log, 60)
    if not any(line.strip() for line in lines):
        return ""
    return "---- worker log (tail) ----\n" + "\n".join(lines)
