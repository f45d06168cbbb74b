"""Wall-clock overhead of a devpool run against plain pytest (and pytest-xdist), per test.

Run: python benchmarks/overhead.py [--repeat 3] [--tests 200]

(a) 200 trivial 1-device tests: plain in-process pytest vs --devices sim:0-7.
(b) 200 CPU-only tests of 50 ms each: plain pytest vs pytest -n 2 vs devpool.
Commands alternate within each repetition so that drift in machine load hits all alike;
each figure is the median of the repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEVICE_SUITE = """
import pytest

@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range({n}))
def test_trivial(i):
    assert i >= 0
"""

CPU_SUITE = """
import time

import pytest

@pytest.mark.parametrize("i", range({n}))
def test_sleeps(i):
    time.sleep(0.05)
"""


def timed(argv: list[str], cwd: Path) -> float:
    """Seconds one pytest command takes; raises if it does not pass."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}")
    return elapsed


def compare(commands: dict[str, list[str]], cwd: Path, repeat: int) -> dict[str, float]:
    """Median seconds of each command, run alternately `repeat` times."""
    runs: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, argv in commands.items():
            runs[name].append(timed(argv, cwd))
    for name, seconds in runs.items():
        shown = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"  {name:<28} median {statistics.median(seconds):6.2f} s   runs: {shown}")
    return {name: statistics.median(seconds) for name, seconds in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tests", type=int, default=200)
    args = parser.parse_args()
    n = args.tests
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    with tempfile.TemporaryDirectory(prefix="devpool-overhead-") as tmp:
        root = Path(tmp)
        # An empty ini file makes the temp folder the rootdir: no outer config leaks in.
        (root / "pytest.ini").write_text("[pytest]\n")
        (root / "test_devices.py").write_text(DEVICE_SUITE.format(n=n))
        (root / "test_cpu.py").write_text(CPU_SUITE.format(n=n))
        devpool = ["--devices", "sim:0-7", "--devpool-lock-dir", str(root / "locks")]

        print(f"(a) {n} trivial 1-device tests")
        a = compare(
            {
                "plain pytest": [*pytest_argv, "test_devices.py"],
                "devpool --devices sim:0-7": [*pytest_argv, "test_devices.py", *devpool],
            },
            root,
            args.repeat,
        )
        extra = a["devpool --devices sim:0-7"] - a["plain pytest"]
        ratio = a["devpool --devices sim:0-7"] / a["plain pytest"]
        print(f"  devpool / plain = {ratio:.2f}x; overhead {1000 * extra / n:.1f} ms per test")

        print(f"\n(b) {n} CPU-only tests of 50 ms")
        b = compare(
            {
                "plain pytest": [*pytest_argv, "test_cpu.py"],
                "pytest -n 2 (xdist)": [*pytest_argv, "test_cpu.py", "-n", "2"],
                "devpool, cpu-slots 2": [
                    *pytest_argv,
                    "test_cpu.py",
                    *devpool,
                    "--devpool-cpu-slots",
                    "2",
                ],
            },
            root,
            args.repeat,
        )
        ideal = n * 0.05 / 2
        for name in ("pytest -n 2 (xdist)", "devpool, cpu-slots 2"):
            seconds = b[name]
            print(
                f"  {name:<28} {b['plain pytest'] / seconds:.2f}x faster than plain; "
                f"{1000 * (seconds - ideal) / n:.1f} ms per test above the ideal {ideal:.1f} s"
            )
        print(f"  devpool / xdist = {b['devpool, cpu-slots 2'] / b['pytest -n 2 (xdist)']:.2f}x")


if __name__ == "__main__":
    main()
