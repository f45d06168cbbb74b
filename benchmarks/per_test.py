"""The per-test cost (issue 45): 2,000 trivial tests in 20 modules, devpool against plain pytest.

Run: python benchmarks/per_test.py [--repeat 5] [--modules 20] [--tests-per-module 100]
          [--isolation job] [--devpool-src PATH] [--leaks-off]

Plain pytest and devpool (`--devices auto`, as a user runs it: on a host without devices,
CPU workers as many as the cores) alternate within each repetition, so drift in machine
load hits both alike; figures are medians with the range, CPU is the whole process tree's
(user + system). For devpool the run record also gives the controller's own CPU and the
test phase (first test started to last test ended). `--isolation job` adds devpool with
`--devpool-isolation=job` (a process forked from a warm template for each test), against the
default mode; `--devpool-src PATH` adds another devpool tree (e.g. an older checkout's src),
for before/after figures; `--leaks-off` adds devpool with `--devpool-leaks=off`: the cost of
looking after each test for what it left behind (issue 52: at most 2% per test).
The load average is printed at the start and the end: this host is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root
from cpu_suites import MODULE_OF_100

TARGET = 0.9  # devpool / plain pytest on the trivial suite


def _record_figures(root: Path) -> tuple[float, float] | None:
    """The last run's controller CPU and test phase, from its run record."""
    records = sorted(root.glob(".devpool/runs/*/record.jsonl"), key=os.path.getmtime)
    if not records:
        return None
    starts, ends, cpu = [], [], None
    for line in records[-1].read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event["type"] == "job_start":
            starts.append(event["time"])
        elif event["type"] == "job_end":
            ends.append(event["time"])
        elif event["type"] == "session_end":
            cpu = event.get("controller_cpu")
    if not starts or not ends or cpu is None:
        return None
    return float(cpu), max(ends) - min(starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--modules", type=int, default=20)
    parser.add_argument("--tests-per-module", type=int, default=100)
    parser.add_argument("--isolation", default=None, help="--devpool-isolation for devpool")
    parser.add_argument("--devpool-src", type=Path, default=None, help="a second devpool tree")
    parser.add_argument("--leaks-off", action="store_true", help="also devpool without checks")
    args = parser.parse_args()
    module = MODULE_OF_100.replace("range(100)", f"range({args.tests_per_module})")
    print(f"load average at the start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="devpool-per-test-") as tmp:
        root = suite_root(Path(tmp), {f"test_m{m:02d}.py": module for m in range(args.modules)})
        history = root / "history.sqlite"
        devpool = [*PYTEST, *devpool_options(root, "auto", history)]
        figures: list[tuple[float, float]] = []

        def note() -> None:
            found = _record_figures(root)
            if found is not None:
                figures.append(found)

        ours = Variant("devpool --devices auto", devpool, after=note)
        variants = [Variant("plain pytest", [*PYTEST]), ours]
        isolated = None
        if args.isolation:
            option = f"--devpool-isolation={args.isolation}"
            isolated = Variant(f"devpool {option}", [*devpool, option])
            variants.append(isolated)
        unchecked = None
        if args.leaks_off:
            unchecked = Variant("devpool --devpool-leaks=off", [*devpool, "--devpool-leaks=off"])
            variants.append(unchecked)
        other = None
        if args.devpool_src is not None:
            src = str(args.devpool_src.resolve())
            other = Variant("devpool (other tree)", devpool, env={"PYTHONPATH": src})
            variants.append(other)
        alternate([Variant("history", devpool)], root, 1)  # the duration history; not counted
        alternate(variants, root, args.repeat)
        print(show_ratio(ours, variants[0], TARGET))
        if isolated is not None:
            print(show_ratio(isolated, ours, 1.5))
        if other is not None:
            print(show_ratio(other, variants[0]))
        if unchecked is not None:
            print(show_ratio(ours, unchecked, 1.02))  # the leak checks' cost
        if figures:
            cpu = statistics.median(c for c, _ in figures)
            phase = statistics.median(p for _, p in figures)
            print(f"  devpool: controller CPU median {cpu:.2f} s; test phase median {phase:.2f} s")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
