"""CPU-only suites: devpool (cold and warm history) vs pytest -n 2 (xdist) vs plain pytest.

Run: python benchmarks/cpu_suites.py [--repeat 3] [--suite trivial|sleep50|both]

(a) 2,000 trivial tests; (b) 200 tests of 50 ms each. devpool runs with --devices sim:0-1
and --devpool-cpu-slots 2 (two CPU workers, as -n 2), once with no duration history
("cold": the history file is deleted before each run) and once with the history of the
previous runs ("warm": primed by one untimed run). All commands alternate within each
repetition; figures are medians, with the min–max range. Target (issue 6): devpool at most
1.0x the wall time of pytest -n 2.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root, timed

TARGET = 1.0

SUITES = {
    "trivial": (
        "(a) 2,000 trivial CPU-only tests",
        "test_trivial.py",
        """
import pytest

@pytest.mark.parametrize("i", range(2000))
def test_trivial(i):
    assert i >= 0
""",
    ),
    "sleep50": (
        "(b) 200 CPU-only tests of 50 ms",
        "test_sleep50.py",
        """
import time

import pytest

@pytest.mark.parametrize("i", range(200))
def test_sleeps(i):
    time.sleep(0.05)
""",
    ),
}


def measure(root: Path, title: str, test_file: str, repeat: int) -> list[str]:
    """Time the four variants on one suite; print them; return the ratio lines."""
    cold = root / f"{test_file}.cold.sqlite"
    warm = root / f"{test_file}.warm.sqlite"
    cpu = ["--devpool-cpu-slots", "2"]
    devpool_cold = [*PYTEST, test_file, *devpool_options(root, "sim:0-1", cold), *cpu]
    devpool_warm = [*PYTEST, test_file, *devpool_options(root, "sim:0-1", warm), *cpu]
    timed(devpool_warm, root)  # primes the warm history; not counted
    variants = [
        Variant("plain pytest", [*PYTEST, test_file]),
        Variant("pytest -n 2", [*PYTEST, test_file, "-n", "2"]),
        Variant("devpool cold", devpool_cold, prepare=lambda: cold.unlink(missing_ok=True)),
        Variant("devpool warm", devpool_warm),
    ]
    print(title)
    alternate(variants, root, repeat)
    plain, xdist, dp_cold, dp_warm = variants
    lines = [
        show_ratio(xdist, plain),
        show_ratio(dp_cold, xdist, TARGET),
        show_ratio(dp_warm, xdist, TARGET),
        show_ratio(dp_warm, plain),
    ]
    for line in lines:
        print(line)
    print()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--suite", choices=["trivial", "sleep50", "both"], default="both")
    args = parser.parse_args()
    chosen = list(SUITES) if args.suite == "both" else [args.suite]
    with tempfile.TemporaryDirectory(prefix="devpool-cpu-") as tmp:
        root = suite_root(Path(tmp), {SUITES[k][1]: SUITES[k][2] for k in chosen})
        summary = []
        for key in chosen:
            title, test_file, _ = SUITES[key]
            summary += [title, *measure(root, title, test_file, args.repeat)]
    print(f"summary (medians of {args.repeat} alternating runs)")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
