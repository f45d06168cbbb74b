"""Concurrent runs on one host (issue 27): N sessions started at once on one lock folder.

Each session runs the same suite of short tests on `--devices sim:0-7`: 69% one-device, 23%
two-device and 8% four-device tests (the mix of issue 27: 120/40/15 of 175), bodies of
about 20 ms. A trial starts the sessions together and waits for all of them; a session is
green when it exits 0 with every test passed. Before the trials, one session runs alone on
the same devices: the total wall of a trial is compared with that wall × sessions (the
devices are shared, so N sessions cannot beat N times one).

    python benchmarks/concurrent.py [--tests 500] [--sessions 4] [--trials 20] [--load]

--load starts two busy processes per core for the whole benchmark (a loaded CI host).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PYTEST, suite_root

SUITE = """
import time

import pytest


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range({one}))
def test_one(i):
    time.sleep(0.02)


@pytest.mark.device_count(2)
@pytest.mark.parametrize("i", range({two}))
def test_two(i):
    time.sleep(0.02)


@pytest.mark.device_count(4)
@pytest.mark.parametrize("i", range({four}))
def test_four(i):
    time.sleep(0.02)
"""


def _busy() -> None:
    while True:
        pass


def trial(root: Path, sessions: int, tests: int, k: int) -> tuple[float, list[str]]:
    """Start `sessions` sessions together; the wall until the last ends, and each one's
    closing line (empty where it was green)."""
    lock = root / f"locks{k}"
    lock.mkdir()
    env = {n: v for n, v in os.environ.items() if not n.startswith(("DEVPOOL_", "PYTEST_"))}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                *PYTEST,
                "--devices",
                "sim:0-7",
                f"--devpool-lock-dir={lock}",
                f"--devpool-run-dir={root / f'run{k}-{s}'}",
                f"--devpool-history={root / f'history{k}-{s}.sqlite'}",
            ],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for s in range(sessions)
    ]
    outputs = [proc.communicate()[0] for proc in procs]
    wall = time.perf_counter() - start
    bad = []
    for proc, output in zip(procs, outputs, strict=True):
        lines = [line for line in output.splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        green = proc.returncode == 0 and f"{tests} passed" in last
        bad.append("" if green else last)
    return wall, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--load", action="store_true", help="two busy processes per core")
    args = parser.parse_args()
    one = round(args.tests * 120 / 175)
    two = round(args.tests * 40 / 175)
    four = args.tests - one - two
    busy = []
    if args.load:
        busy = [
            multiprocessing.Process(target=_busy, daemon=True) for _ in range(2 * os.cpu_count())
        ]  # type: ignore[operator]
        for process in busy:
            process.start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            root = suite_root(
                Path(folder), {"test_mix.py": SUITE.format(one=one, two=two, four=four)}
            )
            alone, bad = trial(root, 1, args.tests, -1)
            assert not bad[0], bad[0]
            print(
                f"{args.sessions} sessions × {args.tests} tests ({one}×1, {two}×2, {four}×4 "
                f"devices), {args.trials} trials{', loaded' if args.load else ''}; "
                f"one session alone: {alone:.1f} s"
            )
            walls, green, failures = [], 0, []
            for k in range(args.trials):
                wall, bad = trial(root, args.sessions, args.tests, k)
                walls.append(wall)
                green += sum(1 for line in bad if not line)
                failures += [line for line in bad if line]
                print(f"  trial {k + 1}: {wall:.1f} s, {sum(not b for b in bad)} green", flush=True)
    finally:
        for process in busy:
            process.kill()
    total = args.sessions * args.trials
    median = statistics.median(walls)
    print(f"green sessions: {green} of {total} (target: all)")
    for line in failures:
        print(f"  not green: {line}")
    print(
        f"trial wall: median {median:.1f} s (range {min(walls):.1f}–{max(walls):.1f}); "
        f"against one session × {args.sessions} = {alone * args.sessions:.1f} s: "
        f"{median / (alone * args.sessions):.2f}x"
    )
    sys.exit(0 if green == total else 1)


if __name__ == "__main__":
    main()
