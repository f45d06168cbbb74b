"""The closed set of ways a test can end, and how each one shows in pytest's terminal."""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """How a test ended. Every path through devpool lands on exactly one of these."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"  # setup or teardown failed
    TIMEOUT = "timeout"  # killed by devpool after its time limit
    CRASHED = "crashed"  # the worker process died under the test (signal, os._exit)
    INFRA = (
        "infra"  # could not run: no lease in time, unsatisfiable request, worker failed to start
    )
    SKIPPED = "skipped"
    FLAKY = "flaky"  # failed, then passed on a rerun

    @property
    def gates(self) -> bool:
        """Whether this outcome makes the run fail."""
        return self in GATING


GATING = frozenset({Outcome.FAILED, Outcome.ERROR, Outcome.TIMEOUT, Outcome.CRASHED, Outcome.INFRA})

# A failed attempt that will run again: shown in the terminal, never counted as a failure.
RERUN = "rerun"
