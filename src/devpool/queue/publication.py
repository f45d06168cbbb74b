"""The run's tests as the queue holds them: the first job of a run publishes them, and every
later job checks its own collection against them."""

from __future__ import annotations

from collections.abc import Sequence

from devpool.errors import DevpoolError
from devpool.queue.classes import covered
from devpool.queue.compare import QueuedTest, difference, fingerprint
from devpool.queue.rows import QueueReads


class Publication:
    """One run's published tests and the classes it covers (a part of store.py's
    QueueStore)."""

    def __init__(self, run: QueueReads) -> None:
        self.run = run

    def publish(self, tests: Sequence[QueuedTest], by: str, classes: Sequence[str] = ()) -> bool:
        """Publish the run's tests (True), or check ours against those published (False).
        classes: those the run covers (all when empty, else the others' tests are deselected).

        DevpoolError naming what differs when this job collected other tests."""
        mark = fingerprint(tests)
        declared = ",".join(classes)
        run_id, db = self.run.run_id, self.run.db
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(hashtext(%(run)s))", self.run._args())
            row = db.execute(
                "SELECT fingerprint, published_by, classes FROM devpool_queue_runs "
                "WHERE run_id = %(run)s",
                self.run._args(),
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO devpool_queue_runs (run_id, fingerprint, tests, published_by, "
                    "classes) VALUES (%(run)s, %(mark)s, %(n)s, %(by)s, %(classes)s)",
                    self.run._args(mark=mark, n=len(tests), by=by, classes=declared),
                )
                columns = "run_id, position, test_id, devices, request, estimate, chain, platforms"
                copying = f"COPY devpool_queue_tests ({columns}, state) FROM STDIN"
                # COPY: 12,000 tests in tens of ms, where one INSERT each took over a second
                with db.cursor() as cursor, cursor.copy(copying) as copy:
                    for i, t in enumerate(tests):
                        row = (run_id, i, t.test_id, t.devices, t.request, t.estimate)
                        state = "queued" if covered(t.platforms, classes) else "deselected"
                        copy.write_row((*row, t.chain, t.platforms, state))
                return True
            if row[2] != declared:
                raise DevpoolError(
                    f"this job covers the classes {declared or 'all'} (--devpool-queue-classes) "
                    f"where queue run {run_id!r} as {row[1]} published it covers "
                    f"{row[2] or 'all'}: every job of a run must declare the same"
                )
            if row[0] != mark:
                published = db.execute(
                    "SELECT test_id, devices FROM devpool_queue_tests WHERE run_id = %(run)s "
                    "ORDER BY position",
                    self.run._args(),
                ).fetchall()
                raise DevpoolError(difference(published, tests, run_id, row[1]))
            return False

    def published(self) -> bool:
        row = self.run.db.execute(
            "SELECT 1 FROM devpool_queue_runs WHERE run_id = %(run)s", self.run._args()
        ).fetchone()
        return row is not None

    def classes(self) -> list[str] | None:
        """The classes the run declared it covers ([] all); None when it was never started."""
        row = self.run.db.execute(
            "SELECT classes FROM devpool_queue_runs WHERE run_id = %(run)s", self.run._args()
        ).fetchone()
        return None if row is None else [c for c in str(row[0]).split(",") if c]

    def fill_chains(self, tests: Sequence[QueuedTest]) -> None:
        """The chains of a class's tests, which a job of another class that published the run
        could not see (its platform deselected them): set before any of them is claimed."""
        tied = [t for t in tests if t.platforms and t.chain]
        if tied:
            self.run.db.execute(
                "UPDATE devpool_queue_tests t SET chain = v.chain "
                "FROM unnest(%(tests)s::text[], %(chains)s::text[]) AS v(test_id, chain) "
                "WHERE t.run_id = %(run)s AND t.test_id = v.test_id AND t.chain = '' "
                "AND t.state = 'queued'",
                self.run._args(tests=[t.test_id for t in tied], chains=[t.chain for t in tied]),
            )
