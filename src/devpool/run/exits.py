"""What a worker's end leaves to tell: its exit in words, a test's own output, the log's tail."""

from __future__ import annotations

import re

from devpool.report.terminal import tail
from devpool.run.attempts import Attempt
from devpool.run.pool import Slot
from devpool.wording import describe_exit

__all__ = ["describe_exit", "own_output", "worker_log_tail"]

OWN_LINES = 60  # of a test's own output, in its CRASHED or TIMEOUT report
DUMP_LINES = 2000  # where a crash's stack dump is looked for, from the end of that output
# The first line of a faulthandler dump or of one of its thread blocks.
_DUMP = re.compile(r"^(Fatal Python error: |Current thread 0x|Thread 0x)")


def own_output(slot: Slot, attempt: Attempt) -> str:
    """What the worker wrote to its log since this attempt started: its output, no other's."""
    ranks = slot.worker.rank_output()  # a rank group: each rank's, labelled
    if ranks is not None:
        return ranks
    try:
        with open(slot.worker.log, "rb") as log:
            log.seek(attempt.output_from)
            data = log.read()
    except OSError:
        return ""
    every = data.decode("utf-8", "replace").splitlines()
    start = max(0, len(every) - OWN_LINES)
    dump = _dump_start(every[-DUMP_LINES:])
    if dump is not None:
        # A crash's stack dump whole, whatever its length: cut at a line count, it would begin
        # inside some thread's frames and could leave out the crashing frame (its top).
        # The report folds the machinery frames (worker/stacks.py), so it stays short.
        start = min(start, len(every) - len(every[-DUMP_LINES:]) + dump)
    lines = every[start:]
    if not any(line.strip() for line in lines):
        return ""  # no header over nothing in CRASHED and TIMEOUT blocks
    return "---- worker output during this test (tail) ----\n" + "\n".join(lines)


def _dump_start(lines: list[str]) -> int | None:
    """Where the last faulthandler dump in these lines begins (its first line), or None."""
    begins = [i for i, line in enumerate(lines) if _DUMP.match(line)]
    if not begins:
        return None
    first = begins[-1]
    # One dump is a run of thread blocks (and a 'Fatal Python error' line above them).
    for index in reversed(begins[:-1]):
        between = lines[index + 1 : first]
        if any(line.strip() and not line.startswith(" ") for line in between):
            break
        first = index
    return first


def worker_log_tail(slot: Slot) -> str:
    """The end of a worker's own output, for the log of a test it died before ("" if none)."""
    lines = tail(slot.worker.log, 60)
    if not any(line.strip() for line in lines):
        return ""
    return "---- worker log (tail) ----\n" + "\n".join(lines)
