"""Makespan when small tests share devices by declared memory, by discrete-event simulation.

Run: python benchmarks/memory_makespan.py [--seed N] [--jobs N] [--devices N]

The workload (seeded): N jobs on D devices of 80 GiB (76 GiB handed out after the default
5 % reserve). 85 % are one-device `device_memory` jobs declaring 1, 2, 4, 8 or 16 GiB
(weights 30/30/20/15/5) lasting a log-normal 2 s median; 15 % are whole-device jobs of 1,
2 or 4 devices (weights 50/30/20) lasting a log-normal 6 s median. Every job is collected
at t=0 and its estimate is its true duration (a full history).

Three figures, in simulated seconds (no process starts, no real time passes):
  sharing       devpool's Backfill with the devices' capacity: memory jobs pack by memory;
  whole only    the same jobs with no capacity known, so every job holds whole devices;
  lower bound   max(memory-aware device-seconds / D, longest job), where a memory job
                counts declared / capacity of a device and a whole job its devices.
max-parallel is 16 per device, so worker slots never limit the sharing run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devpool.plan.jobs import Job
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill
from devpool.plan.scheduler import Scheduler, simulate

GiB = 2**30
TOTAL = 80 * GiB
CAPACITY = int(TOTAL * 0.95)  # memory-reserve 5 %, the default
SMALL_SHARE = 0.85
SMALL_SIZES, SMALL_WEIGHTS = (1, 2, 4, 8, 16), (30, 30, 20, 15, 5)
WHOLE_SIZES, WHOLE_WEIGHTS = (1, 2, 4), (50, 30, 20)


@dataclass(frozen=True)
class Synthetic:
    """One job: its devices, declared memory per device (None: whole devices), seconds."""

    devices: int
    memory: int | None
    duration: float


def workload(rng: random.Random, count: int) -> list[Synthetic]:
    """The mix described in the module docstring."""
    jobs = []
    for _ in range(count):
        if rng.random() < SMALL_SHARE:
            size = rng.choices(SMALL_SIZES, SMALL_WEIGHTS)[0] * GiB
            jobs.append(Synthetic(1, size, 2.0 * rng.lognormvariate(0.0, 0.8)))
        else:
            devices = rng.choices(WHOLE_SIZES, WHOLE_WEIGHTS)[0]
            jobs.append(Synthetic(devices, None, 6.0 * rng.lognormvariate(0.0, 0.8)))
    return jobs


def makespan(jobs: list[Synthetic], devices: int, share: bool) -> float:
    """Backfill's makespan; share=False: no capacity known, memory jobs hold whole devices."""
    ids = tuple(range(devices))
    capacity = dict.fromkeys(ids, CAPACITY) if share else None
    scheduler = Scheduler(ids, Backfill(), 16 * devices, 2, capacity=capacity)
    placed = [
        Job(
            i,
            f"bench.py::test_{i}",
            ("bench.py", i, f"test_{i}"),
            Request(device_count=j.devices, device_memory=j.memory),
            i,
            estimate=j.duration,
        )
        for i, j in enumerate(jobs)
    ]
    return simulate(scheduler, placed)


def lower_bound(jobs: list[Synthetic], devices: int) -> float:
    """max(memory-aware device-seconds / devices, longest job)."""
    work = sum(
        (j.memory / CAPACITY if j.memory is not None else j.devices) * j.duration for j in jobs
    )
    return max(work / devices, max(j.duration for j in jobs))


def _machine() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).resolve().parent,
        capture_output=True,
        text=True,
    ).stdout.strip()
    cores = os.cpu_count()
    return (
        f"{platform.node()}, {platform.machine()}, {cores} cores, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, commit {commit or '?'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    jobs = workload(random.Random(args.seed), args.jobs)
    small = sum(j.memory is not None for j in jobs)
    bound = lower_bound(jobs, args.devices)
    shared = makespan(jobs, args.devices, share=True)
    whole = makespan(jobs, args.devices, share=False)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{now}; {_machine()}")
    print(
        f"{args.devices} devices of 80 GiB ({CAPACITY / GiB:.0f} GiB handed out), "
        f"seed {args.seed}: {len(jobs)} jobs, {small} memory jobs, "
        f"{len(jobs) - small} whole-device jobs"
    )
    print(f"  lower bound (memory-aware)  {bound:8.1f} s")
    print(f"  sharing by memory           {shared:8.1f} s  {shared / bound:.3f} x bound")
    print(f"  whole devices only          {whole:8.1f} s  {whole / bound:.3f} x bound")
    print(f"  sharing saves {1 - shared / whole:.1%} of the whole-device makespan")


if __name__ == "__main__":
    main()
