"""The leases of a run's jobs: a job joins the run under one, its heartbeat renews it, and
when it runs out the job is lost and its claims go back to the queue untouched.

Times are the database's own (now()), so the hosts' clocks need not agree.
"""

from __future__ import annotations

from devpool.queue.classes import kind_conflict
from devpool.queue.rows import QueueReads

# Jobs whose lease ran out lose their claims, which go back to the queue untouched.
_REAP = """
WITH dead AS (
    UPDATE devpool_queue_jobs SET lost = true
    WHERE run_id = %(run)s AND NOT lost AND left_at IS NULL AND expires_at < now()
    RETURNING job_id
)
UPDATE devpool_queue_tests SET state = 'queued', job_id = NULL, token = NULL
WHERE run_id = %(run)s AND state = 'claimed' AND job_id IN (SELECT job_id FROM dead)
"""


class JobLeases:
    """The jobs of one run under their leases (a part of store.py's QueueStore)."""

    def __init__(self, run: QueueReads) -> None:
        self.run = run

    def join(
        self, host: str, pid: int, devices: int, platform: str, lease: float, kind: str = ""
    ) -> int:
        """This job joins the run under a lease of `lease` seconds; its job id. DevpoolError
        when another job of the run runs the same platform name as another kind."""
        args = self.run._args(
            host=host, pid=pid, devices=devices, platform=platform, lease=lease, kind=kind
        )
        db = self.run.db
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(hashtext(%(run)s))", args)
            kind_conflict(self.run.jobs(), platform, kind, f"{host}, pid {pid}")
            row = db.execute(
                "INSERT INTO devpool_queue_jobs "
                "(run_id, host, pid, devices, platform, kind, lease_seconds, expires_at) "
                "VALUES (%(run)s, %(host)s, %(pid)s, %(devices)s, %(platform)s, %(kind)s, "
                "%(lease)s, now() + make_interval(secs => %(lease)s)) RETURNING job_id",
                args,
            ).fetchone()
        assert row is not None
        return int(row[0])

    def heartbeat(self, job_id: int) -> bool:
        """Renew the job's lease; False when it was lost (its claims went back)."""
        row = self.run.db.execute(
            "UPDATE devpool_queue_jobs "
            "SET expires_at = now() + make_interval(secs => lease_seconds) "
            "WHERE job_id = %(job)s AND NOT lost AND left_at IS NULL RETURNING 1",
            {"job": job_id},
        ).fetchone()
        return row is not None

    def leave(self, job_id: int) -> int:
        """The job is done: what it claimed and did not report goes back; how many did."""
        db = self.run.db
        with db.transaction():
            back = db.execute(
                "UPDATE devpool_queue_tests SET state = 'queued', job_id = NULL, token = NULL "
                "WHERE run_id = %(run)s AND state = 'claimed' AND job_id = %(job)s",
                self.run._args(job=job_id),
            ).rowcount
            db.execute(
                "UPDATE devpool_queue_jobs SET left_at = now() WHERE job_id = %(job)s",
                {"job": job_id},
            )
        return back

    def reap(self) -> int:
        """Claims of jobs whose lease ran out go back to the queue; how many did."""
        return self.run.db.execute(_REAP, self.run._args()).rowcount
