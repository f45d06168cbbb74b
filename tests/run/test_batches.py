"""Batches (run/batches.py): which queued jobs go with a placed one, and a streamed batch's
next part. The queue and scheduler are the real ones; the context and worker are plain data."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.batches import BATCH_MAX, Batches
from devpool.run.pool import Slot


def _job(
    id: int,
    module: str = "t.py",
    estimate: float | None = 0.25,
    request: Request | None = None,
) -> Job:
    known = estimate is not None
    return Job(
        id,
        f"{module}::test_{id}",
        (module, id, f"test_{id}"),
        request or Request(),
        id,
        estimate=estimate if known else 1.0,
        estimate_known=known,
    )


def _batches(
    jobs: list[Job], cpu_slots: int = 1, isolation: str = "worker", devices: tuple[int, ...] = ()
) -> tuple[Batches, Scheduler, dict[int, Attempt]]:
    scheduler = Scheduler(devices, policy=None, max_parallel=4, cpu_slots=cpu_slots)  # type: ignore[arg-type]
    for job in jobs:
        scheduler.add(job)
    attempts = {job.id: Attempt(job, 1) for job in jobs}
    ctx: Any = SimpleNamespace(settings=SimpleNamespace(isolation=isolation, cpu_slots=cpu_slots))
    return Batches(ctx, scheduler, attempts), scheduler, attempts


def _ids(jobs: list[Job]) -> list[int]:
    return [job.id for job in jobs]


def test_small_jobs_of_the_heads_kind_fill_a_second_of_work_in_queue_order() -> None:
    head = _job(0)
    batches, scheduler, _ = _batches([_job(i) for i in range(1, 21)])
    # 0.25 s each: the head's quarter and three more make BATCH_SECONDS (1.0)
    assert _ids(batches.after(head, stopped=False)) == [1, 2, 3]
    assert len(scheduler.queue) == 17 and scheduler.queue.peek(0).id == 4


def test_a_test_with_no_history_counts_as_small() -> None:
    head = _job(0, estimate=None)
    batches, _, _ = _batches([_job(i, estimate=None) for i in range(1, 41)])
    # 0.1 s assumed each (not its 1.0 default estimate): nine beside the head
    assert len(batches.after(head, stopped=False)) in (8, 9)


def test_a_batch_is_never_more_than_a_fair_part_of_what_is_left() -> None:
    head = _job(0, estimate=0.001)
    batches, scheduler, _ = _batches([_job(i, estimate=0.001) for i in range(1, 17)], cpu_slots=4)
    # 16 queued over 4 CPU slots: at most 16 // (2 × 4) = 2 go with the head
    assert _ids(batches.after(head, stopped=False)) == [1, 2]
    assert len(scheduler.queue) == 14


def test_a_batch_never_exceeds_batch_max() -> None:
    head = _job(0, estimate=0.0001)
    many = [_job(i, estimate=0.0001) for i in range(1, 1000)]
    batches, _, _ = _batches(many)
    assert len(batches.after(head, stopped=False)) == BATCH_MAX


def test_a_batch_stops_at_the_first_job_that_differs_from_the_head() -> None:
    head = _job(0)
    differs = [
        Request(isolate=True),  # fresh: a process of its own
        Request(cpus=2),  # other CPU slots
    ]
    for request in differs:
        queued = [_job(1), _job(2, request=request), _job(3)]
        batches, scheduler, _ = _batches(queued)
        assert _ids(batches.after(head, stopped=False)) == [1], request
        assert scheduler.queue.peek(0).id == 2


def test_the_heads_own_duration_counts_against_the_second() -> None:
    queued = [_job(i) for i in range(1, 21)]
    batches, _, _ = _batches(queued)
    assert _ids(batches.after(_job(0, estimate=0.5), stopped=False)) == [1, 2]
    assert batches.after(_job(0, estimate=0.9), stopped=False) == []


def test_nothing_goes_with_a_fresh_head_a_stopped_run_or_job_isolation() -> None:
    queued = [_job(i) for i in range(1, 21)]
    batches, scheduler, _ = _batches(queued)
    assert batches.after(_job(0, request=Request(isolate=True)), stopped=False) == []
    assert batches.after(_job(0), stopped=True) == []
    isolated, _, _ = _batches([_job(i) for i in range(1, 21)], isolation="job")
    assert isolated.after(_job(0), stopped=False) == []
    assert len(scheduler.queue) == 20


def test_multi_device_and_rank_heads_run_alone() -> None:
    two = Request(device_count=2)
    head = _job(0, request=two)
    batches, _, _ = _batches([_job(i, request=two) for i in range(1, 21)], devices=(0, 1, 2, 3))
    assert batches.after(head, stopped=False) == []
    ranks = Request(ranks=2)
    batches, _, _ = _batches([_job(i, request=ranks) for i in range(1, 21)])
    assert batches.after(_job(0, request=ranks), stopped=False) == []


def test_module_isolation_sends_the_rest_of_the_module_whatever_its_duration() -> None:
    head = _job(0, module="a.py", estimate=30.0)
    queued = [_job(i, module="a.py", estimate=30.0) for i in range(1, 4)]
    queued.append(_job(4, module="b.py", estimate=30.0))
    batches, scheduler, _ = _batches(queued, cpu_slots=8, isolation="module")
    assert _ids(batches.after(head, stopped=False)) == [1, 2, 3]
    assert scheduler.queue.peek(0).id == 4


def test_a_chains_head_takes_the_rest_of_its_chain_still_queued() -> None:
    head, second, third = _job(0), _job(1), _job(2)
    chain = (head, second, third)
    for job in chain:
        job.chain = chain
    batches, _, attempts = _batches([head, second, third, _job(3)])
    assert batches.after(head, stopped=False) == [second, third]
    attempts[second.id].state = State.CONCLUDED  # ended already: not sent again
    assert batches.after(head, stopped=False) == [third]
    # a run that stops sends no more of the chain
    assert batches.after(head, stopped=True) == []


def _slot(head: Job, sent: list[Job]) -> Slot:
    worker: Any = SimpleNamespace(key=1, devices=())
    slot = Slot(worker, head=head)
    for job in sent:
        attempt = Attempt(job, 1)
        attempt.state = State.SENT
        slot.sent.append(attempt)
    return slot


def test_the_next_part_is_sent_only_when_the_worker_is_about_to_run_dry() -> None:
    head = _job(0)
    batches, _, _ = _batches([_job(i) for i in range(10, 40)])
    # three quarter-seconds unstarted: twice that is over BATCH_SECONDS, enough left
    assert batches.next_part(_slot(head, [_job(1), _job(2), _job(3)]), stopped=False) == []
    # so is half of BATCH_MAX in count, however short the tests
    tiny = [_job(i, estimate=0.0) for i in range(100, 100 + BATCH_MAX // 2 + 1)]
    assert batches.next_part(_slot(head, tiny), stopped=False) == []
    part = batches.next_part(_slot(head, [_job(1)]), stopped=False)
    assert _ids(part) == [10, 11, 12]


def test_no_next_part_for_a_worker_that_ends_or_spans_nodes() -> None:
    head = _job(0)
    batches, scheduler, _ = _batches([_job(i) for i in range(10, 40)])
    for field, value in (("stopping", True), ("dirty", True), ("head", None)):
        slot = _slot(head, [])
        setattr(slot, field, value)
        assert batches.next_part(slot, stopped=False) == [], field
    slot = _slot(head, [])
    slot.killed_for = Attempt(head, 1)
    assert batches.next_part(slot, stopped=False) == []
    nodes = _slot(_job(0, request=Request(device_count=1, nodes=2)), [])
    assert batches.next_part(nodes, stopped=False) == []
    assert len(scheduler.queue) == 30
