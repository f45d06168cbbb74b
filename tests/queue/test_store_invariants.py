"""The queue's invariants under random suites, jobs and faults (hypothesis, a real server).

Jobs of random device counts claim, report, leave, or lose their lease (their expiry set in
the past, as a heartbeat that stopped would leave it) in a random order, then the live ones
drain the queue and the rest is settled. Whatever happened: every test ends exactly once,
no job runs a test its devices cannot hold, and a job that never lost its lease is never
refused."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from devpool.queue.store import Claim, QueuedTest, QueueStore
from pg_server import Server

_runs = itertools.count()
SIZES = st.sampled_from([0, 1, 2, 4, 8])
OPS = st.sampled_from(["claim", "report", "expire", "leave"])


@dataclass
class Job:
    job_id: int
    devices: int
    held: list[Claim] = field(default_factory=list)
    expired: bool = False
    left: bool = False


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    suite=st.lists(
        st.tuples(SIZES, st.floats(0.01, 5.0, allow_nan=False)), min_size=1, max_size=10
    ),
    sizes=st.lists(SIZES, min_size=2, max_size=3),
    ops=st.lists(st.tuples(st.integers(0, 2), OPS, st.floats(0.0, 3.0)), max_size=40),
)
# a lease lost, its claim taken by another job, then the late report: refused
@example(
    suite=[(0, 1.0)],
    sizes=[0, 0],
    ops=[(0, "claim", 1.0), (0, "expire", 0.0), (1, "claim", 1.0), (0, "report", 0.0)],
)
def test_every_test_ends_exactly_once(
    postgres: Server,
    suite: list[tuple[int, float]],
    sizes: list[int],
    ops: list[tuple[int, str, float]],
) -> None:
    store = QueueStore(postgres.url, f"prop-{time.time_ns()}-{next(_runs)}")
    tests = [QueuedTest(f"t.py::t{i}", d, f"{d} devices", e) for i, (d, e) in enumerate(suite)]
    needs = {t.test_id: t.devices for t in tests}
    store.publish(tests, "host")
    jobs = [Job(store.join(f"h{i}", i, size, "sim", 30), size) for i, size in enumerate(sizes)]
    accepted: dict[str, int] = {}

    def report(job: Job, claim: Claim) -> None:
        taken = store.report(job.job_id, claim, "passed", False, {"by": job.job_id})
        if taken:
            assert claim.test_id not in accepted, f"{claim.test_id} counted twice"
            accepted[claim.test_id] = job.job_id
        else:
            assert job.expired, f"job {job.job_id} refused without losing its lease"

    try:
        for index, op, seconds in ops:
            job = jobs[index % len(jobs)]
            if job.left:
                continue
            if op == "claim":
                got = store.claim(job.job_id, job.devices, seconds)
                assert all(needs[c.test_id] <= job.devices for c in got)
                job.held += got
            elif op == "report" and job.held:
                report(job, job.held.pop(0))
            elif op == "expire":
                store.db.execute(
                    "UPDATE devpool_queue_jobs SET expires_at = now() - interval '1 second' "
                    "WHERE job_id = %s",
                    (job.job_id,),
                )
                job.expired = True
            elif op == "leave":
                store.leave(job.job_id)
                job.left, job.held = True, []
        for job in jobs:  # the live jobs report what they hold, then drain the queue
            if job.left:
                continue
            while job.held:
                report(job, job.held.pop(0))
            if not job.expired:
                while got := store.claim(job.job_id, job.devices, 100.0):
                    for claim in got:
                        report(job, claim)
            store.leave(job.job_id)
        settled = store.settle()
        rows = store.tests()
        assert all(row.state == "done" for row in rows)
        assert not set(settled) & set(accepted)
        assert set(settled) | set(accepted) == set(needs)
        for row in rows:  # the one outcome the queue kept is the one report accepted
            if row.test_id in accepted:
                assert row.result is not None and row.result["by"] == accepted[row.test_id]
            else:
                assert row.outcome == "infra" and row.result is not None
                assert str(row.result["detail"]).startswith("unsatisfiable: it needs")
        live = [job.devices for job in jobs if not job.expired and not job.left]
        biggest = max(live, default=-1)
        # nothing a live, unexpired job could hold was left unsatisfiable
        assert all(needs[test] > biggest for test in settled)
    finally:
        store.close()
