"""Unstarted (run/unstarted.py): jobs that end `infra` without starting here, each once and
with its reason: lease waits past --devpool-lease-timeout, too few healthy devices, a stall.
The queue is the real one; the replay records the endings it is asked to write."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from devpool.devices.waiting_room import Waiter
from devpool.outcomes import Outcome
from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.unstarted import Unstarted

TIMEOUT = 60.0


class Endings:
    """The replay: each synthesized ending, by job id."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, Outcome, str]] = []

    def synthesize(self, attempt: Attempt, outcome: Outcome, detail: str, duration: float) -> None:
        self.ended.append((attempt.job.id, outcome, detail))


class OtherRuns:
    """run/health.Foreign as Unstarted reads it: the devices other runs hold, and who."""

    def __init__(self, blocked: set[int]) -> None:
        self.blocked = dict.fromkeys(blocked)

    def __bool__(self) -> bool:
        return bool(self.blocked)

    def describe(self) -> str:
        return "sim:0 held by pid 99 (session theirs)"


def _job(id: int, devices: int = 1) -> Job:
    return Job(id, f"t.py::test_{id}", ("t.py", id, f"test_{id}"), Request(devices), id)


def _unstarted(
    jobs: list[Job],
    healthy: tuple[int, ...] = (0, 1, 2, 3),
    blocked: set[int] = frozenset(),  # type: ignore[assignment]
    bad: dict[int, str] | None = None,
    waiters: list[Waiter] | None = None,
) -> tuple[Unstarted, Scheduler, Endings]:
    scheduler = Scheduler(healthy, policy=None, max_parallel=4, cpu_slots=4)  # type: ignore[arg-type]
    for job in jobs:
        scheduler.add(job)
    ctx: Any = SimpleNamespace(
        inventory=SimpleNamespace(platform=SimpleNamespace(name="sim"), devices=(0, 1, 2, 3)),
        settings=SimpleNamespace(lease_timeout=TIMEOUT),
        bad_devices=bad or {},
        lock_dir=SimpleNamespace(held_by_others=lambda run_id: []),
        run_id="ours",
    )
    pool: Any = SimpleNamespace(retiring=lambda: [])
    fair: Any = SimpleNamespace(others=lambda: waiters or [])
    replay = Endings()
    attempts = {job.id: Attempt(job, 1) for job in jobs}
    for job in jobs:
        for member in job.chain or ():
            attempts.setdefault(member.id, Attempt(member, 1))
    unstarted = Unstarted(ctx, scheduler, pool, replay, OtherRuns(blocked), fair, attempts)  # type: ignore[arg-type]
    return unstarted, scheduler, replay


def test_a_job_blocked_by_other_runs_ends_infra_once_the_lease_timeout_passes() -> None:
    two, cpu = _job(1, devices=2), _job(2, devices=0)
    unstarted, scheduler, replay = _unstarted([two, cpu], blocked={0, 1, 2})
    since: dict[int, float] = {}
    unstarted.expire_lease_waits(100.0, since)
    assert since == {2: 100.0} and replay.ended == []
    unstarted.expire_lease_waits(100.0 + TIMEOUT - 1, since)
    assert replay.ended == [] and len(scheduler.queue) == 2
    unstarted.expire_lease_waits(100.0 + TIMEOUT, since)
    assert replay.ended == [
        (
            1,
            Outcome.INFRA,
            "no lease on 2 sim devices within --devpool-lease-timeout 60s (waited 60s): "
            "sim:0 held by pid 99 (session theirs)",
        )
    ]
    assert two.foreign_wait == TIMEOUT
    assert list(scheduler.queue) == [cpu]  # a CPU job never waits for a lease


def test_a_wait_that_clears_starts_its_clock_again() -> None:
    unstarted, _, replay = _unstarted([_job(1, devices=2)], blocked={0, 1, 2})
    since: dict[int, float] = {}
    unstarted.expire_lease_waits(0.0, since)
    unstarted.foreign.blocked.clear()  # type: ignore[attr-defined]
    unstarted.expire_lease_waits(TIMEOUT - 1, since)
    assert since == {}
    unstarted.foreign.blocked.update({0: None, 1: None, 2: None})  # type: ignore[attr-defined]
    unstarted.expire_lease_waits(TIMEOUT + 1, since)
    assert replay.ended == [] and since == {2: TIMEOUT + 1}


def test_jobs_needing_more_devices_than_remain_healthy_each_end_with_one_named_reason() -> None:
    big, bigger, small = _job(1, devices=3), _job(2, devices=3), _job(3, devices=2)
    bad = {2: "ECC errors pending", 3: "fell off the bus"}
    unstarted, scheduler, replay = _unstarted([big, bigger, small], healthy=(0, 1), bad=bad)
    unstarted.fail_unplaceable()
    reason = (
        "needs 3 sim devices; only 2 healthy remain after retiring "
        "sim:2 (ECC errors pending), sim:3 (fell off the bus)"
    )
    assert sorted(replay.ended) == [(1, Outcome.INFRA, reason), (2, Outcome.INFRA, reason)]
    assert list(scheduler.queue) == [small]
    unstarted.fail_unplaceable()  # nothing more to end: no job ends twice
    assert len(replay.ended) == 2


def test_the_rest_of_a_chain_ends_with_its_first_test_naming_it() -> None:
    first, second, third = _job(1, devices=3), _job(2, devices=3), _job(3, devices=3)
    chain = (first, second, third)
    for job in chain:
        job.chain = chain
    unstarted, _, replay = _unstarted([first], healthy=(0, 1))
    unstarted.attempts[third.id].state = State.CONCLUDED  # type: ignore[index]
    unstarted.fail_unplaceable()
    assert [(job, outcome) for job, outcome, _ in replay.ended] == [
        (1, Outcome.INFRA),
        (2, Outcome.INFRA),
    ]
    why = replay.ended[1][2]
    assert why.startswith("the first test of its chain, t.py::test_1, did not start: needs 3")


def test_a_stalled_queue_ends_every_job_naming_the_runs_waiting_for_a_share() -> None:
    jobs = [_job(1), _job(2, devices=2), _job(3, devices=0)]
    waiters = [Waiter("theirs", 4242, "h", "sim", 1.0, 2), Waiter("more", 4343, "h", "sim", 2.0, 1)]
    unstarted, scheduler, replay = _unstarted(jobs, waiters=waiters)
    unstarted.stalled_out(75.0)
    assert len(scheduler.queue) == 0
    assert sorted(job for job, _, _ in replay.ended) == [1, 2, 3]
    assert {outcome for _, outcome, _ in replay.ended} == {Outcome.INFRA}
    by_job = {job: why for job, _, why in replay.ended}
    assert by_job[2] == (
        "not placed within --devpool-lease-timeout 60s (waited 75s; needs 2 sim devices): "
        "no other run held anything then; runs waiting for a share: pid 4242, pid 4343"
    )
    assert "needs 1 sim device)" in by_job[1]
    assert all(job.foreign_wait == 75.0 for job in jobs)
