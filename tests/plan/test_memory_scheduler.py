"""The scheduler packs by memory as well as by count: sharing, exclusion, reuse, no starvation."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill, Fifo
from devpool.plan.scheduler import IdleWorker, Pool, Scheduler, simulate

CAP = {0: 100, 1: 100}


def job(
    id: int, memory: int | None, devices: int = 1, estimate: float = 1.0, isolate: bool = False
) -> Job:
    request = Request(device_count=devices, device_memory=memory, isolate=isolate)
    return Job(id, f"t.py::test_{id}", ("t.py", id, f"test_{id}"), request, id, estimate=estimate)


def pool(
    free: Iterable[int] = (0, 1),
    shared: dict[int, int] | None = None,
    idle: Iterable[IdleWorker] = (),
    capacity: dict[int, int] | None = None,
) -> Pool:
    return Pool(
        set(free),
        list(idle),
        [],
        16,
        4,
        capacity=CAP if capacity is None else capacity,
        shared=dict(shared or {}),
    )


def test_memory_jobs_pack_the_fullest_device_that_still_fits() -> None:
    here = pool(free=[1], shared={0: 50})
    first = here.take(job(1, 30), False)
    assert first is not None and first.devices == (0,)
    second = here.take(job(2, 30), False)  # 80 used on 0: 20 left, so the cold device
    assert second is not None and second.devices == (1,)
    assert here.shared == {0: 80, 1: 30} and not here.free


def test_whole_and_memory_jobs_never_share_a_device() -> None:
    here = pool(free=[1], shared={0: 10})
    whole = here.take(job(1, None), False)
    assert whole is not None and whole.devices == (1,)
    assert here.take(job(2, None), False) is None  # device 0 runs a memory job
    assert here.take(job(3, 95), False) is None  # 90 left on 0, device 1 is whole-busy
    fits = here.take(job(4, 90), False)
    assert fits is not None and fits.devices == (0,)


def test_a_warm_worker_is_reused_only_by_a_job_of_the_same_kind() -> None:
    workers = [IdleWorker(7, (0,), memory=30), IdleWorker(8, (1,))]
    here = pool(idle=workers)
    other = here.take(job(1, 20), False)  # 70 left beside the idle 30: no reuse, no retire
    assert other is not None and (other.devices, other.reuse, other.retire) == ((0,), None, ())
    same = here.take(job(2, 30), False)
    assert same is not None and (same.devices, same.reuse) == ((0,), 7)
    whole = here.take(job(3, None), False)
    assert whole is not None and (whole.devices, whole.reuse) == ((1,), 8)


def test_idle_workers_are_retired_to_make_room() -> None:
    here = pool(free=[0], idle=[IdleWorker(7, (0,), memory=30), IdleWorker(8, (0,), memory=60)])
    big = here.take(job(1, 90), False)
    assert big is not None and big.devices == (0,) and set(big.retire) == {7, 8}
    # Their memory stays counted until they have exited.
    assert here.take(job(2, 10), False) is None

    here = pool(free=[0], idle=[IdleWorker(7, (0,), memory=30), IdleWorker(8, (0,), memory=60)])
    whole = here.take(job(3, None), False)
    assert whole is not None and whole.devices == (0,) and set(whole.retire) == {7, 8}

    here = pool(free=[0], idle=[IdleWorker(9, (0,))])
    small = here.take(job(4, 10), False)
    assert small is not None and small.retire == (9,)
    assert here.take(job(5, 10), False) is None  # held whole until the retiree has exited


def test_without_a_capacity_memory_jobs_hold_whole_devices() -> None:
    here = pool(capacity={})
    assert here.take(job(1, 10), False) is not None
    assert here.take(job(2, 10), False) is not None
    assert here.take(job(3, 10), False) is None


def run(
    scheduler: Scheduler,
    arrivals: Iterable[tuple[float, Job]],
    capacity: dict[int, int],
    duration: Callable[[Job], float] = lambda j: j.estimate,
) -> dict[int, float]:
    """Discrete-event run with arrivals; checks memory and exclusion at every step."""
    pending = sorted(arrivals, key=lambda a: (a[0], a[1].id))
    ends: list[tuple[float, int, Job]] = []
    started: dict[int, float] = {}
    position = 0
    while position < len(pending) or ends or len(scheduler.queue):
        times = [ends[0][0]] if ends else []
        if position < len(pending):
            times.append(pending[position][0])
        assert times, f"jobs left queued with nothing running: {[j.id for j in scheduler.queue]}"
        now = min(times)
        while ends and ends[0][0] <= now:
            scheduler.finish(heapq.heappop(ends)[2])
        while position < len(pending) and pending[position][0] <= now:
            scheduler.add(pending[position][1])
            position += 1
        for placement in scheduler.schedule(now):
            started[placement.job.id] = now
            heapq.heappush(ends, (now + duration(placement.job), placement.job.id, placement.job))
        for device, cap in capacity.items():
            on = [r.job for r in scheduler.running.values() if device in r.devices]
            wholes = [j for j in on if j.memory_needed is None]
            assert not wholes or len(on) == 1, f"t={now}: {device} shared with a whole job"
            used = sum(j.memory_needed or 0 for j in on)
            assert used <= cap, f"t={now}: {used} of {cap} used on device {device}"
    return started


def test_small_memory_jobs_run_side_by_side() -> None:
    scheduler = Scheduler((0,), Backfill(), 16, 4, capacity={0: 100})
    makespan = simulate(scheduler, [job(i, 20) for i in range(20)])
    assert makespan == 4.0  # five at once, not twenty one after another
    whole = Scheduler((0,), Backfill(), 16, 4)
    assert simulate(whole, [job(i, 20) for i in range(20)]) == 20.0


def test_a_whole_device_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    scheduler = Scheduler((0,), Backfill(), 16, 4, capacity={0: 100})
    stream = [(i * 0.25, job(i, 30, estimate=1.0)) for i in range(200)]
    big = job(1000, None, estimate=2.0)
    started = run(scheduler, [*stream, (0.1, big)], {0: 100})
    # It waits for the small jobs running when it came (≤ 1 s), not for the stream.
    assert started[1000] <= 1.25, started[1000]
    assert max(started.values()) > 40  # the stream went on after it


def test_a_large_memory_job_is_not_starved_by_smaller_ones() -> None:
    scheduler = Scheduler((0, 1), Backfill(), 16, 4, capacity=CAP)
    stream = [(i * 0.2, job(i, 40, estimate=1.0)) for i in range(200)]
    started = run(scheduler, [*stream, (0.05, job(1000, 90, devices=2, estimate=1.0))], CAP)
    assert started[1000] <= 1.25, started[1000]


def test_short_jobs_still_backfill_before_a_reservation() -> None:
    scheduler = Scheduler((0,), Backfill(), 16, 4, capacity={0: 100})
    first = job(1, 60, estimate=10.0)
    waiting = job(2, None, estimate=100.0)  # the most device-seconds: first in line
    short = job(3, 30, estimate=5.0)  # ends before the whole job could start: may go
    long = job(4, 30, estimate=50.0)  # would delay it: may not
    started = run(scheduler, [(0.0, first), (0.5, waiting), (1.0, short), (1.0, long)], {0: 100})
    assert started[3] == 1.0
    assert started[2] == 10.0
    assert started[4] == 110.0


def test_fifo_shares_by_memory_too() -> None:
    scheduler = Scheduler((0,), Fifo(), 16, 4, capacity={0: 100})
    started = run(scheduler, [(0.0, job(i, 50)) for i in range(4)], {0: 100})
    assert sorted(started.values()) == [0.0, 0.0, 1.0, 1.0]


@given(
    st.lists(
        st.tuples(
            st.floats(0, 20),
            st.sampled_from([None, 10, 25, 50, 100]),
            st.integers(1, 2),
            st.floats(0.1, 5),
        ),
        min_size=1,
        max_size=40,
    ),
)
@settings(max_examples=60, deadline=None)
def test_random_mixes_never_oversubscribe_and_all_start(
    specs: list[tuple[float, int | None, int, float]],
) -> None:
    scheduler = Scheduler((0, 1), Backfill(), 6, 2, capacity=CAP)
    arrivals = [
        (at, job(i, memory, devices, estimate))
        for i, (at, memory, devices, estimate) in enumerate(specs)
    ]
    # Real durations differ from the estimates: reservations must stay safe regardless.
    started = run(scheduler, arrivals, CAP, duration=lambda j: j.estimate * (1 + j.id % 3) / 2)
    assert set(started) == {j.id for _, j in arrivals}
