"""Controller memory and planning time for a suite of 10,000 tests.

Run: python benchmarks/scale.py [--repeat 3] [--tests 10000]

The suite: 70 % CPU-only tests, 20 % device_count(1), 7 % (2), 3 % (4), spread over
20 modules. Two measurements:

1. Whole commands under /usr/bin/time -f "%M %e" (max RSS, wall), alternating: plain
   `pytest -p no:devpool --collect-only -q` vs `pytest --devices sim:0-7 --devpool-plan`
   (plans, runs nothing) with no duration history and with a history of every test, and
   a full devpool run of the suite with no history (skip it with --no-run; --warm-run adds
   one full run with a history of every test, which takes minutes, see the README).
   pytest runs in process under a small wrapper that also reports its own peak RSS, the
   controller's alone: /usr/bin/time's %M is the largest of the process and its workers.
   The ratio devpool / collect-only is devpool's share on top of pytest's collection.
2. The planning step alone, in process: build_plan over 10,000 Jobs, then a full
   simulated scheduling pass (devpool.plan.scheduler.Scheduler + Backfill, one job per
   placement, no batching: the controller's worst case) until every job has ended.

Targets (issue 6): controller RSS < 200 MB; planning < 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import PYTEST, devpool_options, suite_root

from devpool.devices.inventory import BUILTIN_PLATFORMS, Inventory
from devpool.history.durations import History, TestResult
from devpool.plan.jobs import Job, build_plan
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill
from devpool.plan.scheduler import Scheduler, simulate

RSS_TARGET_MB = 200.0
PLAN_TARGET_S = 1.0
MODULES = 20
MIX = {0: 0.70, 1: 0.20, 2: 0.07, 4: 0.03}  # device count → share of the suite
DEVICES = tuple(range(8))

MODULE = """
import pytest

@pytest.mark.parametrize("i", range({cpu}))
def test_cpu(i):
    pass

@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range({one}))
def test_one(i):
    pass

@pytest.mark.device_count(2)
@pytest.mark.parametrize("i", range({two}))
def test_two(i):
    pass

@pytest.mark.device_count(4)
@pytest.mark.parametrize("i", range({four}))
def test_four(i):
    pass
"""
NAMES = {0: "test_cpu", 1: "test_one", 2: "test_two", 4: "test_four"}


def per_module(tests: int) -> dict[int, int]:
    """Tests of each device count in one module."""
    size = tests // MODULES
    return {k: round(size * share) for k, share in MIX.items()}


def write_suite(root: Path, tests: int) -> list[tuple[str, int]]:
    """The suite's modules under root/suite; returns (node id, device count) of every test."""
    counts = per_module(tests)
    folder = root / "suite"
    folder.mkdir()
    nodeids = []
    for m in range(MODULES):
        name = f"test_mod{m:02}.py"
        (folder / name).write_text(
            MODULE.format(cpu=counts[0], one=counts[1], two=counts[2], four=counts[4])
        )
        for k, n in counts.items():
            nodeids += [(f"suite/{name}::{NAMES[k]}[{i}]", k) for i in range(n)]
    return nodeids


def seed_history(path: Path, nodeids: list[tuple[str, int]], durations: list[float]) -> None:
    """A history with one passed result per test, as after one full run."""
    now = time.time()
    with History(path) as history:
        history.add(
            TestResult(nodeid, "passed", d, "sim", 8, "sim-8", now, "seed")
            for (nodeid, _), d in zip(nodeids, durations, strict=True)
        )


# pytest in this process, then this process's own peak RSS (without its children, the
# workers) written to $DEVPOOL_BENCH_RSS: the controller's memory alone.
CONTROLLER = """
import os, resource, sys
import pytest
code = pytest.main(sys.argv[1:])
with open(os.environ["DEVPOOL_BENCH_RSS"], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
raise SystemExit(code)
"""


@dataclass
class Measured:
    """One command's figures: /usr/bin/time's max RSS and wall, and the controller's RSS."""

    rss: float  # MB, the largest of the process and the children it waited for
    wall: float  # seconds
    controller: float  # MB, the pytest process alone


