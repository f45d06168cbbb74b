"""One run across a fleet of CI jobs: the shared queue against static shards (issue 37).

Simulated, on sglang's mix (benchmarks/fleet.py: about 11,000 CPU tests and 914, 146, 223
and 200 tests of 1, 2, 4 and 8 devices, lognormal durations), four runner classes of 1, 2,
4 and 8 devices with JOBS jobs each. Every test's real duration is its estimate times a
factor drawn log-uniform in [0.5, 2] (estimates as wrong as the issue's). Each job runs
devpool's own Scheduler (Backfill) on a simulated clock; what differs is how tests reach it:

- queue: each job claims as queue/source.py and queue/store.py do: the longest tests its
  devices can hold (device-seconds first), in batches of BATCH_SECONDS per slot when what
  it holds falls under LOW_SECONDS per slot, the batch sized by how its tests ran against
  their estimates so far, and both no more than its part of the queued work it could hold
  (claims.guided: 1/(TAIL x live jobs)), so batches shrink as the run drains;
- static shards: `devpool shard` splits each class's tests (its own size; CPU tests go to the
  1-device class) into JOBS shards from the same wrong estimates, as fleet.py does.

Reported: each makespan against the fleet's lower bound (for every size m, the work of the
tests of m devices or more over the devices of the jobs that can hold them; the longest
test), and a run where one 8-device job is lost at a third of the way: its running tests and
its claims come back to the queue after the lease, and every test still ends exactly once.
Target: the queue <= 1.05x the bound.

Two GPU models (issue 56, `--models`): the same mix on a fleet of h100 and h200 runners (each
model with classes of 1, 2, 4 and 8 devices), a share of the device tests marked
platforms(["h100"]) or platforms(["h200"]), the rest and the CPU tests on either. A job
claims only what its model may run (queue/classes.py). Reported per model: its makespan (its
jobs' last end) against its bound, the larger of its own tests' bound (for every size m: the
work of the tests only it runs, of m devices or more, over its jobs' devices that hold them)
and the fleet's joint bound (all the work over all the devices). Target: within 2%.

    python benchmarks/fleet_queue.py [--seed 1] [--scale 1.0] [--jobs 4] [--models]
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import CLASSES, MIX, draw, jobs_of  # noqa: E402

from devpool.capacity.shards import shard_item, split_suite  # noqa: E402
from devpool.plan.jobs import Job  # noqa: E402
from devpool.plan.markers import Request  # noqa: E402
from devpool.plan.policies import Backfill  # noqa: E402
from devpool.plan.scheduler import Scheduler  # noqa: E402
from devpool.queue.claims import TAIL, guided  # noqa: E402
from devpool.queue.source import BATCH_SECONDS, LOW_SECONDS, work  # noqa: E402

LEASE = 30.0  # --devpool-queue-lease's default


@dataclass
class Runner:
    """One CI job: its devices, its own scheduler, what it claimed and how its tests ran."""

    name: str
    devices: int
    scheduler: Scheduler
    model: str = ""  # its platform, for a fleet of two models (--models)
    held: dict[int, Job] = field(default_factory=dict)  # claimed, not ended
    spent: float = 0.0
    estimated: float = 0.0
    ran: int = 0
    alive: bool = True

    def scale(self) -> float:
        if self.ran < max(1, self.devices) or self.estimated <= 0:
            return 1.0
        return min(1000.0, max(0.001, self.spent / self.estimated))


class Queue:
    """The run's queued tests, longest device-seconds first, one sorted list per size."""

    def __init__(self, jobs: list[Job], classes: dict[int, str] | None = None) -> None:
        self.classes = classes or {}  # job id → the one model that may run it (none: any)
        self.by_size: dict[tuple[int, str], list[tuple[float, int, Job]]] = {}
        for job in jobs:
            self.put(job)

    def put(self, job: Job) -> None:
        key = (work(job.estimate, job.devices_needed), -job.id, job)
        place = (job.devices_needed, self.classes.get(job.id, ""))
        bisect.insort(self.by_size.setdefault(place, []), key, key=lambda t: t[:2])

    def work_for(self, devices: int, model: str = "") -> float:
        """The queued work a job of `devices` devices could hold (store.claim's sum)."""
        return sum(
            t[0]
            for (size, of), lst in self.by_size.items()
            if size <= devices and of in ("", model)
            for t in lst
        )

    def claim(self, devices: int, seconds: float, model: str = "") -> list[Job]:
        taken: list[Job] = []
        total = 0.0
        while not taken or total < seconds:
            # tests only its model may run first (no other can take them), each longest first
            heads = [
                (place[1] == model, lst[-1][:2], place)
                for place, lst in self.by_size.items()
                if lst
            ]
            heads = [h for h in heads if h[2][0] <= devices and h[2][1] in ("", model)]
            if not heads:
                break
            *_, size = max(heads)
            cost, _, job = self.by_size[size].pop()
            taken.append(job)
            total += cost
        return taken

    def __len__(self) -> int:
        return sum(len(lst) for lst in self.by_size.values())


