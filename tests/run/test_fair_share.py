"""FairShare (run/fair_share.py): while other runs wait, this run holds no more than its
share: idle workers over it retire, busy ones are told once to end their batch. The waiting
room and the pool are fakes that record what they are told; fair_limit is the real one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from devpool.devices.waiting_room import Waiter
from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.scheduler import Scheduler
from devpool.run.attempts import Attempt, State
from devpool.run.fair_share import FairShare
from devpool.run.health import FOREIGN_RETRY
from devpool.run.pool import Slot
from devpool.worker import protocol


class Room:
    """A waiting room: what this run said, and the other runs waiting."""

    def __init__(self, others: list[Waiter]) -> None:
        self.waiting = others
        self.said: list[Waiter | None] = []

    def wait(self, waiter: Waiter | None) -> None:
        self.said.append(waiter)

    def others(self, platform: str) -> list[Waiter]:
        return [w for w in self.waiting if w.platform == platform]


class Worker:
    def __init__(self, key: int, devices: tuple[int, ...]) -> None:
        self.key, self.devices = key, devices
        self.told: list[protocol.Message] = []

    def send(self, message: protocol.Message) -> bool:
        self.told.append(message)
        return True


class Pool:
    """run/pool.WorkerPool as FairShare uses it: its slots, the idle ones, retiring."""

    def __init__(self) -> None:
        self.slots: dict[int, Slot] = {}
        self.idle: dict[int, Slot] = {}
        self.retired: list[int] = []

    def add(self, devices: tuple[int, ...], idle: bool, unstarted: int = 0) -> Slot:
        key = len(self.slots) + 1
        slot = Slot(Worker(key, devices))  # type: ignore[arg-type]
        for n in range(unstarted):
            job = Job(100 * key + n, f"t.py::test_{key}_{n}", ("t.py", n, "x"), Request(1), n)
            attempt = Attempt(job, 1)
            attempt.state = State.SENT
            slot.sent.append(attempt)
        self.slots[key] = slot
        if idle:
            self.idle[key] = slot
        return slot

    def held(self) -> set[int]:
        return {d for s in self.slots.values() if not s.stopping for d in s.worker.devices}

    def retire(self, slot: Slot, now: float) -> None:
        self.idle.pop(slot.key, None)
        slot.stopping = True
        self.retired.append(slot.key)


def _other(since: float = 1.0, wants: int = 1) -> Waiter:
    return Waiter("theirs", 4242, "h", "sim", since, wants)


def _fair(
    others: list[Waiter], unplaced: dict[int, float] | None = None
) -> tuple[FairShare, Pool, Room]:
    room, pool = Room(others), Pool()
    ctx: Any = SimpleNamespace(
        inventory=SimpleNamespace(platform=SimpleNamespace(name="sim"), devices=(0, 1, 2, 3)),
        run_id="ours",
        host="here",
    )
    backend: Any = SimpleNamespace(
        waiting_room=lambda session: room, unplaced=lambda now: dict(unplaced or {})
    )
    scheduler = Scheduler((0, 1, 2, 3), policy=None, max_parallel=4, cpu_slots=4)  # type: ignore[arg-type]
    fair = FairShare(ctx, scheduler, backend, pool, lambda line: None)  # type: ignore[arg-type]
    return fair, pool, room


def test_with_no_one_waiting_there_is_no_limit_and_nothing_retires() -> None:
    fair, pool, room = _fair([])
    for device in range(4):
        pool.add((device,), idle=True)
    fair.share(10.0, {}, None)
    assert fair.limit is None and not fair.over()
    assert pool.retired == [] and room.said == [None]


def test_idle_workers_over_the_share_retire_first_and_busy_ones_keep_running() -> None:
    fair, pool, _ = _fair([_other()])
    busy = [pool.add((0,), idle=False, unstarted=0), pool.add((1,), idle=False, unstarted=0)]
    idle = [pool.add((2,), idle=True), pool.add((3,), idle=True)]
    assert fair.over() is False  # not asked yet: no limit
    fair.share(10.0, {}, None)
    assert fair.limit == 2  # four devices, two runs
    assert sorted(pool.retired) == sorted(slot.key for slot in idle)
    assert not fair.over()
    assert all(slot.worker.told == [] for slot in busy)  # type: ignore[attr-defined]


def test_a_busy_worker_over_the_share_is_told_once_to_end_its_batch() -> None:
    fair, pool, _ = _fair([_other()])
    first = pool.add((0,), idle=False, unstarted=2)
    second = pool.add((1,), idle=False, unstarted=0)  # runs its last test: nothing to cancel
    third = pool.add((2, 3), idle=False, unstarted=1)
    fair.share(10.0, {}, None)
    assert fair.over()  # busy workers end with their test: still over until they do
    told = {slot.key: slot.worker.told for slot in (first, second, third)}  # type: ignore[attr-defined]
    assert told[first.key] == [protocol.Cancel()]
    assert told[second.key] == [] and told[third.key] == []  # held 4 → 3 → 2: at the share
    assert fair.trimmed == {first.key}
    fair.share(10.0 + FOREIGN_RETRY, {}, None)
    assert first.worker.told == [protocol.Cancel()]  # type: ignore[attr-defined]
    assert pool.retired == []


def test_this_run_says_in_the_room_what_it_waits_for_and_since_when() -> None:
    fair, _, room = _fair([_other(since=1e18)])  # they came after us
    fair.share(10.0, {2: 4.0, 1: 7.0}, None)
    (mine,) = room.said
    assert mine is not None
    assert (mine.session, mine.host, mine.platform, mine.wants) == ("ours", "here", "sim", 2)
    assert fair.waiting_since is not None
    # we waited longest and want no more than a share: we may hold the share
    assert fair.limit == 2
    fair.share(10.0 + FOREIGN_RETRY, {}, None)  # no longer blocked
    assert room.said[-1] is None and fair.waiting_since is None


def test_the_room_is_asked_again_only_after_a_pause_unless_newly_blocked() -> None:
    fair, _, room = _fair([_other()])
    fair.share(10.0, {}, None)
    fair.share(10.0 + FOREIGN_RETRY / 2, {}, None)
    assert len(room.said) == 1
    fair.share(10.0 + FOREIGN_RETRY / 2, {1: 10.0}, None)  # newly blocked: at once
    assert len(room.said) == 2 and room.said[-1] is not None


def test_a_ray_clusters_unplaced_workers_count_as_waits() -> None:
    fair, _, room = _fair([_other(since=1e18)], unplaced={3: 5.0})
    fair.share(10.0, {}, None)
    assert room.said[-1] is not None and room.said[-1].wants == 3


def test_leaving_takes_this_run_out_of_the_room() -> None:
    fair, _, room = _fair([_other()])
    fair.leave()
    assert room.said == [None]
    assert [w.pid for w in fair.others()] == [4242]


def test_a_worker_retired_this_turn_is_not_counted_again_among_the_busy() -> None:
    # Three other runs wait: four devices, a share of one each.
    fair, pool, _ = _fair([_other(), _other(), _other()])
    idle = pool.add((0,), idle=True)
    busy = [pool.add((d,), idle=False, unstarted=1) for d in (1, 2, 3)]
    fair.share(10.0, {}, None)
    assert fair.limit == 1 and pool.retired == [idle.key]
    # held 4 → 3 (the idle one) → 2 → 1: two of the three busy workers end their batch
    cancelled = [slot.key for slot in busy if slot.worker.told]  # type: ignore[attr-defined]
    assert cancelled == [busy[0].key, busy[1].key]
