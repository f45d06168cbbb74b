"""Regression guard for benchmarks/: bounds on ratios measured side by side.

Never absolute times (CI machines are shared and noisy); the figures themselves live in
benchmarks/README.md. The xdist guard takes 30-60 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from devpool.devices.inventory import BUILTIN_PLATFORMS, Inventory
from devpool.plan.jobs import Job, build_plan
from devpool.plan.markers import Request
from devpool.plan.policies import Backfill, Fifo
from devpool.plan.scheduler import Scheduler, simulate

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
PYTEST = [sys.executable, "-m", "pytest", "-q"]
PYTEST += ["-p", "no:hypothesispytest", "-p", "no:benchmark", "-p", "no:cacheprovider"]


def load_makespan() -> ModuleType:
    spec = importlib.util.spec_from_file_location("makespan", BENCHMARKS / "makespan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["makespan"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def load_pairs() -> ModuleType:
    """benchmarks/xdist_pairs.py, with its sibling modules (common, cpu_suites) importable."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("xdist_pairs", BENCHMARKS / "xdist_pairs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["xdist_pairs"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


GUARD_RATIO = 1.0  # devpool / pytest -n 2 on the 20-module suite (issue 12; target 0.9)
PAIRS = 3  # paired runs, alternating devpool and xdist
EXTRA_PAIRS = 4  # more pairs when the first ones say "over", before failing
# Seconds: no extra pairs after this. On a slow CI host three pairs take ~50 s; a CI run once
# failed on pairs of 0.86-1.10x with no extra pairs drawn, so the extra ones must still come.
TIME_FOR_EXTRA = 90.0


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="needs pytest-xdist")
def test_devpool_stays_faster_than_xdist_on_20_modules(tmp_path: Path) -> None:
    """Paired runs, alternating A B A B, of 2,000 trivial tests in 20 modules: the median of
    the per-pair ratios devpool / pytest -n 2 must stay at or below 1.0.

    A benchmark guard, not a timed test: no absolute time is asserted, and load from other
    jobs hits both sides of a pair alike. When the first pairs say "over", a few more
    decide (within the time budget), so one slow pair cannot fail it alone."""
    pairs = load_pairs()
    title, files = pairs.SUITES["modules20"]
    root = pairs.suite_root(tmp_path, files)
    started = time.perf_counter()
    result = pairs.run_pairs(root, PAIRS, verbose=False)
    if result.ratio > GUARD_RATIO and time.perf_counter() - started < TIME_FOR_EXTRA:
        result = pairs.run_pairs(root, EXTRA_PAIRS, verbose=False, result=result)
    assert result.ratio <= GUARD_RATIO, f"{title}: {result.describe()}"


def test_backfill_makespan_near_bound_and_not_worse_than_fifo() -> None:
    makespan = load_makespan()
    tests = makespan.mixed(random.Random(1))
    bound = makespan.lower_bound(tests)
    backfill = makespan.makespan(Backfill(), tests, lambda t: t.duration)
    fifo = makespan.makespan(Fifo(), tests, lambda t: t.duration)
    assert backfill <= 1.25 * bound, (backfill, bound)
    assert backfill <= fifo, (backfill, fifo)


def test_planning_10000_jobs_is_fast() -> None:
    rng = random.Random(1)
    sizes = rng.choices([0, 1, 2, 4], weights=[70, 20, 7, 3], k=10_000)
    durations = [0.05 * rng.lognormvariate(0.0, 1.0) for _ in sizes]
    devices = tuple(range(8))
    start = time.perf_counter()
    jobs = [
        Job(i, f"t.py::test[{i}]", ("t.py", i, "test"), Request(device_count=k), i)
        for i, k in enumerate(sizes)
    ]
    plan = build_plan(
        jobs,
        Inventory(BUILTIN_PLATFORMS["sim"], devices, "guard"),
        estimate=lambda job: durations[job.id],
    )
    scheduler = Scheduler(devices, Backfill(), max_parallel=8, cpu_slots=2)
    simulate(scheduler, plan.jobs, lambda job: durations[job.id])
    elapsed = time.perf_counter() - start
    assert scheduler.idle
    assert elapsed < 10.0, f"planning 10,000 jobs took {elapsed:.1f} s"
