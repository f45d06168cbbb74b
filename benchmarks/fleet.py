"""A fleet-sized suite planned and dispatched by devpool's own scheduler (issue 31 item 4).

sglang's CI shape: about 11,000 CPU tests and 914 one-GPU, 146 two-GPU, 223 four-GPU and 200
eight-GPU tests, with heavy-tailed (lognormal) durations, on a simulated cluster of 16
nodes x 8 devices (128 devices; CPU tests get 128 slots) and, for `devpool shard`, on four
runner classes of 1, 2, 4 and 8 devices. What runs is devpool's: build_plan, the Scheduler
with the Backfill policy, driven on a simulated clock as the controller drives it (one
placement per job, no batching: the controller's worst case); only the tests' execution
is simulated (each ends after its drawn duration). No test process, no Ray.

Reported: plan time; the process's peak RSS (jobs, plan and scheduler state; a real
controller also holds pytest's items: benchmarks/scale.py measures those); dispatch
decisions per second of scheduler CPU time; simulated makespan against the lower bound
max(device-seconds / 128, longest test); and devpool shard's split of the suite across the
four runner classes against its own estimate (each class's shards simulated on it).

Targets: plan < 2 s; RSS < 300 MB; >= 500 dispatches/s at 128 devices; makespan <= 1.05x
the bound.

    python benchmarks/fleet.py [--seed 1] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import heapq
import random
import resource
import time
from dataclasses import dataclass

from devpool.capacity.shards import shard_item, split_suite, wall_estimate
from devpool.devices.inventory import BUILTIN_PLATFORMS, Inventory
from devpool.plan.jobs import Job, build_plan
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill
from devpool.plan.scheduler import Scheduler

MIX = {0: 11000, 1: 914, 2: 146, 4: 223, 8: 200}  # device count → tests
NODES, PER_NODE = 16, 8
CLASSES = {"gpu-1": 1, "gpu-2": 2, "gpu-4": 4, "gpu-8": 8}
SHARDS_PER_CLASS = 4


@dataclass
class Dispatch:
    makespan: float
    decisions: int
    seconds: float  # CPU time inside the scheduler


def draw(seed: int, scale: float) -> list[tuple[str, int, float]]:
    """(nodeid, devices, seconds): lognormal durations, a heavy tail capped at 30 minutes."""
    rng = random.Random(seed)
    tests = []
    for devices, count in MIX.items():
        median = 0.3 if devices == 0 else 20.0 + 10.0 * devices
        for i in range(round(count * scale)):
            seconds = min(1800.0, rng.lognormvariate(0.0, 1.3) * median)
            tests.append((f"tests/test_{devices}gpu_{i // 50}.py::test_{i}", devices, seconds))
    rng.shuffle(tests)
    return tests


def jobs_of(tests: list[tuple[str, int, float]]) -> list[Job]:
    return [
        Job(i, nodeid, (nodeid, i, nodeid), Request(device_count=k), i)
        for i, (nodeid, k, _) in enumerate(tests)
    ]


def dispatch(jobs: list[Job], devices: int, seconds: dict[int, float]) -> Dispatch:
    """The controller's scheduling on a simulated clock: every job once, to the end."""
    scheduler = Scheduler(list(range(devices)), Backfill(), devices, devices)
    for job in jobs:
        scheduler.add(job)
    ends: list[tuple[float, int, Job]] = []
    now, decisions, spent = 0.0, 0, 0.0
    while True:
        start = time.process_time()
        placements = scheduler.schedule(now)
        spent += time.process_time() - start
        decisions += len(placements)
        for placement in placements:
            job = placement.job
            heapq.heappush(ends, (now + seconds[job.id], job.id, job))
        if not ends:
            break
        now = ends[0][0]
        start = time.process_time()
        while ends and ends[0][0] <= now:
            scheduler.finish(heapq.heappop(ends)[2])
        spent += time.process_time() - start
    if len(scheduler.queue):
        raise RuntimeError(f"{len(scheduler.queue)} jobs never started")
    return Dispatch(now, decisions, spent)


def bound(tests: list[tuple[str, int, float]], devices: int) -> float:
    device_seconds = sum(k * s for _, k, s in tests)
    cpu_seconds = sum(s for _, k, s in tests if k == 0)
    longest = max(s for _, _, s in tests)
    return max(device_seconds / devices, cpu_seconds / devices, longest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count")
    args = parser.parse_args()
    tests = draw(args.seed, args.scale)
    devices = NODES * PER_NODE
    inventory = Inventory(BUILTIN_PLATFORMS["sim"], tuple(range(devices)), "simulated fleet")
    estimate = {nodeid: s for nodeid, _, s in tests}
    start = time.perf_counter()
    plan = build_plan(jobs_of(tests), inventory, estimate=lambda job: estimate[job.nodeid])
    planned = time.perf_counter() - start
    seconds = {job.id: estimate[job.nodeid] for job in plan.jobs}
    result = dispatch(plan.jobs, devices, seconds)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    low = bound(tests, devices)
    rate = result.decisions / result.seconds if result.seconds else float("inf")
    counts = ", ".join(f"{n} x {k}-device" for k, n in sorted(MIX.items()))
    print(f"{len(tests)} tests ({counts}; scale {args.scale:g}), {NODES} nodes x {PER_NODE}")
    print(f"  plan: {planned:.2f} s (target < 2 s); peak RSS {rss:.0f} MB (target < 300 MB)")
    print(
        f"  dispatch: {result.decisions} decisions in {result.seconds:.2f} s of scheduler CPU "
        f"= {rate:,.0f}/s (target >= 500/s)"
    )
    ratio = result.makespan / low
    print(
        f"  makespan {result.makespan:,.0f} s against the bound {low:,.0f} s = {ratio:.3f}x "
        "(target <= 1.05x)"
    )
    print(f"devpool shard across runner classes, {SHARDS_PER_CLASS} shards each:")
    for name, size in CLASSES.items():
        # Each class runs the tests of its size (the 1-device class takes the CPU tests too).
        mine = [t for t in tests if t[1] == size or (size == 1 and t[1] == 0)]
        items = [shard_item(nodeid, Request(device_count=k), s) for nodeid, k, s in mine]
        split = split_suite([i.nodeid for i in items], items, SHARDS_PER_CLASS)
        by_id = {i.nodeid: i for i in items}
        worst = 0.0
        estimates, simulated = [], []
        for shard in split.shards:
            chosen = [by_id[n] for n in shard]
            estimates.append(wall_estimate(chosen, size))
            shard_tests = [(i.nodeid, i.device_count, i.estimate) for i in chosen]
            jobs = jobs_of(shard_tests)
            simulated.append(
                dispatch(jobs, size, {j.id: shard_tests[j.id][2] for j in jobs}).makespan
            )
            worst = max(worst, simulated[-1] / estimates[-1] if estimates[-1] else 1.0)
        print(
            f"  {name}: {len(mine)} tests; estimate {max(estimates):,.0f} s, simulated "
            f"{max(simulated):,.0f} s for the slowest shard; worst shard simulated / estimate "
            f"{worst:.3f}"
        )


if __name__ == "__main__":
    main()