def runners_of(jobs_per_class: int, models: tuple[str, ...] = ("",)) -> list[Runner]:
    runners = []
    for model in models:
        for name, size in CLASSES.items():
            for i in range(jobs_per_class):
                scheduler = Scheduler(list(range(size)), Backfill(), size, size)
                runners.append(Runner(f"{model}{name}#{i}", size, scheduler, model))
    return runners


def simulate_queue(
    jobs: list[Job],
    actual: dict[int, float],
    runners: list[Runner],
    kill_at: float | None,
    classes: dict[int, str] | None = None,
    last: dict[str, float] | None = None,
) -> tuple[float, dict[int, int]]:
    """The queue's makespan, and how often each test ended (must be once each). classes:
    the model each test is restricted to; last: each model's last end, filled in."""
    queue = Queue(jobs, classes)
    ends: list[tuple[float, int, int, Job]] = []  # (time, seq, runner index, job)
    returns: list[tuple[float, list[Job]]] = []  # a lost runner's tests, back after the lease
    ended: dict[int, int] = {}
    now, seq = 0.0, 0
    doomed = next(i for i, r in enumerate(runners) if r.devices == 8) if kill_at else None
    while True:
        for at, back in [r for r in returns if r[0] <= now]:
            for job in back:
                queue.put(job)
            returns.remove((at, back))
        for index, runner in enumerate(runners):
            if not runner.alive:
                continue
            scale = runner.scale()
            slots = max(1, runner.devices)
            held = scale * sum(work(j.estimate, j.devices_needed) for j in runner.held.values())
            # the live jobs of its model share what it could hold (store.claim)
            live = sum(1 for r in runners if r.alive and r.model == runner.model)
            share = guided(float("inf"), queue.work_for(runner.devices, runner.model), live)
            if not runner.held or held < min(slots * LOW_SECONDS, scale * share):
                seconds = guided((slots * BATCH_SECONDS - held) / scale, share * TAIL, live)
                for job in queue.claim(runner.devices, seconds, runner.model):
                    runner.held[job.id] = job
                    runner.scheduler.add(job)
            for placement in runner.scheduler.schedule(now):
                seq += 1
                heapq.heappush(ends, (now + actual[placement.job.id], seq, index, placement.job))
        upcoming = [t for t, _ in returns] + ([ends[0][0]] if ends else [])
        if kill_at is not None and doomed is not None and runners[doomed].alive:
            upcoming.append(kill_at)
        if not upcoming:
            break
        now = min(upcoming)
        if kill_at is not None and doomed is not None and runners[doomed].alive and now >= kill_at:
            lost = runners[doomed]
            lost.alive = False
            ends = [e for e in ends if e[2] != doomed]  # its running tests die with it
            heapq.heapify(ends)
            returns.append((now + LEASE, list(lost.held.values())))
            lost.held = {}
            continue
        while ends and ends[0][0] <= now:
            _, _, index, job = heapq.heappop(ends)
            runner = runners[index]
            runner.scheduler.finish(job)
            runner.held.pop(job.id, None)
            runner.ran += 1
            runner.spent += actual[job.id]
            runner.estimated += job.estimate
            ended[job.id] = ended.get(job.id, 0) + 1
            if last is not None:
                last[runner.model] = max(last.get(runner.model, 0.0), now)
    if len(queue) or any(r.held for r in runners if r.alive):
        raise RuntimeError(f"{len(queue)} tests never claimed")
    return now, ended


def simulate_shards(
    tests: list[tuple[str, int, float]], actual: dict[str, float], jobs: int
) -> float:
    """devpool shard per runner class from the (wrong) estimates, run at the real durations."""
    worst = 0.0
    for size in CLASSES.values():
        mine = [t for t in tests if t[1] == size or (size == 1 and t[1] == 0)]
        items = [shard_item(nodeid, Request(device_count=k), s) for nodeid, k, s in mine]
        split = split_suite([i.nodeid for i in items], items, jobs)
        by_id = {i.nodeid: i for i in items}
        for shard in split.shards:
            chosen = [(by_id[n].nodeid, by_id[n].device_count, by_id[n].estimate) for n in shard]
            shard_jobs = jobs_of(chosen)
            scheduler = Scheduler(list(range(size)), Backfill(), size, size)
            for job in shard_jobs:
                job.estimate = chosen[job.id][2]
                scheduler.add(job)
            ends: list[tuple[float, int, Job]] = []
            now = 0.0
            while True:
                for placement in scheduler.schedule(now):
                    job = placement.job
                    heapq.heappush(ends, (now + actual[job.nodeid], job.id, job))
                if not ends:
                    break
                now = ends[0][0]
                while ends and ends[0][0] <= now:
                    scheduler.finish(heapq.heappop(ends)[2])
            worst = max(worst, now)
    return worst


