"""Where a run's jobs come from when it does not run its whole plan: a shared queue (issue 37).

The loop asks each turn for jobs newly given to it, and keeps going while more may come."""

from __future__ import annotations

from typing import Protocol

from devpool.plan.jobs import Job


class JobSource(Protocol):
    """Jobs handed to this run as it goes (queue/source.py claims them from the run's queue)."""

    def more(self, now: float) -> list[Job]:
        """Jobs to schedule now, often none."""
        ...

    def open(self) -> bool:
        """Whether more jobs may still come."""
        ...

    def withdrawn(self) -> list[Job]:
        """Jobs handed before and taken back: the loop drops those it has not started."""
        ...

    def due(self, now: float) -> float | None:
        """When the source wants to be asked again (None: whenever the loop wakes)."""
        ...

    def move(self, job: Job) -> bool:
        """A failed attempt is to run again: True when the source took the rerun to run
        elsewhere (another job of the run), False when it runs again here."""
        ...
