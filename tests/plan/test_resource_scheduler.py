"""The scheduler packs named host resources like devices, and their EASY reservation holds."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill
from devpool.plan.scheduler import Scheduler, simulate

RESOURCES = {"hccl": 2, "serial": 1}


def job(
    id: int, devices: int = 0, estimate: float = 1.0, memory: int | None = None, **wanted: int
) -> Job:
    request = Request(
        device_count=devices, device_memory=memory, resources=tuple(sorted(wanted.items()))
    )
    return Job(id, f"t.py::test_{id}", ("t.py", id, f"test_{id}"), request, id, estimate=estimate)


def scheduler(devices: int = 4, capacity: dict[int, int] | None = None) -> Scheduler:
    return Scheduler(range(devices), Backfill(), 16, 4, capacity=capacity, resources=RESOURCES)


def test_a_resource_of_capacity_one_runs_its_tests_one_at_a_time() -> None:
    sched = scheduler()
    for i in range(3):
        sched.add(job(i, serial=1))
    sched.add(job(9))  # a CPU test without the resource is not held up
    placed = sched.schedule(0.0)
    assert sorted(p.job.id for p in placed) == [0, 9]
    sched.finish(placed[0].job)
    assert [p.job.id for p in sched.schedule(1.0)] == [1]


def test_jobs_with_devices_and_resources_need_both() -> None:
    sched = scheduler(devices=2)
    sched.add(job(1, devices=1, hccl=2))
    sched.add(job(2, devices=1, hccl=1))
    sched.add(job(3, devices=1))
    placed = sched.schedule(0.0)
    assert [p.job.id for p in placed] == [1, 3]  # 2 fits a device but no hccl is left


def test_the_reservation_keeps_small_holders_from_starving_a_big_one() -> None:
    sched = scheduler()
    sched.add(job(1, estimate=10.0, hccl=1))
    assert [p.job.id for p in sched.schedule(0.0)] == [1]
    sched.add(job(2, estimate=50.0, hccl=2))  # first in line; waits for job 1: t=10
    sched.add(job(3, estimate=20.0, hccl=1))  # would end after t=10 and take its unit
    sched.add(job(4, estimate=2.0, hccl=1))  # ends before t=10: may backfill
    placed = sched.schedule(0.0)
    assert [p.job.id for p in placed] == [4]


def test_memory_sharing_keeps_resource_reservations() -> None:
    sched = scheduler(capacity={d: 100 for d in range(4)})
    sched.add(job(1, devices=1, memory=10, estimate=10.0, serial=1))
    assert [p.job.id for p in sched.schedule(0.0)] == [1]
    sched.add(job(2, devices=1, memory=10, estimate=1.0, serial=1))
    sched.add(job(3, devices=1, memory=10, estimate=1.0))
    assert [p.job.id for p in sched.schedule(0.0)] == [3]


@settings(max_examples=60, deadline=None)
@given(
    specs=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.floats(0.1, 5.0),
            st.integers(0, 2),
            st.integers(0, 1),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_every_job_runs_and_no_resource_is_ever_over_its_capacity(
    specs: list[tuple[int, float, int, int]],
) -> None:
    jobs = []
    for i, (devices, estimate, hccl, serial) in enumerate(specs):
        wanted = {k: v for k, v in (("hccl", hccl), ("serial", serial)) if v}
        jobs.append(job(i, devices=devices, estimate=estimate, **wanted))
    sched = scheduler(devices=2)
    # simulate() raises when a job never starts; check the holds at every placement too.
    ends: list[tuple[float, int, Job]] = []
    for j in jobs:
        sched.add(j)
    now = 0.0
    while True:
        for placement in sched.schedule(now):
            heapq.heappush(ends, (now + placement.job.estimate, placement.job.id, placement.job))
        for name, cap in RESOURCES.items():
            held = sum(dict(r.job.request.resources).get(name, 0) for r in sched.running.values())
            assert held <= cap
        if not ends:
            break
        now = ends[0][0]
        while ends and ends[0][0] <= now:
            sched.finish(heapq.heappop(ends)[2])
    assert not len(sched.queue)
    assert simulate(scheduler(devices=2), [job(j.id, **dict(j.request.resources)) for j in jobs])


def test_a_scheduler_given_no_capacity_for_a_resource_does_not_limit_it() -> None:
    sched = Scheduler(range(2), Backfill(), 16, 4)  # as simulations build it: no resources
    for i in range(3):
        sched.add(job(i, hccl=1))
    assert len(sched.schedule(0.0)) == 3
