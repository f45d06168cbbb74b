"""devpool vs pytest -n 2 on one CPU suite, in paired runs alternating A B A B.

Run: python benchmarks/xdist_pairs.py [--suite modules20] [--pairs 5] [--cold]

devpool runs as a returning user's run does: with the duration history of earlier runs
(primed by one untimed run), `--devices sim:0-1 --devpool-cpu-slots 2` (two CPU workers,
as `-n 2`). `--cold` deletes the history before every devpool run instead. Prints every
pair, the medians and the ratio of medians with the range of per-pair ratios. The
regression guard (tests/test_benchmark_guard.py) runs the same pairs on a shorter suite.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import PYTEST, devpool_options, suite_root, timed
from cpu_suites import SUITES

TARGET = 0.9  # issue 12: devpool at most 0.9x pytest-xdist -n 2


@dataclass
class Pairs:
    """Wall seconds of each pair, devpool's first."""

    devpool: list[float]
    xdist: list[float]

    @property
    def ratio(self) -> float:
        """Median of the per-pair ratios: one slow pair (load from elsewhere) moves it little."""
        return statistics.median(a / b for a, b in zip(self.devpool, self.xdist, strict=True))

    def describe(self) -> str:
        per_pair = [a / b for a, b in zip(self.devpool, self.xdist, strict=True)]
        return (
            f"devpool median {statistics.median(self.devpool):.2f} s "
            f"({min(self.devpool):.2f}–{max(self.devpool):.2f}), "
            f"xdist median {statistics.median(self.xdist):.2f} s "
            f"({min(self.xdist):.2f}–{max(self.xdist):.2f}); "
            f"ratio median of pairs {self.ratio:.2f}x "
            f"(pairs {min(per_pair):.2f}–{max(per_pair):.2f}; "
            f"ratio of medians "
            f"{statistics.median(self.devpool) / statistics.median(self.xdist):.2f}x)"
        )


def run_pairs(root: Path, pairs: int, cold: bool = False, verbose: bool = True) -> Pairs:
    """Time devpool and `pytest -n 2` alternately in `root`, `pairs` times each."""
    history = root / "pairs.sqlite"
    devpool = [*PYTEST, *devpool_options(root, "sim:0-1", history), "--devpool-cpu-slots", "2"]
    xdist = [*PYTEST, "-n", "2"]
    if not cold:
        timed(devpool, root)  # primes the history; not counted
    timed(xdist, root)  # and the file system cache for xdist alike
    result = Pairs([], [])
    for number in range(pairs):
        if cold:
            history.unlink(missing_ok=True)
        result.devpool.append(timed(devpool, root))
        result.xdist.append(timed(xdist, root))
        if verbose:
            a, b = result.devpool[-1], result.xdist[-1]
            print(f"  pair {number + 1}: devpool {a:.2f} s, xdist {b:.2f} s, {a / b:.2f}x")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=list(SUITES), default="modules20")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="no duration history")
    args = parser.parse_args()
    title, files = SUITES[args.suite]
    with tempfile.TemporaryDirectory(prefix="devpool-pairs-") as tmp:
        root = suite_root(Path(tmp), files)
        print(f"{title}, {'cold' if args.cold else 'warm'} history, {args.pairs} pairs")
        result = run_pairs(root, args.pairs, args.cold)
    verdict = "met" if result.ratio <= TARGET else "MISSED"
    print(f"  {result.describe()}  target ≤ {TARGET}x: {verdict}")


if __name__ == "__main__":
    main()
