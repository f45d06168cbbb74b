"""Where a run's start goes on the torch CPU suite: what collecting once could save (issue 53).

The controller collects the suite (with the devices and variables plain pytest would see:
its plan and its skip decisions need them) while the CPU-only template, forked from the
zygote with its workers' environment, collects the same modules again and then preloads
what earlier runs' tests imported. The first test starts when both are done. This script
takes, from each run's record and the clock around it:

- start-up to collected: from the command's start to the controller's `session_start`
  (Python, pytest, the plugins, the conftest's torch import, the collection, the plan);
- waiting for the template: from there to the first worker's fork (its `worker_ready`
  less its own start-up). The controller's core is idle meanwhile;
- the test phase: from the first fork to `session_end`;
- and plain pytest's `--collect-only` of the same suite (start-up and collection).

Collecting once would drop one of the two collections. Dropping the controller's leaves
the template's (it must import the modules under its workers' environment) on the path:
the first test starts no sooner. Dropping the template's (a fork of the controller after
its collection) leaves its preload on the path after the controller's collection: no
sooner either, unless the wait above is longer than the preload.

    python benchmarks/collect_path.py [--repeat 3] [--modules 20]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from common import PYTEST, suite_root, timed
from torch_cpu_suite import suite_arguments, suite_files


def phases(record: Path, started: float) -> tuple[float, float, float]:
    """(start-up to collected, waiting for the template, test phase) of one run, seconds."""
    events = [json.loads(line) for line in record.read_text().splitlines()]
    collected = next(e["time"] for e in events if e["type"] == "session_start")
    forked = min(e["time"] - e["startup"] for e in events if e["type"] == "worker_ready")
    ended = next(e["time"] for e in events if e["type"] == "session_end")
    return collected - started, max(forked - collected, 0.0), ended - max(forked, collected)


def main() -> None:
    args = suite_arguments("collect_path", __doc__ or "")
    if args is None:
        return
    rows: list[tuple[float, float, float]] = []
    collect_only: list[float] = []
    with tempfile.TemporaryDirectory(prefix="devpool-collect-path-") as tmp:
        root = suite_root(Path(tmp), suite_files(args.modules))
        record = root / "record.jsonl"
        devpool = [
            *PYTEST,
            "--devices",
            "auto",
            f"--devpool-lock-dir={root / 'locks'}",
            f"--devpool-history={root / 'history.sqlite'}",
            f"--devpool-run-record={record}",
        ]
        timed(devpool, root)  # a history and a preload list, as on a second run
        for _ in range(args.repeat):
            collect_only.append(timed([*PYTEST, "-p", "no:devpool", "--collect-only"], root))
            record.unlink(missing_ok=True)  # a record is appended to
            started = time.time()
            timed(devpool, root)
            rows.append(phases(record, started))
    print(f"collect_path: {60 * args.modules} torch CPU tests, {args.repeat} runs, medians")
    names = ("start-up to collected", "waiting for the template", "test phase")
    for index, name in enumerate(names):
        values = [row[index] for row in rows]
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"  devpool {name:<26} {statistics.median(values):5.2f} s  ({shown})")
    shown = ", ".join(f"{v:.2f}" for v in collect_only)
    label = "plain pytest --collect-only"
    print(f"  {label:<34} {statistics.median(collect_only):5.2f} s  ({shown})")


if __name__ == "__main__":
    main()
