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
import resource
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from common import PYTEST, devpool_options, suite_root, timed
from cpu_suites import SUITES

TARGET = 0.9  # issue 12: devpool at most 0.9x pytest-xdist -n 2


def cpu_timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the whole process tree) of one command.

    CPU time moves far less than wall time when other jobs load the machine: it tells
    whether a change made the run cheaper even when the wall clock is too noisy to say."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(argv, cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


@dataclass
class Pairs:
    """Wall (and CPU) seconds of each pair, devpool's first."""

    devpool: list[float]
    xdist: list[float]
    devpool_cpu: list[float] = field(default_factory=list)
    xdist_cpu: list[float] = field(default_factory=list)

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
            f"{statistics.median(self.devpool) / statistics.median(self.xdist):.2f}x); "
            f"CPU s devpool {statistics.median(self.devpool_cpu):.2f}, "
            f"xdist {statistics.median(self.xdist_cpu):.2f}"
        )


def run_pairs(
    root: Path,
    pairs: int,
    cold: bool = False,
    verbose: bool = True,
    result: Pairs | None = None,
) -> Pairs:
    """Time devpool and `pytest -n 2` alternately in `root`, `pairs` times each; with
    `result`, add the pairs to those (no priming runs again)."""
    history = root / "pairs.sqlite"
    devpool = [*PYTEST, *devpool_options(root, "sim:0-1", history), "--devpool-cpu-slots", "2"]
    xdist = [*PYTEST, "-n", "2"]
    if result is None:
        if not cold:
            timed(devpool, root)  # primes the history; not counted
        timed(xdist, root)  # and the file system cache for xdist alike
        result = Pairs([], [])
    for number in range(len(result.devpool), len(result.devpool) + pairs):
        if cold:
            history.unlink(missing_ok=True)
        for wall, cpu, argv in (
            (result.devpool, result.devpool_cpu, devpool),
            (result.xdist, result.xdist_cpu, xdist),
        ):
            took, used = cpu_timed(argv, root)
            wall.append(took)
            cpu.append(used)
        if verbose:
            a, b = result.devpool[-1], result.xdist[-1]
            c, d = result.devpool_cpu[-1], result.xdist_cpu[-1]
            print(
                f"  pair {number + 1}: devpool {a:.2f} s, xdist {b:.2f} s, {a / b:.2f}x "
                f"(CPU {c:.2f} s vs {d:.2f} s)"
            )
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
