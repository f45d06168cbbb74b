"""A real library's test suite on disk: devpool `--devices auto` against plain pytest (issue 53).

Run: python benchmarks/library_suite.py --folder PATH [--repeat 3] [--python PY] [PATHS ...]

The issue's figure: a torch CPU suite whose collection is half of plain pytest's wall
(kornia's tests/filters, tests/color and tests/losses, from a checkout of its repository,
with kornia_rs installed beside torch). The suite runs in place with its own configuration;
devpool's lock folder and duration history go to a temporary folder (the history is primed
by one untimed run, as a project's CI keeps it). Before timing, one run of each gives the
outcome counts, which must agree. Plain pytest and devpool alternate within each repetition.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio

TARGET = 0.85
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|error|errors)\b")


def _counts(argv: list[str], cwd: Path) -> dict[str, int]:
    """The closing line's counts; the tests that did not pass are printed."""
    done = subprocess.run([*argv, "-rfE"], cwd=cwd, capture_output=True, text=True, check=False)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    lines = [line for line in plain.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            print(f"    {line[:160]}")
    last = lines[-1] if lines else ""
    return {
        kind.rstrip("s") if kind == "errors" else kind: int(n) for n, kind in COUNTS.findall(last)
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="the suite's interpreter")
    parser.add_argument(
        "paths", nargs="*", default=["tests/filters", "tests/color", "tests/losses"]
    )
    args = parser.parse_args()
    folder = args.folder.resolve()
    base = [args.python, *PYTEST[1:], "-p", "no:randomly", *args.paths]
    with tempfile.TemporaryDirectory(prefix="devpool-library-") as tmp:
        history = Path(tmp) / "history.sqlite"
        devpool = [*base, *devpool_options(Path(tmp), "auto", history)]
        plain = [*base, "-p", "no:devpool"]
        expected, ours = _counts(plain, folder), _counts(devpool, folder)  # primes the history
        print(f"  outcomes: plain {expected}, devpool {ours}")
        if expected != ours:
            raise SystemExit("the outcome counts differ: no timing")
        variants = [
            Variant("plain pytest", plain, check=False),
            Variant("devpool --devices auto", devpool, check=False),
        ]
        alternate(variants, folder, args.repeat)
        print(show_ratio(variants[1], variants[0], TARGET))


if __name__ == "__main__":
    main()
