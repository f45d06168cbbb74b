"""End to end: shards run one after another in one checkout partition the suite, and
`devpool shard verify` proves it from their records, or names the tests when they do not.

Before the fix each shard recomputed the split from a history the previous shard had just
changed: of 63 tests, 44 ran, 20 of them twice, 19 never, and every shard was green.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from devpool.history.durations import History, TestResult, default_history_path, pending_files

RUN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:rerunfailures", "-q")
T0 = 1_700_000_000.0


def suite(root: Path, count: int = 24) -> list[str]:
    lines = ["import pytest", ""]
    for i in range(count):
        devices = (0, 1, 2)[i % 3]
        if devices:
            lines.append(f"@pytest.mark.device_count({devices})")
        lines += [f"def test_{i:02d}(): pass", ""]
    (root / "test_suite.py").write_text("\n".join(lines))
    return [f"test_suite.py::test_{i:02d}" for i in range(count)]


def environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}


def pytest_run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", *RUN, "--devices", "sim:0-3", *args]
    argv.append(f"--devpool-lock-dir={root / 'locks'}")
    done = subprocess.run(
        argv, cwd=root, env=environ(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def verify(root: Path, *records: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "devpool.cli", "shard", "verify", *map(str, records)]
    return subprocess.run(argv, cwd=root, env=environ(), capture_output=True, text=True)


def ran(record: Path) -> list[str]:
    ends = [json.loads(line) for line in record.read_text().splitlines()]
    return [e["test"] for e in ends if e["type"] == "job_end" and not e["retried"]]


def test_shards_one_after_another_partition_the_suite_and_verify_says_so(
    tmp_path: Path,
) -> None:
    tests = suite(tmp_path)
    pytest_run(tmp_path)  # a plain run: the history now has every test's duration
    history = default_history_path(tmp_path)
    with History(history) as h:
        before = list(h.results())
    records = [tmp_path / f"shard{k}.jsonl" for k in (1, 2, 3)]
    for k, record in enumerate(records, 1):
        pytest_run(tmp_path, f"--devpool-shard={k}/3", f"--devpool-run-record={record}")
    counts = Counter(test for record in records for test in ran(record))
    assert sorted(counts) == tests  # the union is exactly the suite ...
    assert set(counts.values()) == {1}  # ... and each test ran once
    # Shard runs left the history alone; their durations wait in per-run files.
    with History(history) as h:
        assert list(h.results()) == before
    assert len(pending_files(history)) == 3

    done = verify(tmp_path, *records)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("devpool shard verify: OK: 3 shards, 24 tests, each ran")
    assert done.stdout.count("\n") == 1

    # A shard given twice, and a shard missing: each named, with its tests.
    done = verify(tmp_path, records[0], records[0], records[1], records[2])
    assert done.returncode == 1
    assert "shard 1/3 is given 2 times" in done.stderr
    for test in ran(records[0]):
        assert f"    {test}  (shards 1/3, 1/3)\n" in done.stderr
    done = verify(tmp_path, records[0], records[2])
    assert done.returncode == 1
    assert "shard 2/3 has no record" in done.stderr
    for test in ran(records[1]):
        assert f"    {test}\n" in done.stderr

    # The shards' durations are folded in later (`devpool history merge`), and a very
    # different history arrives: a shard run now splits differently from the first two.
    merged = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "history", "merge"],
        cwd=tmp_path, env=environ(), capture_output=True, text=True,
    )  # fmt: skip
    assert merged.returncode == 0 and "from 3 pending run files" in merged.stdout
    assert pending_files(history) == []
    with History(history) as h:
        slow = [TestResult(t, "passed", 60.0 - i, "sim", 1, "sim-4", T0, "x") for i, t in
                enumerate(tests[:6])]  # fmt: skip
        h.add(slow)
    late = tmp_path / "late3.jsonl"
    pytest_run(tmp_path, "--devpool-shard=3/3", f"--devpool-run-record={late}")
    done = verify(tmp_path, records[0], records[1], late)
    assert done.returncode == 1
    assert "the shards were split differently (2 fingerprints" in done.stderr
    counts = Counter(test for record in (records[0], records[1], late) for test in ran(record))
    never = [t for t in tests if t not in counts]
    twice = [t for t, n in counts.items() if n > 1]
    assert never or twice  # the new split moved tests between shards
    for test in never:
        assert f"    {test}\n" in done.stderr
    for test in twice:
        assert f"    {test}  (shards " in done.stderr
