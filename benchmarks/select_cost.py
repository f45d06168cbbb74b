"""What selective runs cost (issue 11): a recording run against a plain devpool run, and
the time selection takes for 10,000 tests.

Run: python benchmarks/select_cost.py [--project cachetools==8.0.2] [--repeat 3] [--tests 10000]

1. The project's sdist (as in select_recall.py) runs in paired, alternating runs: a plain
   devpool run, then one with `--devpool-select record`, `--repeat` times; medians, ranges
   and the ratio of medians with the range of the per-pair ratios. Target: ≤ 1.5 × on
   Python 3.11 (≤ 1.15 × on 3.12 and later; select/watch.py says which hook each uses).
2. A synthetic baseline of `--tests` tests (100 modules of 30 functions, each test using
   40 blocks and a few shared libraries) in a git repository with one function changed:
   the time `devpool.select.diff.select` takes in process, both as `devpool select` calls
   it and as a run with `--devpool-select on` does (with the collected tests' device
   counts). Target: < 1 s.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import PYTEST, Variant, alternate, devpool_options, show_ratio
from select_recall import PROJECTS, SRC, Project, commit, unpack

from devpool import __version__
from devpool.select.baseline import (
    SCHEMA,
    bucket_of,
    compatibility_inputs,
    identity,
    source_state,
)
from devpool.select.diff import Current, select
from devpool.select.fingerprints import blocks_of_source, library_stamp, mapped_libraries
from devpool.select.options import select_options
from devpool.select.session import store_for

# The targets: 1.5 x on Python 3.11, 1.15 x on 3.12 and later (sys.monitoring).
TARGET_RECORD = 1.15 if sys.version_info >= (3, 12) else 1.5
TARGET_SELECT_S = 1.0


def recording_pairs(project: Project, repo: Path, state: Path, repeat: int) -> None:
    """Plain devpool runs and recording runs, alternating; prints the rows and the ratio."""
    base = [
        *PYTEST,
        *("-p", "no:randomly"),
        *devpool_options(state, "sim:0-1", state / "history.sqlite"),
        *("--devpool-cpu-slots", "2"),
    ]
    plain = Variant("devpool", [*base, project.tests])
    record = Variant(
        "devpool --devpool-select record", [*base, "--devpool-select=record", project.tests]
    )
    # primes the history and the file cache; not counted
    alternate([Variant("devpool (priming, not counted)", plain.argv)], repo, 1)
    alternate([plain, record], repo, repeat)
    print(show_ratio(record, plain, TARGET_RECORD))
    cpu = [r / p for r, p in zip(record.cpu, plain.cpu, strict=True)]
    medians = statistics.median(record.cpu) / statistics.median(plain.cpu)
    print(f"  CPU seconds: record / plain = {medians:.2f}x (per run {min(cpu):.2f}–{max(cpu):.2f})")


def synthetic_baseline(root: Path, tests: int, seed: int) -> tuple[str, int]:
    """A git repository of 100 modules and a baseline of `tests` tests; then one function
    changes (uncommitted). Returns the changed block and how many tests used it."""
    rng = random.Random(seed)
    package = root / "pkg"
    package.mkdir(parents=True)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (root / ".gitignore").write_text(".devpool/\n")
    keys: list[tuple[str, str]] = []
    for m in range(100):
        source = "".join(f"def f{f}(x):\n    return x + {m * 100 + f}\n\n\n" for f in range(30))
        (package / f"m{m}.py").write_text(source)
        blocks = blocks_of_source(f"pkg/m{m}.py", source)
        keys += sorted(blocks.hashes.items())
    commit(root, "synthetic project", init=True)
    libs = sorted(mapped_libraries())[:8]
    lib_rows = []
    for path in libs:
        stamp = library_stamp(path) or (0, 0)
        lib_rows.append([path, *stamp, None])
    changed = "pkg/m7.py::f3"
    users = 0
    database: dict[str, Any] = {"blocks": [list(k) for k in keys], "files": [], "libs": lib_rows}
    table: dict[str, Any] = {}
    for number in range(tests):
        chosen = sorted(rng.sample(range(len(keys)), 40))
        users += any(keys[i][0] == changed for i in chosen)
        table[f"tests/test_{number // 100}.py::test_{number}"] = {
            "outcome": "passed",
            "devices": 0,
            "recorded": True,
            "why": "",
            "blocks": chosen,
            "files": [],
            "libs": list(range(len(lib_rows))),
            "globs": [],
        }
    database["tests"] = table
    options = select_options({}, "pyproject.toml")
    bucket = bucket_of(root, root, ["tests"], "", "")
    commit_id, dirty = source_state(root)
    manifest = {
        "schema": SCHEMA,
        "devpool": __version__,
        "platform": "sim",
        "bucket": bucket.as_dict(),
        "shape": {"pool": 2, "device_counts": {"0": tests}},
        "identity": identity(options.key_packages),
        "inifile": "pyproject.toml",
        "compat": compatibility_inputs(root, bucket, options, "pyproject.toml"),
        "commit": commit_id,
        "dirty": dirty,
    }
    store_for(root).write(manifest, database)
    module = package / "m7.py"
    module.write_text(module.read_text().replace("return x + 703", "return x - 703"))
    return changed, users


def selection_time(tests: int, repeat: int) -> None:
    """Time select() on a synthetic baseline of `tests` tests, both ways it is called."""
    with tempfile.TemporaryDirectory(prefix="devpool-select-scale-") as tmp:
        root = Path(tmp)
        changed, users = synthetic_baseline(root, tests, seed=1)
        options = select_options({}, "pyproject.toml")
        bucket = bucket_of(root, root, ["tests"], "", "")
        devices = {f"tests/test_{n // 100}.py::test_{n}": 0 for n in range(tests)}
        ways = {
            "devpool select (CLI)": Current(root, bucket, options, identity(options.key_packages)),
            "--devpool-select on (plugin)": Current(
                root,
                bucket,
                options,
                identity(options.key_packages),
                platform="sim",
                inifile="pyproject.toml",
                devices=devices,
            ),
        }
        for name, current in ways.items():
            took = []
            for _ in range(repeat):
                start = time.perf_counter()
                selection = select(store_for(root), current)
                took.append(time.perf_counter() - start)
            assert selection.full_reason is None, selection.full_reason
            verdict = "met" if statistics.median(took) < TARGET_SELECT_S else "MISSED"
            print(
                f"  {name:<30} {tests} tests, {changed} changed: {len(selection.selected)} "
                f"selected ({users} use it); median {statistics.median(took):.3f} s "
                f"(range {min(took):.3f}–{max(took):.3f}, {repeat} runs)  "
                f"target < {TARGET_SELECT_S:.0f} s: {verdict}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", choices=list(PROJECTS), default="cachetools==8.0.2")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tests", type=int, default=10_000)
    parser.add_argument("--devpool-src", type=Path, help="devpool's src folder (default: ours)")
    parser.add_argument("--skip-runs", action="store_true", help="only the selection time")
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, devpool from {SRC}")
    if not args.skip_runs:
        project = PROJECTS[args.project]
        with tempfile.TemporaryDirectory(prefix="devpool-select-cost-") as tmp:
            os.environ["PYTHONPATH"] = os.pathsep.join([project.pythonpath, str(SRC)])
            repo = unpack(project, Path(tmp))
            state = Path(tmp) / "state"
            state.mkdir()
            print(f"{project.requirement}, {args.repeat} pairs (plain, record, ...):")
            recording_pairs(project, repo, state, args.repeat)
    print("selection in process:")
    selection_time(args.tests, args.repeat)


if __name__ == "__main__":
    main()