def timed_rss(args: list[str], cwd: Path) -> Measured:
    """Run `pytest ARGS` under /usr/bin/time -f "%M %e"."""
    out, own = cwd / "time.txt", cwd / "rss.txt"
    done = subprocess.run(
        ["/usr/bin/time", "-o", str(out), "-f", "%M %e", sys.executable, "-c", CONTROLLER, *args],
        cwd=cwd,
        env={**os.environ, "DEVPOOL_BENCH_RSS": str(own)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"pytest {' '.join(args)} exited {done.returncode}:\n{tail}")
    kb, wall = out.read_text().split()[-2:]
    return Measured(int(kb) / 1024, float(wall), int(own.read_text()) / 1024)


BASELINE = "pytest --collect-only -q"


def plan_args(root: Path, history: Path) -> list[str]:
    return [*PYTEST[3:], "suite", *devpool_options(root, "sim:0-7", history), "--devpool-plan"]


def run_args(root: Path, history: Path, record: Path) -> list[str]:
    devpool = devpool_options(root, "sim:0-7", history)
    return [*PYTEST[3:], "suite", *devpool, f"--devpool-run-record={record}"]


def commands(root: Path, repeat: int, full_run: bool) -> dict[str, list[Measured]]:
    cold, warm = root / "cold.sqlite", root / "warm.sqlite"
    variants = {
        # The baseline leaves devpool out entirely, so the ratio is devpool's whole share.
        # PYTEST[3:]: the wrapper runs pytest.main, so no interpreter and no -m pytest.
        BASELINE: [*PYTEST[3:], "-p", "no:devpool", "suite", "--collect-only"],
        "devpool --devpool-plan, cold": plan_args(root, cold),
        "devpool --devpool-plan, warm": plan_args(root, warm),
    }
    if full_run:
        variants["devpool full run, cold"] = run_args(root, cold, root / "cold.jsonl")
    runs: dict[str, list[Measured]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, args in variants.items():
            cold.unlink(missing_ok=True)
            runs[name].append(timed_rss(args, root))
    return runs


def workers_started(record: Path) -> dict[int, int]:
    """Worker processes a run started, by the number of devices they held."""
    pids: dict[int, set[int]] = {}
    for line in record.read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "job_start":
            pids.setdefault(len(event["devices"]), set()).add(event["worker_pid"])
    return {k: len(v) for k, v in sorted(pids.items())}


def warm_full_run(root: Path) -> None:
    """One full run with the history of every test: slow, see benchmarks/README.md."""
    ran, record = root / "ran.sqlite", root / "warm.jsonl"
    shutil.copyfile(root / "warm.sqlite", ran)
    measured = timed_rss(run_args(root, ran, record), root)
    print(
        f"  devpool full run, warm (once): controller RSS {measured.controller:.1f} MB, "
        f"max RSS {measured.rss:.1f} MB, wall {measured.wall:.2f} s; "
        f"workers started by device count: {workers_started(record)}"
    )


def spread(values: list[float], fmt: str) -> str:
    median = format(statistics.median(values), fmt)
    return f"{median} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def planning(nodeids: list[tuple[str, int]], durations: list[float]) -> dict[str, float]:
    """Seconds to build the Jobs, to build_plan them, and to schedule them all to the end."""
    inventory = Inventory(BUILTIN_PLATFORMS["sim"], DEVICES, "benchmark")
    estimates = {nodeid: d for (nodeid, _), d in zip(nodeids, durations, strict=True)}
    start = time.perf_counter()
    jobs = [
        Job(i, nodeid, (nodeid, i, nodeid), Request(device_count=k), i)
        for i, (nodeid, k) in enumerate(nodeids)
    ]
    built = time.perf_counter()
    plan = build_plan(jobs, inventory, estimate=lambda job: estimates[job.nodeid])
    planned = time.perf_counter()
    scheduler = Scheduler(DEVICES, Backfill(), max_parallel=len(DEVICES), cpu_slots=2)
    simulate(scheduler, plan.jobs, lambda job: durations[job.id])
    scheduled = time.perf_counter()
    return {
        "Job objects": built - start,
        "build_plan": planned - built,
        "scheduling pass": scheduled - planned,
        "planning (build_plan + pass)": scheduled - built,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tests", type=int, default=10_000)
    parser.add_argument(
        "--no-run", action="store_true", help="skip the full cold run of the suite (about 20 s)"
    )
    parser.add_argument(
        "--warm-run",
        action="store_true",
        help="add one full run with a complete duration history (minutes: workers thrash)",
    )
    args = parser.parse_args()
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="devpool-scale-") as tmp:
        root = suite_root(Path(tmp), {})
        nodeids = write_suite(root, args.tests)
        durations = [0.05 * rng.lognormvariate(0.0, 1.0) for _ in nodeids]
        seed_history(root / "warm.sqlite", nodeids, durations)
        mix = ", ".join(f"{k} devices: {n * MODULES}" for k, n in per_module(args.tests).items())
        print(f"{len(nodeids)} tests ({mix}); sim:0-7; {args.repeat} alternating runs\n")

        runs = commands(root, args.repeat, not args.no_run)
        print("1. whole commands: median (min–max)")
        head = f"  {'command':<30} {'controller RSS MB':>22} {'max RSS MB (time)':>22}"
        print(f"{head} {'wall s':>20}")
        for name, measured in runs.items():
            controller = spread([m.controller for m in measured], ".1f")
            rss = spread([m.rss for m in measured], ".1f")
            wall = spread([m.wall for m in measured], ".2f")
            print(f"  {name:<30} {controller:>22} {rss:>22} {wall:>20}")
        base_rss = statistics.median(m.controller for m in runs[BASELINE])
        base_wall = statistics.median(m.wall for m in runs[BASELINE])
        for name in list(runs)[1:]:
            rss = statistics.median(m.controller for m in runs[name])
            wall = statistics.median(m.wall for m in runs[name])
            verdict = "met" if rss < RSS_TARGET_MB else f"MISSED by {rss - RSS_TARGET_MB:.0f} MB"
            print(
                f"  {name}: controller RSS {rss / base_rss:.2f}x collect-only "
                f"(+{rss - base_rss:.1f} MB), wall {wall / base_wall:.2f}x "
                f"(+{wall - base_wall:.2f} s); target RSS < {RSS_TARGET_MB:.0f} MB: {verdict}"
            )
        if not args.no_run:
            started = workers_started(root / "cold.jsonl")
            print(f"  devpool full run, cold: workers started by device count: {started}")
        if args.warm_run:
            warm_full_run(root)

        print("\n2. planning in process: median (min–max) seconds")
        steps: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for step, seconds in planning(nodeids, durations).items():
                steps.setdefault(step, []).append(seconds)
        for step, values in steps.items():
            print(f"  {step:<30} {spread(values, '.3f')}")
        total = statistics.median(steps["planning (build_plan + pass)"])
        verdict = "met" if total < PLAN_TARGET_S else f"MISSED by {total - PLAN_TARGET_S:.2f} s"
        print(f"  target planning < {PLAN_TARGET_S:.0f} s: {verdict}")


if __name__ == "__main__":
    main()
