"""The queue in PostgreSQL: a run's tests, the jobs that joined it, their claims and outcomes.

Every claim carries a fencing token from one sequence; a report is taken only under the
token its claim was given, so a job whose lease ran out (its claims went back to the queue,
perhaps to another job) cannot count a test a second time. Times are the database's own
(now()), so the hosts' clocks need not agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devpool.database import connect, where
from devpool.errors import DevpoolError
from devpool.queue.classes import FITS, covered, kind_conflict
from devpool.queue.compare import QueuedTest as QueuedTest
from devpool.queue.compare import difference, fingerprint
from devpool.queue.rows import LIVE, QueueReads
from devpool.queue.schema import NEWEST_COLUMN, SCHEMA, SCHEMA_LOCK

TAIL = 2.0  # a claim takes at most 1/(TAIL x live jobs) of the queued work it could hold


def guided(seconds: float, queued: float, live: int) -> float:
    """A claim's work: what the job asks, but no more than its part of what is left, so
    that batches shrink as the run drains and the jobs end together (guided self-
    scheduling); at least one test is claimed all the same."""
    return min(seconds, queued / (TAIL * max(1, live)))


# A live job of the run, other than the one a rerun moved off (or on another host), that
# can hold test t.
_OTHER_JOB = (
    "EXISTS (SELECT 1 FROM devpool_queue_jobs o WHERE o.run_id = t.run_id AND "
    + LIVE.format(j="o")
    + " AND o.devices >= t.devices AND "
    + FITS.format(j="o")
    + " AND {other})"
)
# A moved rerun goes to a job on another host first, then to another job on its host, and
# back to the job it failed on only when no other can hold it, or when a lease has passed
# since the move and none took it (the others may never claim it: memory, shape, a stall).
_OTHER_HOST = _OTHER_JOB.format(other="o.host <> t.avoid_host")
_ANOTHER_JOB = _OTHER_JOB.format(other="o.job_id <> t.avoid_job")
_MAY_TAKE = f"""(t.avoid_job IS NULL
    OR t.avoid_host <> (SELECT host FROM devpool_queue_jobs WHERE job_id = %(job)s)
    OR t.moved_at < now() - (SELECT make_interval(secs => lease_seconds)
        FROM devpool_queue_jobs WHERE job_id = %(job)s)
    OR (NOT {_OTHER_HOST} AND (t.avoid_job <> %(job)s OR NOT {_ANOTHER_JOB})))"""
# A chain's later tests come with its first (one job runs the chain, in order); alone only
# once its first is no longer queued (it ended, and these came back from a lost lease).
_CHAIN_FREE = """(t.chain IN ('', t.test_id) OR NOT EXISTS (SELECT 1 FROM devpool_queue_tests h
    WHERE h.run_id = t.run_id AND h.test_id = t.chain AND h.state = 'queued'))"""

# A test of a class the claiming job's platform (%(name)s, %(kind)s) is or runs as.
_MINE = FITS.format(j="x").replace("x.platform", "%(name)s").replace("x.kind", "%(kind)s")
# No live job of another platform may take test t: a job claims those first, since only its
# class can run them, then the tests any class may run (each longest first); in a run of one
# platform every test is so, and the order is longest first.
_ONLY_MINE = (
    "(NOT EXISTS (SELECT 1 FROM devpool_queue_jobs o WHERE o.run_id = t.run_id AND "
    + LIVE.format(j="o")
    + " AND o.platform <> %(name)s AND "
    + FITS.format(j="o")
    + "))"
)
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


@dataclass(frozen=True)
class Claim:
    """A test this job may run, and the fencing token its report must carry. A rerun moved
    here from another job carries its next attempt's number, the reruns spent (failed, infra,
    the test's own failures) and the earlier attempts (junit.Attempt's fields and the host)."""

    test_id: str
    token: int
    estimate: float
    attempt: int = 1
    spent: tuple[int, int, int] = (0, 0, 0)
    earlier: tuple[Mapping[str, Any], ...] = ()


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
        self.share = float("inf")  # the work a job may hold, as its last claim left it
        self.db = connect(url, option)
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

    def publish(self, tests: Sequence[QueuedTest], by: str, classes: Sequence[str] = ()) -> bool:
        """Publish the run's tests (True), or check ours against those published (False).
        classes: those the run covers (all when empty, else the others' tests are deselected).

        DevpoolError naming what differs when this job collected other tests."""
        mark = fingerprint(tests)
        declared = ",".join(classes)
        with self.db.transaction():
            self.db.execute("SELECT pg_advisory_xact_lock(hashtext(%(run)s))", self._args())
            row = self.db.execute(
                "SELECT fingerprint, published_by, classes FROM devpool_queue_runs "
                "WHERE run_id = %(run)s",
                self._args(),
            ).fetchone()
            if row is None:
                self.db.execute(
                    "INSERT INTO devpool_queue_runs (run_id, fingerprint, tests, published_by, "
                    "classes) VALUES (%(run)s, %(mark)s, %(n)s, %(by)s, %(classes)s)",
                    self._args(mark=mark, n=len(tests), by=by, classes=declared),
                )
                columns = "run_id, position, test_id, devices, request, estimate, chain, platforms"
                copying = f"COPY devpool_queue_tests ({columns}, state) FROM STDIN"
                # COPY: 12,000 tests in tens of ms, where one INSERT each took over a second
                with self.db.cursor() as cursor, cursor.copy(copying) as copy:
                    for i, t in enumerate(tests):
                        row = (self.run_id, i, t.test_id, t.devices, t.request, t.estimate)
                        state = "queued" if covered(t.platforms, classes) else "deselected"
                        copy.write_row((*row, t.chain, t.platforms, state))
                return True
            if row[2] != declared:
                raise DevpoolError(
                    f"this job covers the classes {declared or 'all'} (--devpool-queue-classes) "
                    f"where queue run {self.run_id!r} as {row[1]} published it covers "
                    f"{row[2] or 'all'}: every job of a run must declare the same"
                )
            if row[0] != mark:
                published = self.db.execute(
                    "SELECT test_id, devices FROM devpool_queue_tests WHERE run_id = %(run)s "
                    "ORDER BY position",
                    self._args(),
                ).fetchall()
                raise DevpoolError(difference(published, tests, self.run_id, row[1]))
            return False

    def published(self) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM devpool_queue_runs WHERE run_id = %(run)s", self._args()
        ).fetchone()
        return row is not None

    def classes(self) -> list[str] | None:
        """The classes the run declared it covers ([] all); None when it was never started."""
        row = self.db.execute(
            "SELECT classes FROM devpool_queue_runs WHERE run_id = %(run)s", self._args()
        ).fetchone()
        return None if row is None else [c for c in str(row[0]).split(",") if c]

    def join(
        self, host: str, pid: int, devices: int, platform: str, lease: float, kind: str = ""
    ) -> int:
        """This job joins the run under a lease of `lease` seconds; its job id. DevpoolError
        when another job of the run runs the same platform name as another kind."""
        args = self._args(
            host=host, pid=pid, devices=devices, platform=platform, lease=lease, kind=kind
        )
        with self.db.transaction():
            self.db.execute("SELECT pg_advisory_xact_lock(hashtext(%(run)s))", args)
            kind_conflict(self.jobs(), platform, kind, f"{host}, pid {pid}")
            row = self.db.execute(
                "INSERT INTO devpool_queue_jobs "
                "(run_id, host, pid, devices, platform, kind, lease_seconds, expires_at) "
                "VALUES (%(run)s, %(host)s, %(pid)s, %(devices)s, %(platform)s, %(kind)s, "
                "%(lease)s, now() + make_interval(secs => %(lease)s)) RETURNING job_id",
                args,
            ).fetchone()
        assert row is not None
        return int(row[0])

    def fill_chains(self, tests: Sequence[QueuedTest]) -> None:
        """The chains of a class's tests, which a job of another class that published the run
        could not see (its platform deselected them): set before any of them is claimed."""
        tied = [t for t in tests if t.platforms and t.chain]
        if tied:
            self.db.execute(
                "UPDATE devpool_queue_tests t SET chain = v.chain "
                "FROM unnest(%(tests)s::text[], %(chains)s::text[]) AS v(test_id, chain) "
                "WHERE t.run_id = %(run)s AND t.test_id = v.test_id AND t.chain = '' "
                "AND t.state = 'queued'",
                self._args(tests=[t.test_id for t in tied], chains=[t.chain for t in tied]),
            )

    def heartbeat(self, job_id: int) -> bool:
        """Renew the job's lease; False when it was lost (its claims went back)."""
        row = self.db.execute(
            "UPDATE devpool_queue_jobs "
            "SET expires_at = now() + make_interval(secs => lease_seconds) "
            "WHERE job_id = %(job)s AND NOT lost AND left_at IS NULL RETURNING 1",
            {"job": job_id},
        ).fetchone()
        return row is not None

    def leave(self, job_id: int) -> int:
        """The job is done: what it claimed and did not report goes back; how many did."""
        with self.db.transaction():
            back = self.db.execute(
                "UPDATE devpool_queue_tests SET state = 'queued', job_id = NULL, token = NULL "
                "WHERE run_id = %(run)s AND state = 'claimed' AND job_id = %(job)s",
                self._args(job=job_id),
            ).rowcount
            self.db.execute(
                "UPDATE devpool_queue_jobs SET left_at = now() WHERE job_id = %(job)s",
                {"job": job_id},
            )
        return back

    # ---- claiming and reporting ------------------------------------------------------------

    def reap(self) -> int:
        """Claims of jobs whose lease ran out go back to the queue; how many did."""
        return self.db.execute(_REAP, self._args()).rowcount

    def claim(
        self,
        job_id: int,
        devices: int,
        seconds: float,
        skip: Sequence[str] = (),
        most: int = 500,
        guide: bool = False,
    ) -> list[Claim]:
        """Claim the longest queued tests this job's devices can hold (device-seconds first),
        until their work (estimate × devices) adds up to `seconds` (`guide`: no more than
        its part of what is left, see guided), at least one test; none of `skip`, and no
        rerun another job should take first (_MAY_TAKE). [] when none is queued or the
        job's lease was lost."""
        self.reap()
        with self.db.transaction():
            alive = self.db.execute(
                "SELECT platform, kind FROM devpool_queue_jobs WHERE job_id = %(job)s "
                "AND NOT lost AND left_at IS NULL FOR SHARE",
                {"job": job_id},
            ).fetchone()
            if alive is None:
                return []
            args = self._args(job=job_id, devices=devices, most=most, skip=list(skip))
            args.update(name=alive[0], kind=alive[1])
            if guide:  # the queued work it could hold, and the live jobs of its class
                queued, live = self.db.execute(
                    "SELECT (SELECT coalesce(sum(estimate * greatest(devices, 1)), 0) "
                    "FROM devpool_queue_tests t WHERE run_id = %(run)s AND state = 'queued' "
                    f"AND devices <= %(devices)s AND {_MINE}), (SELECT count(*) FROM "
                    f"devpool_queue_jobs j WHERE j.run_id = %(run)s AND {LIVE.format(j='j')} "
                    "AND j.platform = %(name)s)",
                    args,
                ).fetchone() or (0.0, 1)
                seconds = guided(seconds, float(queued), int(live))
            rows = self.db.execute(
                "SELECT position, estimate * greatest(devices, 1) FROM devpool_queue_tests t "
                "WHERE run_id = %(run)s AND state = 'queued' AND devices <= %(devices)s "
                f"AND NOT (test_id = ANY(%(skip)s)) AND {_MINE} AND {_MAY_TAKE} "
                f"AND {_CHAIN_FREE} ORDER BY {_ONLY_MINE} DESC, "
                "estimate * greatest(devices, 1) DESC, position "
                "LIMIT %(most)s FOR UPDATE SKIP LOCKED",
                args,
            ).fetchall()
            chosen: list[int] = []
            total = 0.0
            for position, cost in rows:
                if chosen and total >= seconds:
                    break
                chosen.append(int(position))
                total += float(cost)
            if guide:  # what is left, for this job's next claim to be measured against
                self.share = guided(float("inf"), float(queued) - total, int(live))
            if not chosen:
                return []
            chosen += [  # the rest of the chains whose first test was chosen, in their order
                int(row[0])
                for row in self.db.execute(
                    "SELECT position FROM devpool_queue_tests WHERE run_id = %(run)s "
                    "AND state = 'queued' AND chain <> '' AND chain <> test_id AND chain IN "
                    "(SELECT test_id FROM devpool_queue_tests WHERE run_id = %(run)s "
                    "AND position = ANY(%(chosen)s)) ORDER BY position FOR UPDATE",
                    self._args(chosen=chosen),
                )
            ]
            claimed = self.db.execute(
                "UPDATE devpool_queue_tests SET state = 'claimed', job_id = %(job)s, "
                "token = nextval('devpool_queue_token'), claims = claims + 1 "
                "WHERE run_id = %(run)s AND position = ANY(%(chosen)s) "
                "RETURNING test_id, token, estimate, position, attempt, spent, earlier",
                self._args(job=job_id, chosen=chosen),
            ).fetchall()
        rank = {position: i for i, position in enumerate(chosen)}
        claimed.sort(key=lambda row: rank[int(row[3])])
        return [
            Claim(str(t), int(token), float(e), int(n), (spent[0], spent[1], spent[2]), tuple(was))
            for t, token, e, _, n, spent, was in claimed
        ]

    def move(
        self, job_id: int, claim: Claim, attempt: int, spent: tuple[int, int, int], ended: Any
    ) -> bool:
        """Put a failed test's rerun back on the queue for another job, other hosts first: True
        when one that can hold it is alive and the claim was still this job's, else False
        (the rerun stays here). `ended`: the attempts so far, as the final report folds them."""
        row = self.db.execute(
            "UPDATE devpool_queue_tests t SET state = 'queued', job_id = NULL, token = NULL, "
            "attempt = %(attempt)s, spent = %(spent)s, avoid_job = %(job)s, "
            "avoid_host = (SELECT host FROM devpool_queue_jobs WHERE job_id = %(job)s), "
            "earlier = %(ended)s::jsonb, moved_at = now() "
            "WHERE run_id = %(run)s AND test_id = %(test)s AND state = 'claimed' "
            "AND job_id = %(job)s AND token = %(token)s "
            f"AND {_OTHER_JOB.format(other='o.job_id <> %(job)s')} RETURNING 1",
            self._args(
                job=job_id,
                test=claim.test_id,
                token=claim.token,
                attempt=attempt,
                spent=list(spent),
                ended=json.dumps(ended, default=str),
            ),
        ).fetchone()
        return row is not None

    def report(
        self,
        job_id: int,
        claim: Claim,
        outcome: str,
        gating: bool,
        result: Mapping[str, Any] | None = None,
    ) -> bool:
        """Record a test's one final outcome; False (refused) when its claim is no longer
        this job's: the lease was lost and the test went back to the queue."""
        return not self.report_many(job_id, [(claim, outcome, gating, result or {})])

    def report_many(
        self, job_id: int, endings: Sequence[tuple[Claim, str, bool, Mapping[str, Any]]]
    ) -> list[str]:
        """report() for many tests in one round trip; the ids of those refused."""
        if not endings:
            return []
        rows = self.db.execute(
            "UPDATE devpool_queue_tests t SET state = 'done', outcome = v.outcome, "
            "gating = v.gating, result = v.result::jsonb, ended_at = now() "
            "FROM unnest(%(tests)s::text[], %(tokens)s::bigint[], %(outcomes)s::text[], "
            "%(gatings)s::boolean[], %(results)s::text[]) "
            "AS v(test_id, token, outcome, gating, result) "
            "WHERE t.run_id = %(run)s AND t.test_id = v.test_id AND t.state = 'claimed' "
            "AND t.job_id = %(job)s AND t.token = v.token RETURNING t.test_id",
            self._args(
                job=job_id,
                tests=[c.test_id for c, *_ in endings],
                tokens=[c.token for c, *_ in endings],
                outcomes=[outcome for _, outcome, _, _ in endings],
                gatings=[gating for _, _, gating, _ in endings],
                results=[json.dumps(result, default=str) for *_, result in endings],
            ),
        ).fetchall()
        taken = {str(row[0]) for row in rows}
        return [c.test_id for c, *_ in endings if c.test_id not in taken]

    def give_back(self, job_id: int, claims: Iterable[Claim]) -> None:
        """Claims this job will not run (it stopped early) go back to the queue."""
        tokens = [c.token for c in claims]
        if tokens:
            self.db.execute(
                "UPDATE devpool_queue_tests SET state = 'queued', job_id = NULL, token = NULL "
                "WHERE run_id = %(run)s AND state = 'claimed' AND job_id = %(job)s "
                "AND token = ANY(%(tokens)s)",
                self._args(job=job_id, tokens=tokens),
            )

    def open_for(
        self, devices: int, skip: Sequence[str] = (), platform: tuple[str, str] = ("", "")
    ) -> int:
        """Tests not ended yet that a job of `devices` devices could hold (queued or claimed:
        a claim of a job that dies comes back), of its platform's (name, kind) classes, none
        of `skip`."""
        name, kind = platform
        row = self.db.execute(
            "SELECT count(*) FROM devpool_queue_tests t WHERE run_id = %(run)s "
            "AND state IN ('queued', 'claimed') AND devices <= %(devices)s "
            f"AND NOT (test_id = ANY(%(skip)s)) AND {_MINE}",
            self._args(devices=devices, skip=list(skip), name=name, kind=kind),
        ).fetchone()
        return int(row[0]) if row else 0

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
            live = f"o.run_id = t.run_id AND {LIVE.format(j='o')} AND {FITS.format(j='o')}"
            rows = self.db.execute(
                "SELECT position, test_id, request, platforms FROM devpool_queue_tests t "
                "WHERE run_id = %(run)s AND state = 'queued' AND (devices > %(largest)s OR "
                f"NOT EXISTS (SELECT 1 FROM devpool_queue_jobs o WHERE {live} "
                "AND o.devices >= t.devices)) AND (platforms = '' OR EXISTS "
                f"(SELECT 1 FROM devpool_queue_jobs o WHERE {live})) FOR UPDATE SKIP LOCKED",
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
        """A store of another run on this one's connection (closing either closes both)."""
        import copy

        other = copy.copy(self)
        other.run_id = run_id
        return other