def fleet_bound(
    tests: list[tuple[str, int, float]], actual: dict[str, float], jobs: int, lost_at: float = -1
) -> float:
    """For each size m: the work of tests needing m devices or more over the devices of the
    jobs that can hold them (one 8-device job holding none after `lost_at`, when >= 0); and
    the longest test."""
    low = max(actual.values())
    for m in sorted({max(1, k) for k in MIX}):
        need = sum(max(1, k) * actual[n] for n, k, _ in tests if max(1, k) >= m)
        have = jobs * sum(s for s in CLASSES.values() if s >= m)
        if lost_at >= 0:  # its devices worked until then, none after
            need -= 8 * lost_at
            have -= 8
        low = max(low, need / have)
    return low


MODELS = ("h100", "h200")
RESTRICTED = {"h100": 0.4, "h200": 0.2}  # shares of the device tests only that model runs


def model_bound(
    tests: list[tuple[str, int, float]],
    actual: dict[str, float],
    classes: dict[str, str],
    jobs: int,
    model: str,
) -> float:
    """A model's bound: its own tests' (per size m, their work over its devices that hold
    them; its longest test), and the fleet's joint bound (all the work, all the devices)."""
    mine = [t for t in tests if classes.get(t[0]) == model]
    low = max([actual[n] for n, _, _ in mine] or [0.0])
    for m in sorted({max(1, k) for k in MIX}):
        need = sum(max(1, k) * actual[n] for n, k, _ in mine if max(1, k) >= m)
        low = max(low, need / (jobs * sum(s for s in CLASSES.values() if s >= m)))
        every = sum(max(1, k) * actual[n] for n, k, _ in tests if max(1, k) >= m)
        have = len(MODELS) * jobs * sum(s for s in CLASSES.values() if s >= m)
        low = max(low, every / have)
    return low


def two_models(
    estimated: list[tuple[str, int, float]], actual: dict[str, float], jobs: int
) -> None:
    """The mix on h100 and h200 runners: each model's makespan against its bound."""
    rng = random.Random(7)
    classes: dict[str, str] = {}
    for nodeid, devices, _ in estimated:
        if devices:
            draw_ = rng.random()
            if draw_ < RESTRICTED["h100"]:
                classes[nodeid] = "h100"
            elif draw_ < RESTRICTED["h100"] + RESTRICTED["h200"]:
                classes[nodeid] = "h200"
    queued = jobs_of(estimated)
    for job in queued:
        job.estimate = estimated[job.id][2]
    by_id = {job.id: actual[job.nodeid] for job in queued}
    of = {job.id: classes[job.nodeid] for job in queued if job.nodeid in classes}
    last: dict[str, float] = {}
    _, ended = simulate_queue(queued, by_id, runners_of(jobs, MODELS), None, of, last)
    once = all(ended.get(job.id) == 1 for job in queued)
    counts = {m: sum(1 for c in classes.values() if c == m) for m in MODELS}
    print(
        f"two models, {len(CLASSES)} runner classes x {jobs} jobs each; device tests only "
        + ", ".join(f"{m}: {counts[m]}" for m in MODELS)
        + f"; every test once: {once}"
    )
    for model in MODELS:
        bound = model_bound(estimated, actual, classes, jobs, model)
        print(
            f"  {model}: makespan {last.get(model, 0.0):,.0f} s = "
            f"{last.get(model, 0.0) / bound:.3f}x its bound {bound:,.0f} s (target <= 1.02x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count")
    parser.add_argument("--jobs", type=int, default=4, help="jobs of each runner class")
    parser.add_argument("--models", action="store_true", help="only: two GPU models' fleet")
    args = parser.parse_args()
    estimated = draw(args.seed, args.scale)
    rng = random.Random(args.seed + 1)
    actual = {n: s * math.exp(rng.uniform(math.log(0.5), math.log(2.0))) for n, _, s in estimated}
    if args.models:
        two_models(estimated, actual, args.jobs)
        return
    low = fleet_bound(estimated, actual, args.jobs)
    print(
        f"{len(estimated)} tests, {len(CLASSES)} runner classes (1, 2, 4, 8 devices) x "
        f"{args.jobs} jobs; estimates wrong by x0.5-x2 (log-uniform); bound {low:,.0f} s"
    )
    for kill in (None, "one 8-device job lost at a third of the bound"):
        jobs = jobs_of(estimated)
        for job in jobs:
            job.estimate = estimated[job.id][2]
        by_id = {job.id: actual[job.nodeid] for job in jobs}
        makespan, ended = simulate_queue(
            jobs, by_id, runners_of(args.jobs), low / 3 if kill else None
        )
        once = all(ended.get(job.id) == 1 for job in jobs)
        bound = fleet_bound(estimated, actual, args.jobs, low / 3) if kill else low
        print(
            f"  queue{' (' + kill + ')' if kill else ''}: {makespan:,.0f} s = "
            f"{makespan / bound:.3f}x {'its' if kill else 'the'} bound {bound:,.0f} s "
            f"(target <= 1.05x); every test once: {once}"
        )
    static = simulate_shards(estimated, actual, args.jobs)
    print(f"  static shards (devpool shard per class): {static:,.0f} s = {static / low:.3f}x")


if __name__ == "__main__":
    main()
