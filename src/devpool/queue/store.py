"""The queue in PostgreSQL: a run's tests, the jobs that joined it, their claims and outcomes.

QueueStore is the one connection everything else talks to; its parts keep a concern each:
publication.py (the run's tests), leases.py (the jobs' leases), claims.py (claims and the
fencing token every report carries), rows.py (the reads of the run as a whole). Times are
the database's own (now()), so the hosts' clocks need not agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from devpool.database import connect, where
from devpool.errors import DevpoolError
from devpool.queue.claims import Claim as Claim
from devpool.queue.claims import Claims
from devpool.queue.compare import QueuedTest as QueuedTest
from devpool.queue.leases import JobLeases
from devpool.queue.publication import Publication
from devpool.queue.rows import QueueReads, a_live_job
from devpool.queue.schema import NEWEST_COLUMN, SCHEMA, SCHEMA_LOCK


class QueueStore(QueueReads):
    """One connection to the queue's database, for one run (its reads of the run as a whole:
    rows.py)."""

    def __init__(
        self, url: str, run_id: str, option: str = "--devpool-queue", read_only: bool = False
    ) -> None:
        """read_only: never makes or alters the tables (the host page); DevpoolError when
        the database has no queue yet."""
        self.url = url
        self.run_id = run_id
        self.db = connect(url, option)
        self._take_parts()
        if read_only:
            made = self.db.execute("SELECT to_regclass('devpool_queue_tests')").fetchone()
            if made is None or made[0] is None:
                self.db.close()
                raise DevpoolError(
                    f"no devpool queue at {where(url)} yet: no job of a run has reached it"
                )
            return
        if not self._ready():  # the first job ever on this database, or an older devpool's
            with self.db.transaction():
                self.db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                # Made by the job this one waited for: its ALTERs again would lock table after
                # table while other jobs read them, and two such orders deadlock.
                if not self._ready():
                    self.db.execute(SCHEMA)

    def _take_parts(self) -> None:
        """Its parts, each a concern of the queue, on this store's connection and run."""
        self.publication = Publication(self)
        self.leases = JobLeases(self)
        self.claims = Claims(self, self.leases)

    def _ready(self) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = 'devpool_queue_tests' AND column_name = %s",
                (NEWEST_COLUMN,),
            ).fetchone()
            is not None
        )

    def close(self) -> None:
        self.db.close()

    # ---- publishing (publication.py) -------------------------------------------------------

    def publish(self, tests: Sequence[QueuedTest], by: str, classes: Sequence[str] = ()) -> bool:
        """Publish the run's tests (True), or check ours against those published (False)."""
        return self.publication.publish(tests, by, classes)

    def published(self) -> bool:
        return self.publication.published()

    def classes(self) -> list[str] | None:
        """The classes the run declared it covers ([] all); None when it was never started."""
        return self.publication.classes()

    def fill_chains(self, tests: Sequence[QueuedTest]) -> None:
        """The chains of a class's tests, set before any of them is claimed."""
        self.publication.fill_chains(tests)

    # ---- the jobs' leases (leases.py) ------------------------------------------------------

    def join(
        self, host: str, pid: int, devices: int, platform: str, lease: float, kind: str = ""
    ) -> int:
        """This job joins the run under a lease of `lease` seconds; its job id."""
        return self.leases.join(host, pid, devices, platform, lease, kind)

    def heartbeat(self, job_id: int) -> bool:
        """Renew the job's lease; False when it was lost (its claims went back)."""
        return self.leases.heartbeat(job_id)

    def leave(self, job_id: int) -> int:
        """The job is done: what it claimed and did not report goes back; how many did."""
        return self.leases.leave(job_id)

    def reap(self) -> int:
        """Claims of jobs whose lease ran out go back to the queue; how many did."""
        return self.leases.reap()

    # ---- claiming and reporting (claims.py) ------------------------------------------------

    @property
    def share(self) -> float:
        """The work a job may hold, as its last claim left it."""
        return self.claims.share

    def claim(
        self,
        job_id: int,
        devices: int,
        seconds: float,
        skip: Sequence[str] = (),
        most: int = 500,
        guide: bool = False,
    ) -> list[Claim]:
        """Claim the longest queued tests this job's devices can hold, about `seconds` of work."""
        return self.claims.claim(job_id, devices, seconds, skip, most, guide)

    def move(
        self, job_id: int, claim: Claim, attempt: int, spent: tuple[int, int, int], ended: Any
    ) -> bool:
        """Put a failed test's rerun back on the queue for another job, other hosts first."""
        return self.claims.move(job_id, claim, attempt, spent, ended)

    def report(
        self,
        job_id: int,
        claim: Claim,
        outcome: str,
        gating: bool,
        result: Mapping[str, Any] | None = None,
    ) -> bool:
        """Record a test's one final outcome; False (refused) when its claim was lost."""
        return self.claims.report(job_id, claim, outcome, gating, result)

    def report_many(
        self, job_id: int, endings: Sequence[tuple[Claim, str, bool, Mapping[str, Any]]]
    ) -> list[str]:
        """report() for many tests in one round trip; the ids of those refused."""
        return self.claims.report_many(job_id, endings)

    def open_for(
        self, devices: int, skip: Sequence[str] = (), platform: tuple[str, str] = ("", "")
    ) -> int:
        """Tests not ended yet that a job of `devices` devices of `platform` could hold."""
        return self.claims.open_for(devices, skip, platform)

    # ---- the run as a whole ----------------------------------------------------------------

    def settle(self) -> list[str]:
        """End `unsatisfiable` the queued tests no live job can hold, naming what they need and
        what joined; the ids of the tests ended. Claimed tests are left to their jobs, and
        tests of a class no live job has to the verdict (classes.gaps: not taken)."""
        self.reap()
        jobs = self.jobs()
        largest = max((job.devices for job in jobs if job.alive), default=-1)
        joined = ", ".join(job.describe() for job in jobs) or "no job"
        with self.db.transaction():
            rows = self.db.execute(
                "SELECT position, test_id, request, platforms FROM devpool_queue_tests t "
                "WHERE run_id = %(run)s AND state = 'queued' AND (devices > %(largest)s OR "
                f"NOT {a_live_job('o.devices >= t.devices')}) AND (platforms = '' OR "
                f"{a_live_job()}) FOR UPDATE SKIP LOCKED",
                self._args(largest=largest),
            ).fetchall()
            for position, _test, request, platforms in rows:
                of = f"{' or '.join(platforms.split(','))} " if platforms else ""
                detail = (
                    f"unsatisfiable: it needs {request} and no live {of}job of the run can hold "
                    f"it (joined: {joined})"
                )
                self.db.execute(
                    "UPDATE devpool_queue_tests SET state = 'done', outcome = 'infra', "
                    "gating = true, result = %(result)s, ended_at = now() "
                    "WHERE run_id = %(run)s AND position = %(position)s",
                    self._args(
                        position=position,
                        result=json.dumps({"detail": detail, "unsatisfiable": True}),
                    ),
                )
        return [str(row[1]) for row in rows]

    def of_run(self, run_id: str) -> QueueStore:
        """A store of another run on this one's connection (closing either closes both), for
        reading it: its claims start afresh (no share yet), as the host page never claims."""
        import copy

        other = copy.copy(self)
        other.run_id = run_id
        other._take_parts()  # parts of its own, for the other run
        return other
