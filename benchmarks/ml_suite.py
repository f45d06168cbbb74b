"""An ML-shaped sim suite against its lower bound (issue 28): devices run tests, not start-ups.

The suite: a framework whose import costs IMPORT seconds in every process that imports it
(the conftest imports it, as a torch-based project's conftest does: a sleep plus a little
CPU); 200 one-device, 20 two-device, 8 four-device and 4 eight-device tests that hold their
devices for a while; 100 CPU tests. 177 device-seconds on sim:0-7.

Lower bound: max(device-seconds / 8, longest test) + one import (the controller's own
collection). devpool runs warm (the duration history of an untimed first run), side by side
with plain pytest (serial, for scale). Printed: wall / bound, and from the run record the
share of leased device time in which tests ran.

    python benchmarks/ml_suite.py [--import-seconds 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, suite_root, timed

FRAMEWORK = """
import time

_start = time.monotonic()
time.sleep({seconds} * 0.8)  # reading and mapping shared libraries
while time.monotonic() - _start < {seconds}:  # and some Python-level set-up
    pass
"""

CONFTEST = "import framework  # noqa: F401\n"

DEVICE_MODULE = """
import time

import pytest


@pytest.mark.device_count({k})
@pytest.mark.parametrize("i", range({count}))
def test_{name}(i):
    time.sleep({seconds})
"""

CPU_MODULE = """
import pytest


@pytest.mark.parametrize("i", range(100))
def test_cpu(i):
    assert sum(range(1000)) > 0
"""

# (devices, tests, seconds each): 120 + 28 + 16 + 12.8 = 176.8 device-seconds.
SHAPE = [(1, 200, 0.6), (2, 20, 0.7), (4, 8, 0.5), (8, 4, 0.4)]


def files(import_seconds: float) -> dict[str, str]:
    out = {
        "framework.py": FRAMEWORK.format(seconds=import_seconds),
        "conftest.py": CONFTEST,
        "test_cpu.py": CPU_MODULE,
    }
    for k, count, seconds in SHAPE:
        out[f"test_dev{k}.py"] = DEVICE_MODULE.format(
            k=k, count=count, seconds=seconds, name=f"dev{k}"
        )
    return out


def lease_to_start(record: Path) -> list[float]:
    """Seconds from each lease to the first line of its first test, from the run record."""
    import json

    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return [e["lease_to_start"] for e in lines if "lease_to_start" in e]


def utilisation(record: Path) -> tuple[float, float]:
    """Device-seconds held by jobs, and the device-seconds tests ran, as reports count them."""
    from devpool.report.record import read_record
    from devpool.report.summary import device_use

    uses = device_use(read_record(record))
    return sum(u.busy for u in uses), sum(u.tested for u in uses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--import-seconds", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-plain", action="store_true", help="skip the serial plain run")
    args = parser.parse_args()
    device_seconds = sum(k * n * s for k, n, s in SHAPE)
    longest = max(s for _, _, s in SHAPE)
    bound = max(device_seconds / 8, longest) + args.import_seconds
    with tempfile.TemporaryDirectory(prefix="devpool-ml-") as tmp:
        root = suite_root(Path(tmp), files(args.import_seconds))
        history = root / "history.sqlite"
        devpool = [*PYTEST, *devpool_options(root, "sim:0-7", history)]
        runs = root / "runs"
        devpool_run = [*devpool, f"--devpool-run-dir={runs}"]
        timed(devpool, root)  # primes the duration history; not counted
        variants = [Variant("devpool sim:0-7 warm", devpool_run)]
        if not args.no_plain:
            variants.append(Variant("plain pytest (serial)", [*PYTEST, "-p", "no:devpool"]))
        print(
            f"ML-shaped suite: import {args.import_seconds:g} s per process, "
            f"{device_seconds:.1f} device-seconds on 8 devices; lower bound {bound:.1f} s"
        )
        alternate(variants, root, args.repeat)
        held, ran = utilisation(runs / "record.jsonl")
        waits = lease_to_start(runs / "record.jsonl")
    value = variants[0].median / bound
    verdict = "met" if value <= 1.10 else f"MISSED by {value / 1.10 - 1:.0%}"
    print(f"  devpool / lower bound = {value:.2f}x  target ≤ 1.10x: {verdict}")
    if waits:
        import statistics

        print(
            f"  lease to first line: median {1000 * statistics.median(waits):.0f} ms, "
            f"max {1000 * max(waits):.0f} ms over {len(waits)} leases; target ≤ 50 ms median"
        )
    if held:
        print(
            f"  last run: tests ran {ran / held:.0%} of the leased device time "
            f"({ran:.1f} of {held:.1f} device-seconds); target ≥ 90%"
        )


if __name__ == "__main__":
    main()
