"""End to end: a run writes each once-fixture's setup seconds into the history; `devpool
shard` charges the shard with its users that setup once; `pytest --devpool-shard K/N`
splits alike (same shards, same fingerprint) and `devpool shard verify` agrees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devpool.history.durations import History, TestResult
from devpool.plan.once import setup_history_id

RUN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:randomly", "-q")
TABLE = "[tool.devpool.once]\nserver = { device_count = 1 }\n"
CONFTEST = """
import pytest

@pytest.fixture(scope="session")
def server():
    return "up"
"""
MARKED = CONFTEST.replace("import pytest", "import devpool\nimport pytest").replace(
    "@pytest.fixture", "@devpool.once(device_count=1)\n@pytest.fixture"
)
USERS = [f"test_suite.py::test_user_{i}" for i in range(3)]
OTHERS = [f"test_suite.py::test_other_{i:02d}" for i in range(9)]


def environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DEVPOOL_"))}


def run(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *argv], cwd=root, env=environ(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def pytest_run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(root, "-m", "pytest", *RUN, "--devices", "sim:0-1",
               f"--devpool-history={root / 'h.sqlite'}",
               f"--devpool-lock-dir={root / 'locks'}", *args)  # fmt: skip


def write_suite(root: Path, marked: bool = False) -> None:
    (root / "pyproject.toml").write_text("[tool.devpool]\n" if marked else TABLE)
    (root / "conftest.py").write_text(MARKED if marked else CONFTEST)
    lines = ["import pytest", ""]
    for name in [n.split("::")[1] for n in USERS]:
        lines += ["@pytest.mark.device_count(1)", f"def {name}(server): assert server", ""]
    for name in [n.split("::")[1] for n in OTHERS]:
        lines += ["@pytest.mark.device_count(1)", f"def {name}(): pass", ""]
    (root / "test_suite.py").write_text("\n".join(lines))


@pytest.mark.parametrize("marked", [False, True], ids=["table", "marked"])
def test_the_shard_with_the_users_pays_the_setup_and_both_splits_agree(
    tmp_path: Path, marked: bool
) -> None:
    write_suite(tmp_path, marked)
    pytest_run(tmp_path)  # a plain run: its once-fixture's setup reaches the history
    history = tmp_path / "h.sqlite"
    with History(history) as h:
        recorded = [r for r in h.results() if r.nodeid == setup_history_id("server")]
        assert [(r.outcome, r.platform, r.device_count) for r in recorded] == [("passed", "sim", 1)]
        # Then a history of a costly setup and known durations, newer than that run.
        now = time.time()
        durations = {setup_history_id("server"): 60.0, **dict.fromkeys(USERS, 2.0)}
        durations.update(dict.fromkeys(OTHERS, 10.0))
        h.add(
            TestResult(nodeid, "passed", seconds, "sim", 1, "sim-2", now + run, f"r{run}")
            for run in range(1, 4)
            for nodeid, seconds in durations.items()
        )
    done = run(tmp_path, "-m", "devpool.cli", "shard", "--runners", "3", "--platform", "sim",
               "--devices-per-runner", "2", "--history", str(history), "--format", "json",
               "--", "test_suite.py", *RUN[:-1])  # fmt: skip
    data = json.loads(done.stdout)
    split = [shard["tests"] for shard in data["split"]]
    [(paying, users)] = [(s, s["tests"]) for s in data["split"] if s["once_setups"]]
    assert set(USERS) <= set(users)  # the users gather in one shard, which pays once
    assert paying["once_setups"] == [{"fixture": "server", "seconds": 60.0, "device_seconds": 60.0}]
    tests = sum(2.0 if t in USERS else 10.0 for t in users)
    assert paying["device_seconds"] == tests + 60.0
    assert paying["wall_seconds"] >= 62.0  # a user waits for the setup
    text = run(tmp_path, "-m", "devpool.cli", "shard", "--runners", "3", "--platform", "sim",
               "--devices-per-runner", "2", "--history", str(history),
               "--", "test_suite.py", *RUN[:-1]).stdout  # fmt: skip
    rows = [line for line in text.splitlines() if "/3 " in line and "pytest" not in line]
    assert [("incl. once-fixture setups: server 60.0 device-s" in r) for r in rows].count(True) == 1
    assert f"split fingerprint {data['fingerprint']}" in text

    records = [tmp_path / f"shard{k}.jsonl" for k in (1, 2, 3)]
    for k, record in enumerate(records, 1):
        pytest_run(tmp_path, f"--devpool-shard={k}/3", f"--devpool-run-record={record}")
        events = [json.loads(line) for line in record.read_text().splitlines()]
        [shard] = [e for e in events if e["type"] == "shard"]
        assert (shard["fingerprint"], shard["split"]) == (data["fingerprint"], split)
        setups = [e for e in events if e["type"] == "once_setup"]
        assert len(setups) == (1 if split[k - 1] == users else 0)  # only there it is set up
    verified = run(tmp_path, "-m", "devpool.cli", "shard", "verify", *map(str, records))
    assert verified.stdout.startswith("devpool shard verify: OK: 3 shards, 12 tests")
