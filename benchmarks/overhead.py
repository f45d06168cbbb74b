"""Per-test overhead of devpool over plain pytest on trivial 1-device sim tests.

Run: python benchmarks/overhead.py [--repeat 3] [--tests 200]

200 trivial tests marked device_count(1): plain in-process pytest (the marker is inert
there) vs devpool on --devices sim:0-7, with no duration history ("cold": deleted before
each run) and with the history of earlier runs ("warm": primed by one untimed run). The
commands alternate within each repetition; figures are medians with the min–max range.
The CPU-only comparison with pytest-xdist lives in cpu_suites.py.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, ratio, suite_root, timed

DEVICE_SUITE = """
import pytest

@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range({n}))
def test_trivial(i):
    assert i >= 0
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tests", type=int, default=200)
    args = parser.parse_args()
    n = args.tests
    with tempfile.TemporaryDirectory(prefix="devpool-overhead-") as tmp:
        root = suite_root(Path(tmp), {"test_devices.py": DEVICE_SUITE.format(n=n)})
        cold, warm = root / "cold.sqlite", root / "warm.sqlite"
        suite = [*PYTEST, "test_devices.py"]
        devpool_warm = [*suite, *devpool_options(root, "sim:0-7", warm)]
        timed(devpool_warm, root)  # primes the warm history; not counted
        variants = [
            Variant("plain pytest", suite),
            Variant(
                "devpool sim:0-7 cold",
                [*suite, *devpool_options(root, "sim:0-7", cold)],
                prepare=lambda: cold.unlink(missing_ok=True),
            ),
            Variant("devpool sim:0-7 warm", devpool_warm),
        ]
        print(f"{n} trivial 1-device tests, sim:0-7")
        alternate(variants, root, args.repeat)
        plain = variants[0]
        for variant in variants[1:]:
            value, low, high = ratio(variant, plain)
            per_test = [1000 * (a - b) / n for a, b in zip(variant.runs, plain.runs, strict=True)]
            print(
                f"  {variant.name} / plain = {value:.2f}x (per run {low:.2f}–{high:.2f}); "
                f"overhead {1000 * (variant.median - plain.median) / n:.1f} ms per test "
                f"(per run {min(per_test):.1f}–{max(per_test):.1f})"
            )


if __name__ == "__main__":
    main()
