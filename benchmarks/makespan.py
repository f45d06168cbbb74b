"""Makespan of the real Backfill and Fifo policies on sim:0-7, by discrete-event simulation.

Run: python benchmarks/makespan.py [--seed N]

Each workload is a seeded random suite of 1/2/4/8-device tests with log-normal durations,
all collected at t=0. The simulator drives devpool.plan.scheduler.Scheduler exactly as the
controller does (add, schedule, finish); no process starts and no real time passes.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass

from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill, Fifo
from devpool.plan.scheduler import Policy, Scheduler, simulate

DEVICES = tuple(range(8))
TARGET = 1.10  # backfill makespan ≤ 1.10 × lower bound (issue target)
TIE = 1e-9  # relative difference below which two makespans are the same


@dataclass(frozen=True)
class Test:
    """One synthetic test: how many devices it needs and how long it truly runs."""

    devices: int
    duration: float


def lognormal(rng: random.Random, median: float, sigma: float = 1.0) -> float:
    return median * rng.lognormvariate(0.0, sigma)


def mixed(rng: random.Random) -> list[Test]:
    """200 tests, mostly small, sizes 1/2/4/8 in 50/25/15/10 %, skewed durations."""
    sizes = rng.choices([1, 2, 4, 8], weights=[50, 25, 15, 10], k=200)
    return [Test(k, lognormal(rng, 2.0)) for k in sizes]


def small_then_late_big(rng: random.Random) -> list[Test]:
    """300 one-device tests, then six 8-device tests at the end of collection order."""
    small = [Test(1, lognormal(rng, 1.5)) for _ in range(300)]
    return small + [Test(8, lognormal(rng, 8.0, sigma=0.5)) for _ in range(6)]


def mid_sized(rng: random.Random) -> list[Test]:
    """150 tests dominated by 2- and 4-device ones (45/45 %), a few 1s and 8s."""
    sizes = rng.choices([1, 2, 4, 8], weights=[5, 45, 45, 5], k=150)
    return [Test(k, lognormal(rng, 3.0)) for k in sizes]


WORKLOADS: dict[str, Callable[[random.Random], list[Test]]] = {
    "mixed 1/2/4/8": mixed,
    "small + late 8s": small_then_late_big,
    "2/4-dominated": mid_sized,
}


def jobs_for(tests: list[Test], estimate: Callable[[Test], float]) -> list[Job]:
    return [
        Job(
            id=i,
            nodeid=f"bench.py::test_{i}",
            location=("bench.py", i, f"test_{i}"),
            request=Request(device_count=t.devices),
            index=i,
            estimate=estimate(t),
        )
        for i, t in enumerate(tests)
    ]


def makespan(policy: Policy, tests: list[Test], estimate: Callable[[Test], float]) -> float:
    """Time at which the last test ends when `policy` places every test from t=0."""
    scheduler = Scheduler(DEVICES, policy, max_parallel=len(DEVICES), cpu_slots=2)
    return simulate(scheduler, jobs_for(tests, estimate), lambda job: tests[job.id].duration)


def lower_bound(tests: list[Test]) -> float:
    work = sum(t.devices * t.duration for t in tests)
    return max(work / len(DEVICES), max(t.duration for t in tests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    seed = parser.parse_args().seed
    estimates: dict[str, Callable[[Test], float]] = {
        "estimate = true duration": lambda t: t.duration,
        "estimate = 1.0 s (no history)": lambda t: 1.0,
    }
    print(f"sim:0-7, max-parallel 8, seed {seed}; makespans in simulated seconds")
    header = f"{'workload':<17} {'jobs':>4} {'bound':>8} {'backfill':>9} {'ratio':>6}"
    header += f" {'fifo':>9} {'ratio':>6}  target"
    missed = 0
    for label, estimate in estimates.items():
        print(f"\n{label}")
        print(header)
        for name, make in WORKLOADS.items():
            tests = make(random.Random(seed))
            bound = lower_bound(tests)
            backfill = makespan(Backfill(), tests, estimate)
            fifo = makespan(Fifo(), tests, estimate)
            # A tie is not "better": equal makespans can differ in the last bits of a float.
            within, beats = backfill <= TARGET * bound, backfill < fifo * (1 - TIE)
            missed += not (within and beats)
            verdict = "met" if within and beats else "MISSED: "
            if not within:
                verdict += f"> {TARGET:.2f}x bound "
            if not beats:
                verdict += "not below FIFO"
            print(
                f"{name:<17} {len(tests):>4} {bound:>8.1f} {backfill:>9.1f} "
                f"{backfill / bound:>6.3f} {fifo:>9.1f} {fifo / bound:>6.3f}  {verdict}"
            )
    print(f"\ntarget: backfill ≤ {TARGET:.2f} × bound and below FIFO; missed in {missed} rows")


if __name__ == "__main__":
    main()
