"""Claims on the queue: which queued test a job may take, and the fencing token its report
must carry.

Every claim carries a fencing token from one sequence; a report (or a move, or a give-back)
is taken only under the token its claim was given, so a job whose lease ran out (its claims
went back to the queue, perhaps to another job) cannot count a test a second time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devpool.queue.classes import FITS
from devpool.queue.leases import JobLeases
from devpool.queue.rows import LIVE, QueueReads, a_live_job

TAIL = 2.0  # a claim takes at most 1/(TAIL x live jobs) of the queued work it could hold


def guided(seconds: float, queued: float, live: int) -> float:
    """A claim's work: what the job asks, but no more than its part of what is left, so
    that batches shrink as the run drains and the jobs end together (guided self-
    scheduling); at least one test is claimed all the same."""
    return min(seconds, queued / (TAIL * max(1, live)))


# A job `o` (rows.a_live_job) with the devices test t needs; _OTHER_HOST and _ANOTHER_JOB
# add "other than the one a rerun moved off, or on another host".
_HOLDS = "o.devices >= t.devices"
# A moved rerun goes to a job on another host first, then to another job on its host, and
# back to the job it failed on only when no other can hold it, or when a lease has passed
# since the move and none took it (the others may never claim it: memory, shape, a stall).
_OTHER_HOST = a_live_job(_HOLDS, "o.host <> t.avoid_host")
_ANOTHER_JOB = a_live_job(_HOLDS, "o.job_id <> t.avoid_job")
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
_ONLY_MINE = f"(NOT {a_live_job('o.platform <> %(name)s')})"


@dataclass(frozen=True)
class Claim:
    """A test this job may run, and the fencing token its report must carry. A rerun moved
    here from another job carries its next attempt's number, the reruns spent (failed, infra,
    the test's own failures) and the earlier attempts (junit.EarlierAttempt's fields and the
    host)."""

    test_id: str
    token: int
    estimate: float
    attempt: int = 1
    spent: tuple[int, int, int] = (0, 0, 0)
    earlier: tuple[Mapping[str, Any], ...] = ()


class Claims:
    """The claims of one run's jobs, each under its fencing token (a part of store.py's
    QueueStore): claiming, moving a rerun, reporting, giving back."""

    def __init__(self, run: QueueReads, leases: JobLeases) -> None:
        self.run = run
        self.leases = leases
        self.share = float("inf")  # the work a job may hold, as its last claim left it

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
        self.leases.reap()
        db = self.run.db
        with db.transaction():
            alive = db.execute(
                "SELECT platform, kind FROM devpool_queue_jobs WHERE job_id = %(job)s "
                "AND NOT lost AND left_at IS NULL FOR SHARE",
                {"job": job_id},
            ).fetchone()
            if alive is None:
                return []
            args = self.run._args(job=job_id, devices=devices, most=most, skip=list(skip))
            args.update(name=alive[0], kind=alive[1])
            if guide:  # the queued work it could hold, and the live jobs of its class
                queued, live = db.execute(
                    "SELECT (SELECT coalesce(sum(estimate * greatest(devices, 1)), 0) "
                    "FROM devpool_queue_tests t WHERE run_id = %(run)s AND state = 'queued' "
                    f"AND devices <= %(devices)s AND {_MINE}), (SELECT count(*) FROM "
                    f"devpool_queue_jobs j WHERE j.run_id = %(run)s AND {LIVE.format(j='j')} "
                    "AND j.platform = %(name)s)",
                    args,
                ).fetchone() or (0.0, 1)
                seconds = guided(seconds, float(queued), int(live))
            rows = db.execute(
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
                for row in db.execute(
                    "SELECT position FROM devpool_queue_tests WHERE run_id = %(run)s "
                    "AND state = 'queued' AND chain <> '' AND chain <> test_id AND chain IN "
                    "(SELECT test_id FROM devpool_queue_tests WHERE run_id = %(run)s "
                    "AND position = ANY(%(chosen)s)) ORDER BY position FOR UPDATE",
                    self.run._args(chosen=chosen),
                )
            ]
            claimed = db.execute(
                "UPDATE devpool_queue_tests SET state = 'claimed', job_id = %(job)s, "
                "token = nextval('devpool_queue_token'), claims = claims + 1 "
                "WHERE run_id = %(run)s AND position = ANY(%(chosen)s) "
                "RETURNING test_id, token, estimate, position, attempt, spent, earlier",
                self.run._args(job=job_id, chosen=chosen),
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
        row = self.run.db.execute(
            "UPDATE devpool_queue_tests t SET state = 'queued', job_id = NULL, token = NULL, "
            "attempt = %(attempt)s, spent = %(spent)s, avoid_job = %(job)s, "
            "avoid_host = (SELECT host FROM devpool_queue_jobs WHERE job_id = %(job)s), "
            "earlier = %(ended)s::jsonb, moved_at = now() "
            "WHERE run_id = %(run)s AND test_id = %(test)s AND state = 'claimed' "
            "AND job_id = %(job)s AND token = %(token)s "
            f"AND {a_live_job(_HOLDS, 'o.job_id <> %(job)s')} RETURNING 1",
            self.run._args(
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
        rows = self.run.db.execute(
            "UPDATE devpool_queue_tests t SET state = 'done', outcome = v.outcome, "
            "gating = v.gating, result = v.result::jsonb, ended_at = now() "
            "FROM unnest(%(tests)s::text[], %(tokens)s::bigint[], %(outcomes)s::text[], "
            "%(gatings)s::boolean[], %(results)s::text[]) "
            "AS v(test_id, token, outcome, gating, result) "
            "WHERE t.run_id = %(run)s AND t.test_id = v.test_id AND t.state = 'claimed' "
            "AND t.job_id = %(job)s AND t.token = v.token RETURNING t.test_id",
            self.run._args(
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

    def open_for(
        self, devices: int, skip: Sequence[str] = (), platform: tuple[str, str] = ("", "")
    ) -> int:
        """Tests not ended yet that a job of `devices` devices could hold (queued or claimed:
        a claim of a job that dies comes back), of its platform's (name, kind) classes, none
        of `skip`."""
        name, kind = platform
        row = self.run.db.execute(
            "SELECT count(*) FROM devpool_queue_tests t WHERE run_id = %(run)s "
            "AND state IN ('queued', 'claimed') AND devices <= %(devices)s "
            f"AND NOT (test_id = ANY(%(skip)s)) AND {_MINE}",
            self.run._args(devices=devices, skip=list(skip), name=name, kind=kind),
        ).fetchone()
        return int(row[0]) if row else 0
