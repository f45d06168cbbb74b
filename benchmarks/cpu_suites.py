"""CPU-only suites: devpool (cold and warm history) vs pytest -n 2 (xdist) vs plain pytest.

Run: python benchmarks/cpu_suites.py [--repeat 3] [--suite trivial|sleep50|modules20|all]

(a) 2,000 trivial tests; (b) 200 tests of 50 ms each; (c) 2,000 trivial tests in 20
modules of 100 (the shape of a real suite: many modules, issue 12). devpool runs with
--devices sim:0-1 and --devpool-cpu-slots 2 (two CPU workers, as -n 2), once with no
duration history ("cold": the history file is deleted before each run) and once with the
history of the previous runs ("warm": primed by one untimed run). All commands alternate
within each repetition; figures are medians, with the min–max range. Target (issue 6):
devpool at most 1.0x the wall time of pytest -n 2.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root, timed

TARGET = 1.0

MODULE_OF_100 = """
import pytest

@pytest.mark.parametrize("i", range(100))
def test_trivial(i):
    assert i >= 0
"""

FAILING_MODULE_OF_100 = """
import pytest

@pytest.mark.parametrize("i", range(100))
def test_trivial(i):
    assert i % 10 >= 3
"""

# suite → (title, {file name: text}); each suite lives in its own folder
SUITES: dict[str, tuple[str, dict[str, str]]] = {
    "trivial": (
        "(a) 2,000 trivial CPU-only tests",
        {
            "test_trivial.py": """
import pytest

@pytest.mark.parametrize("i", range(2000))
def test_trivial(i):
    assert i >= 0
"""
        },
    ),
    "sleep50": (
        "(b) 200 CPU-only tests of 50 ms",
        {
            "test_sleep50.py": """
import time

import pytest

@pytest.mark.parametrize("i", range(200))
def test_sleeps(i):
    time.sleep(0.05)
"""
        },
    ),
    "modules20": (
        "(c) 2,000 trivial CPU-only tests in 20 modules of 100",
        {f"test_m{m:02d}.py": MODULE_OF_100 for m in range(1, 21)},
    ),
    # A PR that breaks things (issue 19): every failure used to cost a fresh worker.
    "failing30": (
        "(d) 2,000 trivial CPU-only tests in 20 modules of 100, 30% of them failing",
        {f"test_f{m:02d}.py": FAILING_MODULE_OF_100 for m in range(1, 21)},
    ),
}


def measure(root: Path, title: str, repeat: int) -> list[str]:
    """Time the four variants on one suite folder; print them; return the ratio lines."""
    cold = root / "cold.sqlite"
    warm = root / "warm.sqlite"
    cpu = ["--devpool-cpu-slots", "2"]
    devpool_cold = [*PYTEST, *devpool_options(root, "sim:0-1", cold), *cpu]
    devpool_warm = [*PYTEST, *devpool_options(root, "sim:0-1", warm), *cpu]
    timed(devpool_warm, root)  # primes the warm history; not counted
    variants = [
        Variant("plain pytest", [*PYTEST]),
        Variant("pytest -n 2", [*PYTEST, "-n", "2"]),
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
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    args = parser.parse_args()
    chosen = list(SUITES) if args.suite == "all" else [args.suite]
    with tempfile.TemporaryDirectory(prefix="devpool-cpu-") as tmp:
        summary = []
        for key in chosen:
            title, files = SUITES[key]
            (Path(tmp) / key).mkdir()
            root = suite_root(Path(tmp) / key, files)
            summary += [title, *measure(root, title, args.repeat)]
    print(f"summary (medians of {args.repeat} alternating runs)")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
