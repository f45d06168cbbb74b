"""What a worker's end leaves to tell: its exit in words, a test's own output, the log's tail."""

from __future__ import annotations

from devpool.report.terminal import tail
from devpool.run.attempts import Attempt
from devpool.run.pool import Slot
from devpool.wording import describe_exit

__all__ = ["describe_exit", "own_output", "worker_log_tail"]


def own_output(slot: Slot, attempt: Attempt) -> str:
    """What the worker wrote to its log since this attempt started: its output, no other's."""
    ranks = getattr(slot.worker, "rank_output", None)  # a rank group: each rank's, labelled
    if ranks is not None:
        return str(ranks())
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


def worker_log_tail(slot: Slot) -> str:
    """The end of a worker's own output, for the log of a test it died before ("" if none)."""
    lines = tail(slot.worker.log, 60)
    if not any(line.strip() for line in lines):
        return ""
    return "---- worker log (tail) ----\n" + "\n".join(lines)
