"""Recording a baseline through the queue against the same queue run without it (issue 48).

JOBS local jobs share one queue run in a throwaway PostgreSQL (tests/pg_server.py), each a
real pytest session with devpool and a lock folder of its own, over TESTS CPU tests of
10 ms that each call a few functions of the project's own module (what recording watches).
Both variants keep the duration history in the same database; the recording one adds
`--devpool-select=record`: its jobs send their tests' dependencies and the last one
publishes the generation. Variants alternate within each repetition; the wall of a variant
is its slowest job's. Target: recording <= 1.2x.

    python benchmarks/select_queue_cost.py [--jobs 2] [--tests 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import PYTEST, suite_root  # noqa: E402
from fleet_queue_real import wall  # noqa: E402

from pg_server import remove, server_bin, start_server  # noqa: E402

LIB = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(30))
SUITE = """
import time

import pytest

import lib


@pytest.mark.parametrize("i", range({tests}))
def test_ten_ms(i):
    assert getattr(lib, f"f{{i % 30}}")(i) == i + i % 30
    assert lib.f0(i) == i
    time.sleep(0.01)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tests", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if server_bin() is None:
        sys.exit("no PostgreSQL server binaries (initdb, pg_ctl) here")
    server = start_server()
    root = suite_root(Path(tempfile.mkdtemp(prefix="devpool-select-queue-")), {})
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    (root / "lib.py").write_text(LIB)
    (root / "test_fleet.py").write_text(SUITE.format(tests=args.tests))
    (root / ".gitignore").write_text(".devpool/\n__pycache__/\nlocks-*/\n")
    for git in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "suite"]):
        subprocess.run(
            ["git", "-c", "user.email=b@example.com", "-c", "user.name=b", *git],
            cwd=root,
            check=True,
        )

    def job(k: int, run: str, *how: str) -> list[str]:
        locks = root / f"locks-{k}"
        locks.mkdir(exist_ok=True)
        return [*PYTEST, "test_fleet.py", "--devices", "sim:0-0",
                f"--devpool-lock-dir={locks}", f"--devpool-history={server.url}",
                f"--devpool-queue={server.url}", f"--devpool-queue-run={run}", *how]  # fmt: skip

    try:
        wall([job(0, "warm-up")], root)  # the history both variants size batches from
        plain_runs: list[float] = []
        record_runs: list[float] = []
        for repetition in range(args.repeat):
            stamp = f"{time.time_ns()}-{repetition}"
            plain_runs.append(wall([job(k, f"plain-{stamp}") for k in range(args.jobs)], root))
            recording = [
                job(k, f"record-{stamp}", "--devpool-select=record") for k in range(args.jobs)
            ]
            record_runs.append(wall(recording, root))
            print(
                f"  repetition {repetition + 1}: queue {plain_runs[-1]:.2f} s, recording "
                f"{record_runs[-1]:.2f} s ({record_runs[-1] / plain_runs[-1]:.3f}x)",
                flush=True,
            )
        plain, record = statistics.median(plain_runs), statistics.median(record_runs)
        ratios = [r / p for r, p in zip(record_runs, plain_runs, strict=True)]
        print(
            f"{args.jobs} jobs, {args.tests} tests of 10 ms, {os.cpu_count()} cores: queue "
            f"{plain:.2f} s, recording through it {record:.2f} s (medians of {args.repeat}): "
            f"{record / plain:.3f}x (per repetition {min(ratios):.3f}-{max(ratios):.3f}x; "
            "target <= 1.2x)"
        )
    finally:
        server.stop()
        remove(server)


if __name__ == "__main__":
    main()
