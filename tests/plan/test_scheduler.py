"""Unit tests for devpool.plan.scheduler and the policies: queue order, device choice, backfill."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from devpool.plan import jobs as plan
from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill, Fifo
from devpool.plan.scheduler import IdleWorker, Placement, Pool, Queue, Running, Scheduler

EIGHT = tuple(range(8))


def job(
    id: int, devices: int, estimate: float = 1.0, index: int | None = None, isolate: bool = False
) -> Job:
    return Job(
        id=id,
        nodeid=f"test_x.py::test_{id}",
        location=("test_x.py", id, f"test_{id}"),
        request=Request(device_count=devices, isolate=isolate),
        index=id if index is None else index,
        estimate=estimate,
    )


def pool(
    free: Iterable[int] = EIGHT,
    idle: Iterable[IdleWorker] = (),
    running: Iterable[Running] = (),
    slots: int = 8,
    cpu_slots: int = 2,
) -> Pool:
    return Pool(set(free), list(idle), list(running), slots, cpu_slots)


Started = dict[int, tuple[float, tuple[int, ...]]]


def simulate(
    scheduler: Scheduler,
    arrivals: Iterable[tuple[float, Job]],
    duration: Callable[[Job], float] = lambda j: j.estimate,
) -> Started:
    """Discrete-event run: jobs arrive at given times, run for duration(job); no real clock.

    Jobs the scheduler already runs end at their start + duration. Returns job id →
    (start time, devices) and checks that no device is ever used twice.
    """
    pending = sorted(arrivals, key=lambda a: a[0])
    ends = [(r.started + duration(r.job), r.job.id, r.job) for r in scheduler.running.values()]
    heapq.heapify(ends)
    started: Started = {}
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
            assert len(placement.devices) == placement.job.devices_needed
            started[placement.job.id] = (now, placement.devices)
            heapq.heappush(ends, (now + duration(placement.job), placement.job.id, placement.job))
        in_use = [d for run in scheduler.running.values() for d in run.devices]
        assert len(in_use) == len(set(in_use)), f"a device is used twice at t={now}: {in_use}"
        assert len(scheduler.running) <= scheduler.max_parallel
    return started


def ids(placements: Iterable[Placement]) -> list[int]:
    return [p.job.id for p in placements]


# --- Queue -----------------------------------------------------------------------------------


def test_queue_orders_by_device_seconds_then_request_size_then_collection_index() -> None:
    jobs = [
        job(0, devices=1, estimate=4.0),  # 4 device-seconds
        job(1, devices=2, estimate=2.0),  # 4, larger request than job 0
        job(2, devices=4, estimate=0.5),  # 2
        job(3, devices=1, estimate=4.0),  # 4, collected after job 0
        job(4, devices=0, estimate=4.0),  # a CPU job weighs half a device: 2
        job(5, devices=8, estimate=1.0),  # 8
    ]
    queue = Queue(reversed(jobs))

    assert [j.id for j in queue] == [5, 1, 0, 3, 2, 4]
    assert len(queue) == 6


def test_queue_heads_are_the_best_job_of_each_size_best_first() -> None:
    queue = Queue(
        [job(0, 1, estimate=1.0), job(1, 1, estimate=9.0), job(2, 2, estimate=3.0), job(3, 0, 1.0)]
    )

    assert [j.id for j in queue.heads()] == [1, 2, 3]
    assert queue.peek(1).id == 1
    assert queue.of_size_count(1) == 2
    assert queue.of_size_count(4) == 0


def test_queue_pop_and_pop_job_keep_count_and_order() -> None:
    queue = Queue([job(i, 1, estimate=float(10 - i)) for i in range(4)])

    assert queue.pop(1).id == 0
    middle = next(j for j in queue if j.id == 2)
    queue.pop_job(middle)

    assert [j.id for j in queue] == [1, 3]
    assert len(queue) == 2
    assert queue.pop(1).id == 1


# --- Pool.take ---------------------------------------------------------------------------------


def test_take_prefers_a_warm_idle_worker_of_the_same_size() -> None:
    warm = IdleWorker(key=7, devices=(4, 5))
    p = pool(idle=[IdleWorker(3, (6,)), warm])

    placement = p.take(job(0, 2), isolate=False)

    assert placement == Placement(job=placement.job, devices=(4, 5), reuse=7)
    assert p.free == {0, 1, 2, 3, 6, 7}
    assert [w.key for w in p.idle] == [3]
    assert p.slots == 7


def test_take_for_an_isolated_job_skips_warm_workers() -> None:
    p = pool(idle=[IdleWorker(7, (0, 1))])

    placement = p.take(job(0, 2, isolate=True), isolate=True)

    assert placement is not None
    assert placement.reuse is None
    assert placement.retire == ()
    assert placement.devices == (2, 3)  # the first aligned cold block


def chosen(free: set[int], k: int) -> tuple[int, ...]:
    placement = pool(free=free).take(job(0, k), isolate=False)
    assert placement is not None
    return placement.devices


def test_take_prefers_an_aligned_block_of_consecutive_ids() -> None:
    assert chosen({1, 2, 3, 4, 5}, 2) == (2, 3)  # aligned to 2, not (1, 2)
    assert chosen({4, 5, 6, 7, 0}, 4) == (4, 5, 6, 7)
    assert chosen({1, 2, 3, 4, 6}, 4) == (1, 2, 3, 4)  # no aligned block: any consecutive run
    assert chosen({0, 2, 4, 6}, 2) == (0, 2)  # nothing consecutive: the lowest ids


def test_take_retires_idle_workers_only_when_cold_devices_do_not_suffice() -> None:
    small, large = IdleWorker(1, (0, 1)), IdleWorker(2, (2, 3, 4))  # cold: 5, 6, 7

    three = pool(idle=[large, small]).take(job(0, 3), isolate=False)
    assert three is not None
    assert (three.devices, three.reuse, three.retire) == ((2, 3, 4), 2, ())

    p = pool(idle=[large, small])
    four = p.take(job(1, 4), isolate=False)
    assert four is not None
    assert four.reuse is None
    assert four.retire == (1,)  # fewest devices first: the 2-device worker goes, not the 3
    assert four.devices == (0, 1, 5, 6)
    assert [w.key for w in p.idle] == [2]
    assert p.free == {2, 3, 4, 7}


def test_take_uses_cold_devices_before_retiring() -> None:
    p = pool(idle=[IdleWorker(1, (0, 1))])

    placement = p.take(job(0, 4), isolate=False)

    assert placement is not None
    assert placement.retire == ()
    assert placement.devices == (4, 5, 6, 7)
    assert [w.key for w in p.idle] == [1]


def test_take_refuses_without_slots_cpu_slots_or_devices() -> None:
    assert pool(slots=0).take(job(0, 1), False) is None
    assert pool(free={0, 1}).take(job(0, 4), False) is None

    p = pool(cpu_slots=1)
    cpu = p.take(job(0, 0), False)
    assert cpu is not None
    assert cpu.devices == ()
    assert p.cpu_slots == 0
    assert p.take(job(1, 0), False) is None
    assert p.take(job(2, 1), False) is not None  # device jobs do not need a CPU slot


# --- Scheduler ---------------------------------------------------------------------------------


def test_scheduler_respects_max_parallel() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=3, cpu_slots=4)
    for i in range(10):
        scheduler.add(job(i, 1))

    first = scheduler.schedule(0.0)
    assert len(first) == 3
    assert scheduler.schedule(0.0) == []
    scheduler.finish(first[0].job)
    assert len(scheduler.schedule(1.0)) == 1


def test_scheduler_respects_cpu_slots_alongside_device_jobs() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=2)
    for i in range(5):
        scheduler.add(job(i, 0))
    scheduler.add(job(9, 1))

    placed = scheduler.schedule(0.0)

    assert sorted(ids(placed)) == [0, 1, 9]
    assert sum(1 for run in scheduler.running.values() if not run.devices) == 2


def cpu_bound(id: int, devices: int, cores: int, estimate: float = 1.0) -> Job:
    made = job(id, devices, estimate)
    made.cpu_cores = cores
    return made


def test_cpu_bound_device_jobs_share_the_cores_while_waiting_ones_use_every_device() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=2)
    for i in range(4):
        scheduler.add(cpu_bound(i, 1, cores=1))
    for i in range(10, 14):
        scheduler.add(job(i, 1))

    placed = scheduler.schedule(0.0)

    busy = [p for p in placed if p.job.cpu_needed]
    assert len(busy) == 2  # two cores: two CPU-bound tests, though six devices are free
    assert sorted(ids(p for p in placed if not p.job.cpu_needed)) == [10, 11, 12, 13]


def test_a_cpu_bound_job_waiting_for_cores_is_not_passed_by_cpu_tests_behind_it() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=2)
    scheduler.add(job(0, 0, estimate=5.0))  # holds one core
    assert ids(scheduler.schedule(0.0)) == [0]
    scheduler.add(cpu_bound(1, 1, cores=2, estimate=10.0))  # wants both cores
    for i in range(2, 6):
        scheduler.add(job(i, 0, estimate=0.1))

    assert scheduler.schedule(1.0) == []  # the free core is kept for it
    scheduler.finish(scheduler.running[0].job)
    assert ids(scheduler.schedule(5.0)) == [1]


@given(
    st.lists(
        st.tuples(st.sampled_from([0, 1, 2, 4]), st.integers(0, 3), st.floats(0.1, 5.0)),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 4),
)
@hypothesis_settings(max_examples=60, deadline=None)
def test_running_jobs_never_take_more_cores_than_there_are(
    specs: list[tuple[int, int, float]], cores: int
) -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=cores)
    jobs = [
        cpu_bound(i, k, plan.cpu_slots_of(load, cores) if k else 0, estimate=seconds)
        for i, (k, load, seconds) in enumerate(specs)
    ]
    started: set[int] = set()
    ends: list[tuple[float, int, Job]] = []
    for item in jobs:
        scheduler.add(item)
    now = 0.0
    while True:
        for placement in scheduler.schedule(now):
            started.add(placement.job.id)
            heapq.heappush(ends, (now + placement.job.estimate, placement.job.id, placement.job))
        held = sum(run.job.cpu_needed for run in scheduler.running.values())
        assert held <= cores
        if not ends:
            break
        now = ends[0][0]
        while ends and ends[0][0] <= now:
            scheduler.finish(heapq.heappop(ends)[2])
    assert started == {j.id for j in jobs}  # every job ran: no core request starves


def test_cpu_slots_of_a_load() -> None:
    assert plan.cpu_slots_of(0.02, 8) == 0  # waits on its device
    assert plan.cpu_slots_of(0.7, 8) == 1
    assert plan.cpu_slots_of(1.6, 8) == 2
    assert plan.cpu_slots_of(12.0, 4) == 4  # never more than there are: it still runs


def test_simulation_never_exceeds_max_parallel_or_reuses_devices() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=3, cpu_slots=1)
    jobs = [job(i, [0, 1, 2, 4, 8][i % 5], estimate=1.0 + i % 3) for i in range(25)]

    started = simulate(scheduler, [(0.0, j) for j in jobs])

    assert sorted(started) == list(range(25))
    assert scheduler.idle


def test_unavailable_devices_are_not_handed_out() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    scheduler.add(job(0, 4))

    (placement,) = scheduler.schedule(0.0, unavailable={0, 1, 2})

    assert placement.devices == (4, 5, 6, 7)


def test_unplace_puts_the_job_back_in_the_queue() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    scheduler.add(job(0, 2))
    (placement,) = scheduler.schedule(0.0)
    assert len(scheduler.queue) == 0

    scheduler.unplace(placement.job)

    assert scheduler.running == {}
    assert [j.id for j in scheduler.queue] == [0]
    (again,) = scheduler.schedule(1.0, unavailable=placement.devices)
    assert again.job is placement.job
    assert not set(again.devices) & set(placement.devices)


# --- Backfill ----------------------------------------------------------------------------------


def running(scheduler: Scheduler, j: Job, at: float = 0.0) -> Placement:
    """Start j alone at time `at`, as if it had been placed before the rest were queued."""
    scheduler.add(j)
    (placement,) = scheduler.schedule(at)
    assert placement.job is j
    return placement


def test_backfill_lets_smaller_jobs_pass_one_that_does_not_fit() -> None:
    scheduler = Scheduler(range(4), Backfill(), max_parallel=8, cpu_slots=1)
    running(scheduler, job(0, 2, estimate=10.0))
    scheduler.add(job(1, 4, estimate=10.0))  # needs all four: waits for job 0
    scheduler.add(job(2, 1, estimate=2.0))
    scheduler.add(job(3, 1, estimate=2.0))

    assert sorted(ids(scheduler.schedule(1.0))) == [2, 3]
    assert [j.id for j in scheduler.queue] == [1]


def test_backfill_admits_a_short_job_that_ends_before_the_reservation() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    running(scheduler, job(0, 6, estimate=10.0))  # ends at t=10
    scheduler.add(job(1, 8, estimate=10.0))  # reserved: all 8 devices at t=10
    scheduler.add(job(2, 1, estimate=3.0))  # t=1..4, ends before t=10

    assert ids(scheduler.schedule(1.0)) == [2]


def test_backfill_refuses_a_long_job_that_would_take_the_reserved_devices() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    running(scheduler, job(0, 6, estimate=10.0))
    scheduler.add(job(1, 8, estimate=10.0))
    scheduler.add(job(2, 2, estimate=30.0))  # t=1..31 would delay job 1 past t=10

    assert scheduler.schedule(1.0) == []

    started = simulate(scheduler, [])
    assert started[1][0] == 10.0
    assert started[2][0] == 20.0


def test_backfill_admits_a_long_job_on_devices_the_reserved_job_will_not_need() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    running(scheduler, job(0, 6, estimate=10.0))
    scheduler.add(job(1, 6, estimate=10.0))  # at t=10, 8 free, 2 spare
    scheduler.add(job(2, 1, estimate=30.0))
    scheduler.add(job(3, 1, estimate=30.0, index=4))
    scheduler.add(job(4, 1, estimate=29.0))

    assert sorted(ids(scheduler.schedule(1.0))) == [2, 3]  # the third would eat into job 1's six


def test_backfill_reservation_prevents_starvation_by_a_stream_of_small_jobs() -> None:
    scheduler = Scheduler(range(4), Backfill(), max_parallel=8, cpu_slots=1)
    arrivals = [(0.0, job(i, 1, estimate=float(i + 1))) for i in range(4)]  # end at 1, 2, 3, 4
    arrivals.append((0.5, job(10, 4, estimate=5.0)))
    # A new small job every half second would always find a free device without a reservation.
    arrivals += [(0.5 + 0.5 * n, job(100 + n, 1, estimate=3.0)) for n in range(40)]

    started = simulate(scheduler, arrivals)

    assert started[10][0] == 4.0  # as soon as the four first jobs are done
    assert all(started[100 + n][0] >= 4.0 for n in range(40) if started[100 + n][0] + 3.0 > 4.0)


def test_backfill_fills_devices_of_a_mixed_batch_without_idle_gaps() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    jobs = [job(0, 8, estimate=4.0)] + [job(i, 1, estimate=1.0) for i in range(1, 17)]

    started = simulate(scheduler, [(0.0, j) for j in jobs])

    assert started[0][0] == 0.0  # most device-seconds first
    assert max(start for start, _ in started.values()) == 5.0  # 16 one-second jobs on 8 devices


# --- Fifo --------------------------------------------------------------------------------------


def test_fifo_blocks_at_the_first_job_that_does_not_fit() -> None:
    scheduler = Scheduler(range(4), Fifo(), max_parallel=8, cpu_slots=1)
    running(scheduler, job(0, 2, estimate=10.0))
    scheduler.add(job(1, 4, estimate=1.0))
    scheduler.add(job(2, 1, estimate=1.0))

    assert scheduler.schedule(1.0) == []  # head-of-line: job 2 would fit but waits

    started = simulate(scheduler, [])
    assert started[1][0] == 10.0
    assert started[2][0] == 11.0


def test_fifo_starts_in_collection_order_not_priority() -> None:
    scheduler = Scheduler(range(2), Fifo(), max_parallel=8, cpu_slots=1)
    for j in (job(0, 1, estimate=1.0), job(1, 1, estimate=50.0), job(2, 1, estimate=99.0)):
        scheduler.add(j)

    assert ids(scheduler.schedule(0.0)) == [0, 1]
    assert [j.id for j in scheduler.queue] == [2]


# --- EASY reservation: regressions found in review ------------------------------------------


def test_backfill_does_not_let_lower_priority_same_size_jobs_jump_the_reservation() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    running(scheduler, job(0, 4, estimate=10.0))  # ends at t=10
    jobs = [
        job(1, 1, estimate=100.0),  # 100 device-seconds: first
        job(2, 6, estimate=15.0),  # 90: second, reserved for t=10 (7 free then, 1 spare)
        *(job(i, 1, estimate=50.0) for i in (3, 4, 5)),  # 50 each: only one may take the spare
    ]

    started = simulate(scheduler, [(0.0, j) for j in jobs])

    assert started[2][0] == 10.0  # the EASY promise


def test_backfill_reservation_counts_jobs_placed_in_the_same_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Strict device-seconds order (no tie buckets): this test is about the reservation.
    monkeypatch.setattr(plan, "ORDER_STEP", 1.000001)
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    jobs = [
        job(0, 1, estimate=100.0),  # 100 device-seconds, runs to t=100
        job(1, 4, estimate=20.0),  # 80, runs to t=20
        job(2, 6, estimate=12.0),  # 72: should be reserved for t=20 (7 free then, 1 spare)
        job(3, 2, estimate=30.0),  # 60: needs 2 > 1 spare and ends after t=20
    ]

    started = simulate(scheduler, [(0.0, j) for j in jobs])

    assert started[2][0] == 20.0  # job 3 must not take two of the reserved devices


def test_backfill_looks_past_a_long_job_for_a_short_one_of_the_same_size() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), max_parallel=8, cpu_slots=1)
    running(scheduler, job(0, 6, estimate=10.0))
    scheduler.add(job(1, 8, estimate=10.0))  # reserved for t=10, no spare
    scheduler.add(job(2, 1, estimate=30.0))  # may not backfill
    scheduler.add(job(3, 1, estimate=3.0))  # t=1..4: may

    assert ids(scheduler.schedule(1.0)) == [3]


def quiet_job(id: int, devices: int, estimate: float = 1.0) -> Job:
    return Job(
        id=id,
        nodeid=f"test_b.py::test_{id}",
        location=("test_b.py", id, f"test_{id}"),
        request=Request(device_count=devices, quiet=True, device_exclusive=devices > 0),
        index=id,
        estimate=estimate,
    )


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 3), st.floats(0.1, 5.0), st.floats(0, 10)),
        min_size=1,
        max_size=30,
    )
)
@hypothesis_settings(max_examples=60, deadline=None, derandomize=True)
def test_quiet_jobs_run_alone_after_the_rest_and_all_of_them_run(
    spec: list[tuple[bool, int, float, float]],
) -> None:
    """A benchmark (quiet) test never runs beside anything, and nothing waits on it forever."""
    jobs = [
        (at, quiet_job(i, k, d) if quiet else job(i, k, d))
        for i, (quiet, k, d, at) in enumerate(spec)
    ]
    by_id = {j.id: j for _, j in jobs}
    started = simulate(Scheduler(EIGHT, Backfill(), 8, 2), jobs)
    assert set(started) == set(by_id)
    spans = {i: (at, at + by_id[i].estimate) for i, (at, _) in started.items()}
    for i, (start, end) in spans.items():
        if not by_id[i].request.quiet:
            continue
        beside = [o for o, (s, e) in spans.items() if o != i and s < end and start < e]
        assert not beside, (i, beside)


def test_a_quiet_job_waits_for_the_queue_then_runs_before_later_arrivals_start() -> None:
    scheduler = Scheduler(EIGHT, Backfill(), 8, 2)
    scheduler.add(quiet_job(1, 0))
    scheduler.add(job(2, 1))
    assert ids(scheduler.schedule(0.0)) == [2]  # the ordinary one first
    assert scheduler.schedule(0.5) == []  # the quiet one waits: 2 still runs
    scheduler.finish(by_id_of(scheduler, 2))
    assert ids(scheduler.schedule(1.0)) == [1]
    scheduler.add(job(3, 0))
    assert scheduler.schedule(1.5) == []  # nothing starts beside a running benchmark
    assert len(scheduler.queue) == 1


def by_id_of(scheduler: Scheduler, job_id: int) -> Job:
    return scheduler.running[job_id].job
