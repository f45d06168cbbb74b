"""The shared queue for real: JOBS local jobs against one PostgreSQL, against static shards.

TESTS CPU tests of 10 ms each (issue 37: 4 jobs, 2,000 tests). Every job is a real pytest
session with devpool, a lock folder of its own (as if on its own host), the same command
but for how it gets its tests:

- queue: `--devpool-queue=URL --devpool-queue-run=ID`, a new run id each repetition;
- static shards: `--devpool-shard=K/JOBS` from the same duration history.

The JOBS jobs of a variant start together; its wall is the slowest job's (what the CI run
waits for). Variants alternate within each repetition, so drift in the machine's load hits
both alike. The PostgreSQL server is a throwaway one on 127.0.0.1 (tests/pg_server.py: its
own folder, stopped at the end). Target: the queue's wall <= 1.05x the shards'.

    python benchmarks/fleet_queue_real.py [--jobs 4] [--tests 2000] [--repeat 3]
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

from pg_server import remove, server_bin, start_server  # noqa: E402

SUITE = """
import time

import pytest


@pytest.mark.parametrize("i", range({tests}))
def test_ten_ms(i):
    time.sleep(0.01)
"""


def wall(commands: list[list[str]], cwd: Path) -> float:
    """Seconds until the last of the commands, started together, has ended (each must pass)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for argv in commands
    ]
    outputs = [proc.communicate()[0].decode(errors="replace") for proc in procs]
    elapsed = time.perf_counter() - start
    for proc, output in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"a job exited {proc.returncode}:\n{output[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if server_bin() is None:
        sys.exit("no PostgreSQL server binaries (initdb, pg_ctl) here")
    server = start_server()
    root = suite_root(Path(tempfile.mkdtemp(prefix="devpool-fleet-")), {})
    (root / "test_fleet.py").write_text(SUITE.format(tests=args.tests))
    history = root / "history.sqlite"

    def job(k: int, *how: str) -> list[str]:
        locks = root / f"locks-{k}"
        locks.mkdir(exist_ok=True)
        return [*PYTEST, "test_fleet.py", "--devices", "sim:0-0",
                f"--devpool-lock-dir={locks}", f"--devpool-history={history}", *how]  # fmt: skip

    try:
        # one untimed run fills the history both variants split and size batches from
        wall([job(0)], root)
        queue_runs: list[float] = []
        shard_runs: list[float] = []
        for repetition in range(args.repeat):
            run = f"bench-{time.time_ns()}-{repetition}"
            queued = [
                job(k, f"--devpool-queue={server.url}", f"--devpool-queue-run={run}")
                for k in range(args.jobs)
            ]
            sharded = [job(k, f"--devpool-shard={k + 1}/{args.jobs}") for k in range(args.jobs)]
            queue_runs.append(wall(queued, root))
            shard_runs.append(wall(sharded, root))
            print(
                f"  repetition {repetition + 1}: queue {queue_runs[-1]:.2f} s, "
                f"shards {shard_runs[-1]:.2f} s ({queue_runs[-1] / shard_runs[-1]:.3f}x)",
                flush=True,
            )
        queue, shards = statistics.median(queue_runs), statistics.median(shard_runs)
        ratios = [q / s for q, s in zip(queue_runs, shard_runs, strict=True)]
        print(
            f"{args.jobs} jobs, {args.tests} tests of 10 ms, {os.cpu_count()} cores: queue "
            f"{queue:.2f} s, static shards {shards:.2f} s (medians of {args.repeat}): "
            f"{queue / shards:.3f}x (per repetition {min(ratios):.3f}-{max(ratios):.3f}x; "
            "target <= 1.05x)"
        )
    finally:
        server.stop()
        remove(server)


if __name__ == "__main__":
    main()
