"""The queue as its readers see it (the verdict, `devpool queue status`, the host page): a
run's jobs and tests as rows, and the reads of the run as a whole, QueueStore's base."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devpool.queue.classes import FITS
from devpool.wording import counted

if TYPE_CHECKING:
    import psycopg

# A job that still holds its lease (SQL, {j}: the jobs table's alias).
LIVE = "NOT {j}.lost AND {j}.left_at IS NULL AND {j}.expires_at >= now()"


def a_live_job(*also: str) -> str:
    """SQL: a live job `o` of test `t`'s run whose class can run it, of which `also` holds."""
    where = " AND ".join(("o.run_id = t.run_id", LIVE.format(j="o"), FITS.format(j="o"), *also))
    return f"EXISTS (SELECT 1 FROM devpool_queue_jobs o WHERE {where})"


@dataclass(frozen=True)
class JobRow:
    """A job that joined the run."""

    job_id: int
    host: str
    pid: int
    devices: int
    platform: str
    alive: bool
    lost: bool
    claimed: int
    done: int
    kind: str = ""

    def describe(self) -> str:
        return f"{self.host} ({counted(self.devices, 'device')})"


@dataclass(frozen=True)
class TestRow:
    """A test of the run as the queue holds it."""

    position: int
    test_id: str
    devices: int
    request: str
    state: str  # queued, claimed, done
    outcome: str | None
    gating: bool
    result: Mapping[str, Any] | None
    job_id: int | None = None  # the job that holds or ran it
    platforms: str = ""  # its class ('' any)


class QueueReads:
    """Reads of one run on the queue's connection (store.py's QueueStore is one)."""

    db: psycopg.Connection[Any]  # devpool/database.py's connect()
    run_id: str

    def _args(self, **more: Any) -> dict[str, Any]:
        return {"run": self.run_id, **more}

    # ---- publishing and joining ------------------------------------------------------------

    def jobs(self) -> list[JobRow]:
        rows = self.db.execute(
            "SELECT j.job_id, j.host, j.pid, j.devices, j.platform, "
            "(NOT j.lost AND j.left_at IS NULL AND j.expires_at >= now()), j.lost, "
            "count(t.*) FILTER (WHERE t.state = 'claimed'), "
            "count(t.*) FILTER (WHERE t.state = 'done'), j.kind "
            "FROM devpool_queue_jobs j LEFT JOIN devpool_queue_tests t "
            "ON t.run_id = j.run_id AND t.job_id = j.job_id "
            "WHERE j.run_id = %(run)s GROUP BY j.job_id ORDER BY j.job_id",
            self._args(),
        ).fetchall()
        return [
            JobRow(int(r[0]), r[1], int(r[2]), int(r[3]), r[4], r[5], r[6], r[7], r[8], r[9])
            for r in rows
        ]

    def remaining(self) -> int:
        """Tests of the run without their final outcome yet that a job may still end: claimed,
        or queued with a live job of their class (a class none has is not taken)."""
        row = self.db.execute(
            "SELECT count(*) FROM devpool_queue_tests t WHERE run_id = %(run)s "
            f"AND (state = 'claimed' OR (state = 'queued' AND {a_live_job()}))",
            self._args(),
        ).fetchone()
        return int(row[0]) if row else 0

    def tests(self) -> list[TestRow]:
        """Every test of the run, in collection order."""
        rows = self.db.execute(
            "SELECT position, test_id, devices, request, state, outcome, "
            "coalesce(gating, false), result, job_id, platforms FROM devpool_queue_tests "
            "WHERE run_id = %(run)s ORDER BY position",
            self._args(),
        ).fetchall()
        return [TestRow(*row) for row in rows]

    # ---- read only, for the host page (serve/queue_view.py) --------------------------------

    def newest_runs(self, most: int) -> list[tuple[str, float]]:
        """The newest runs published on this database, newest first: (run id, when)."""
        rows = self.db.execute(
            "SELECT run_id, extract(epoch FROM published_at) FROM devpool_queue_runs "
            "ORDER BY published_at DESC, run_id LIMIT %(most)s",
            {"most": most},
        ).fetchall()
        return [(str(run), float(when)) for run, when in rows]

    def lapsed(self) -> set[int]:
        """Jobs of the run whose lease ran out and that no reap has marked lost yet: lost, as
        the next reap will say, read without writing it."""
        rows = self.db.execute(
            "SELECT job_id FROM devpool_queue_jobs WHERE run_id = %(run)s AND NOT lost "
            "AND left_at IS NULL AND expires_at < now()",
            self._args(),
        ).fetchall()
        return {int(row[0]) for row in rows}
