"""Per-test cost of process isolation on a suite whose modules import a heavy package.

Run: python benchmarks/isolation.py [--repeat 3] [--modules 4] [--tests 5]

Every module imports numpy (a real import, not a sleep) and its tests use it. devpool runs
CPU-only (`--devices sim:0-1 --devpool-cpu-slots 2`) on warm workers (the default), with
`--devpool-isolation module` (a fresh process per module) and `--devpool-isolation job` (a
fresh process per test), the last also with `--devpool-no-fork-server` (a new interpreter
per test instead of a fork of a template that has collected); the variants alternate
within each repetition. Per-test cost of
isolation = (isolated − warm) / tests. Target (issue 12): isolation=job at most 1.5x warm
workers on CPU.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import PYTEST, Variant, alternate, devpool_options, show_ratio, suite_root

TARGET = 1.5

MODULE = """
import numpy as np
import pytest

@pytest.mark.parametrize("i", range({tests}))
def test_numpy(i):
    assert np.arange(i + 1).sum() == i * (i + 1) // 2
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modules", type=int, default=4)
    parser.add_argument("--tests", type=int, default=5, help="tests per module")
    args = parser.parse_args()
    files = {f"test_np{m:02d}.py": MODULE.format(tests=args.tests) for m in range(args.modules)}
    total = args.modules * args.tests
    with tempfile.TemporaryDirectory(prefix="devpool-isolation-") as tmp:
        root = suite_root(Path(tmp), files)
        base = [*PYTEST, *devpool_options(root, "sim:0-1", root / "h.sqlite")]
        base += ["--devpool-cpu-slots", "2"]
        variants = [
            Variant("plain pytest", [*PYTEST]),
            Variant("devpool, warm workers", base),
            Variant("devpool, isolation=module", [*base, "--devpool-isolation", "module"]),
            Variant("devpool, isolation=job", [*base, "--devpool-isolation", "job"]),
            Variant(
                "devpool, isolation=job, fresh interpreters",
                [*base, "--devpool-isolation", "job", "--devpool-no-fork-server"],
            ),
        ]
        print(f"{args.modules} modules importing numpy, {total} tests")
        alternate(variants, root, args.repeat)
    _, warm, module, job, fresh = variants
    for isolated in (module, job, fresh):
        print(show_ratio(isolated, warm, TARGET))
        cost = (isolated.median - warm.median) / total
        print(f"  {isolated.name}: {cost * 1000:.0f} ms a test over warm workers")


if __name__ == "__main__":
    main()
