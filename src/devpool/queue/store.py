"""The queue in PostgreSQL: a run's tests, the jobs that joined it, their claims and outcomes.

Every claim carries a fencing token from one sequence; a report is taken only under the
token its claim was given, so a job whose lease ran out (its claims went back to the queue,
perhaps to another job) cannot count a test a second time. Times are the database's own
(now()), so the hosts' clocks need not agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devpool.database import connect, where
from devpool.errors import DevpoolError
from devpool.wording import counted

SCHEMA = """
CREATE TABLE IF NOT EXISTS devpool_queue_runs (
    run_id text PRIMARY KEY,
    fingerprint text NOT NULL,
    tests integer NOT NULL,
    published_by text NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS devpool_queue_jobs (
    job_id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    devices integer NOT NULL,
    platform text NOT NULL,
    lease_seconds double precision NOT NULL,
    joined_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    left_at timestamptz,
    lost boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS devpool_queue_tests (
    run_id text NOT NULL,
    position integer NOT NULL,
    test_id text NOT NULL,
    devices integer NOT NULL,
    request text NOT NULL,
    estimate double precision NOT NULL,
    state text NOT NULL DEFAULT 'queued',
    job_id bigint,
    token bigint,
    claims integer NOT NULL DEFAULT 0,
    outcome text,
    gating boolean,
    result jsonb,
    ended_at timestamptz,
    PRIMARY KEY (run_id, position),
    UNIQUE (run_id, test_id)
);
-- A rerun moved off the job (and host) its attempt failed on: which attempt is next, the
-- reruns spent, and the earlier attempts as the final report folds them in.
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 1;
ALTER TABLE devpool_queue_tests
    ADD COLUMN IF NOT EXISTS spent integer[] NOT NULL DEFAULT '{0,0,0}';
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS avoid_job bigint;
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS avoid_host text;
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS earlier jsonb NOT NULL DEFAULT '[]';
-- Tests tied by pytest-order or pytest-dependency: the first test's id, claimed with it.
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS chain text NOT NULL DEFAULT '';
ALTER TABLE devpool_queue_tests ADD COLUMN IF NOT EXISTS moved_at timestamptz;
CREATE INDEX IF NOT EXISTS devpool_queue_tests_state ON devpool_queue_tests (run_id, state);
CREATE SEQUENCE IF NOT EXISTS devpool_queue_token;
"""
SCHEMA_LOCK = 0x646576706F6F6C  # pg_advisory_xact_lock key: two jobs creating tables at once
NEWEST_COLUMN = "moved_at"  # a database without it was made by an older devpool: SCHEMA again
SHOWN = 3  # node ids named in a sentence about a differing collection
TAIL = 2.0  # a claim takes at most 1/(TAIL x live jobs) of the queued work it could hold


def guided(seconds: float, queued: float, live: int) -> float:
    """A claim's work: what the job asks, but no more than its part of what is left, so
    that batches shrink as the run drains and the jobs end together (guided self-
    scheduling); at least one test is claimed all the same."""
    return min(seconds, queued / (TAIL * max(1, live)))


_LIVE = "NOT {j}.lost AND {j}.left_at IS NULL AND {j}.expires_at >= now()"
# A live job of the run, other than the one a rerun moved off (or on another host), that
# can hold test t.
_OTHER_JOB = (
    "EXISTS (SELECT 1 FROM devpool_queue_jobs o WHERE o.run_id = t.run_id AND "
    + _LIVE.format(j="o")
    + " AND o.devices >= t.devices AND {other})"
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
class QueuedTest:
    """One test as the run publishes it: its id, what it needs, and how long it should take."""

    test_id: str
    devices: int
    request: str  # the request in words, for sentences ("2 devices", "cpu")
    estimate: float
    chain: str = ""  # the first test of its pytest-order/-dependency chain (plan/chains.py)


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


def fingerprint(tests: Sequence[QueuedTest]) -> str:
    """What every job of a run must have collected alike: ids, device counts and chains, in
    any order (pytest-randomly shuffles each job's own way; the first job's order is the
    run's)."""
    text = "\n".join(sorted(f"{t.test_id}\t{t.devices}\t{t.chain}" for t in tests))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def difference(
    published: Sequence[tuple[str, int]], mine: Sequence[QueuedTest], run_id: str, by: str
) -> str:
    """The sentence refusing a job whose collection differs from the published one."""
    theirs = dict(published)
    ours = {t.test_id: t.devices for t in mine}
    lacking = [t for t in theirs if t not in ours]
    extra = [t for t in ours if t not in theirs]
    needs = [
        f"{t} ({ours[t]} here, {theirs[t]} there)"
        for t in ours
        if theirs.get(t, ours[t]) != ours[t]
    ]
    parts = []
    for what, ids in (
        ("lacks {}", lacking),
        ("has {} the run does not", extra),
        ("needs other devices for {}", needs),
    ):
        if ids:
            named = ", ".join(ids[:SHOWN]) + (", …" if len(ids) > SHOWN else "")
            parts.append(what.format(counted(len(ids), "test")) + f" ({named})")
    if not parts:
        parts.append("ties its tests into other pytest-order or pytest-dependency chains")
    return (
        f"this job's collection differs from queue run {run_id!r} as {by} published it: it "
        + "; ".join(parts)
        + " (every job of a run must run the same commit with the same options)"
    )


class QueueStore:
    """One connection to the queue's database, for one run."""

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
        ready = self.db.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = 'devpool_queue_tests' AND column_name = %s",
            (NEWEST_COLUMN,),
        ).fetchone()
        if ready is None:  # the first job ever on this database, or an older devpool's
            with self.db.transaction():
                self.db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                self.db.execute(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def _args(self, **more: Any) -> dict[str, Any]:
        return {"run": self.run_id, **more}

    # ---- publishing and joining ------------------------------------------------------------

    def publish(self, tests: Sequence[QueuedTest], by: str) -> bool:
        """Publish the run's tests (True), or check ours against those published (False).

        DevpoolError naming what differs when this job collected other tests."""
        mark = fingerprint(tests)
        with self.db.transaction():
            self.db.execute("SELECT pg_advisory_xact_lock(hashtext(%(run)s))", self._args())
            row = self.db.execute(
                "SELECT fingerprint, published_by FROM devpool_queue_runs WHERE run_id = %(run)s",
                self._args(),
            ).fetchone()
            if row is None:
                self.db.execute(
                    "INSERT INTO devpool_queue_runs (run_id, fingerprint, tests, published_by) "
                    "VALUES (%(run)s, %(mark)s, %(n)s, %(by)s)",
                    self._args(mark=mark, n=len(tests), by=by),
                )
                columns = "run_id, position, test_id, devices, request, estimate, chain"
                copying = f"COPY devpool_queue_tests ({columns}) FROM STDIN"
                # COPY: 12,000 tests in tens of ms, where one INSERT each took over a second
                with self.db.cursor() as cursor, cursor.copy(copying) as copy:
                    for i, t in enumerate(tests):
                        row = (self.run_id, i, t.test_id, t.devices, t.request, t.estimate)
                        copy.write_row((*row, t.chain))
                return True
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

    def join(self, host: str, pid: int, devices: int, platform: str, lease: float) -> int:
        """This job joins the run under a lease of `lease` seconds; its job id."""
        row = self.db.execute(
            "INSERT INTO devpool_queue_jobs "
            "(run_id, host, pid, devices, platform, lease_seconds, expires_at) "
            "VALUES (%(run)s, %(host)s, %(pid)s, %(devices)s, %(platform)s, %(lease)s, "
            "now() + make_interval(secs => %(lease)s)) RETURNING job_id",
            self._args(host=host, pid=pid, devices=devices, platform=platform, lease=lease),
        ).fetchone()
        assert row is not None
        return int(row[0])

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
                "SELECT 1 FROM devpool_queue_jobs WHERE job_id = %(job)s AND NOT lost "
                "AND left_at IS NULL FOR SHARE",
                {"job": job_id},
            ).fetchone()
            if alive is None:
                return []
            if guide:  # the queued work it could hold, and the live jobs to share it
                queued, live = self.db.execute(
                    "SELECT (SELECT coalesce(sum(estimate * greatest(devices, 1)), 0) "
                    "FROM devpool_queue_tests WHERE run_id = %(run)s AND state = 'queued' "
                    "AND devices <= %(devices)s), (SELECT count(*) FROM devpool_queue_jobs j "
                    f"WHERE j.run_id = %(run)s AND {_LIVE.format(j='j')})",
                    self._args(devices=devices),
                ).fetchone() or (0.0, 1)
                seconds = guided(seconds, float(queued), int(live))
            rows = self.db.execute(
                "SELECT position, estimate * greatest(devices, 1) FROM devpool_queue_tests t "
                "WHERE run_id = %(run)s AND state = 'queued' AND devices <= %(devices)s "
                f"AND NOT (test_id = ANY(%(skip)s)) AND {_MAY_TAKE} AND {_CHAIN_FREE} "
                "ORDER BY estimate * greatest(devices, 1) DESC, position "
                "LIMIT %(most)s FOR UPDATE SKIP LOCKED",
                self._args(job=job_id, devices=devices, most=most, skip=list(skip)),
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

    def open_for(self, devices: int, skip: Sequence[str] = ()) -> int:
        """Tests not ended yet that a job of `devices` devices could hold (queued or claimed:
        a claim of a job that dies comes back), none of `skip`."""
        row = self.db.execute(
            "SELECT count(*) FROM devpool_queue_tests WHERE run_id = %(run)s "
            "AND state <> 'done' AND devices <= %(devices)s AND NOT (test_id = ANY(%(skip)s))",
            self._args(devices=devices, skip=list(skip)),
        ).fetchone()
        return int(row[0]) if row else 0

    # ---- the run as a whole ----------------------------------------------------------------

    def jobs(self) -> list[JobRow]:
        rows = self.db.execute(
            "SELECT j.job_id, j.host, j.pid, j.devices, j.platform, "
            "(NOT j.lost AND j.left_at IS NULL AND j.expires_at >= now()), j.lost, "
            "count(t.*) FILTER (WHERE t.state = 'claimed'), "
            "count(t.*) FILTER (WHERE t.state = 'done') "
            "FROM devpool_queue_jobs j LEFT JOIN devpool_queue_tests t "
            "ON t.run_id = j.run_id AND t.job_id = j.job_id "
            "WHERE j.run_id = %(run)s GROUP BY j.job_id ORDER BY j.job_id",
            self._args(),
        ).fetchall()
        return [JobRow(int(r[0]), r[1], int(r[2]), int(r[3]), r[4], *r[5:7], *r[7:9]) for r in rows]

    def remaining(self) -> int:
        """Tests of the run without their final outcome yet."""
        row = self.db.execute(
            "SELECT count(*) FROM devpool_queue_tests WHERE run_id = %(run)s AND state <> 'done'",
            self._args(),
        ).fetchone()
        return int(row[0]) if row else 0

    def tests(self) -> list[TestRow]:
        """Every test of the run, in collection order."""
        rows = self.db.execute(
            "SELECT position, test_id, devices, request, state, outcome, "
            "coalesce(gating, false), result, job_id FROM devpool_queue_tests "
            "WHERE run_id = %(run)s ORDER BY position",
            self._args(),
        ).fetchall()
        return [TestRow(*row) for row in rows]

    def settle(self) -> list[str]:
        """End `unsatisfiable` the queued tests no live job can hold, naming what they need and
        what joined; the ids of the tests ended. Claimed tests are left to their jobs."""
        self.reap()
        jobs = self.jobs()
        largest = max((job.devices for job in jobs if job.alive), default=-1)
        joined = ", ".join(job.describe() for job in jobs) or "no job"
        with self.db.transaction():
            rows = self.db.execute(
                "SELECT position, test_id, request FROM devpool_queue_tests "
                "WHERE run_id = %(run)s AND state = 'queued' AND devices > %(largest)s "
                "FOR UPDATE SKIP LOCKED",
                self._args(largest=largest),
            ).fetchall()
            for position, _test, request in rows:
                detail = (
                    f"unsatisfiable: it needs {request} and no live job of the run can hold it "
                    f"(joined: {joined})"
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

    def of_run(self, run_id: str) -> QueueStore:
        """A store of another run on this one's connection (closing either closes both)."""
        import copy

        other = copy.copy(self)
        other.run_id = run_id
        return other
