"""`devpool queue report`: the one verdict of a shared run, against a real PostgreSQL server."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from devpool.cli import main
from devpool.queue.store import QueuedTest, QueueStore
from pg_server import Server

DEVPOOL = "import sys; from devpool.cli import main; sys.exit(main(sys.argv[1:]))"

_runs = itertools.count()

TESTS = [
    QueuedTest("t.py::test_a", 0, "cpu", 1.0),
    QueuedTest("t.py::test_b", 1, "1 device", 1.0),
    QueuedTest("t.py::test_c", 2, "2 devices", 1.0),
    QueuedTest("t.py::test_eight", 8, "8 devices", 1.0),
]


def ending(test: str, outcome: str, start: float, **more: object) -> dict[str, object]:
    return {
        "nodeid": test,
        "outcome": outcome,
        "gating": outcome in ("failed", "error", "crashed", "timeout", "infra"),
        "devices": [1],
        "start": start,
        "end": start + 0.5,
        "run_time": 0.5,
        "detail": "assert 1 == 2" if outcome == "failed" else "",
        "counted": [outcome],
        "text": "E  assert 1 == 2" if outcome == "failed" else "",
        **more,
    }


def new_run(postgres: Server) -> QueueStore:
    store = QueueStore(postgres.url, f"report-{time.time_ns()}-{next(_runs)}")
    store.publish(TESTS, "host-a")
    return store


def report(postgres: Server, store: QueueStore, *more: str) -> int:
    args = ["queue", "report", f"--devpool-queue={postgres.url}"]
    return main([*args, f"--devpool-queue-run={store.run_id}", *more])


def test_one_verdict_one_junit_in_collection_order(
    postgres: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    store = new_run(postgres)
    two = store.join("host-a", 1, 2, "sim", 30)
    claims = {c.test_id: c for c in store.claim(two, 2, 100)}
    now = time.time()
    # ended in another order than collected
    store.report(
        two, claims["t.py::test_c"], "passed", False, ending("t.py::test_c", "passed", now)
    )
    store.report(two, claims["t.py::test_b"], "failed", True, ending("t.py::test_b", "failed", now))
    store.report(
        two, claims["t.py::test_a"], "passed", False, ending("t.py::test_a", "passed", now)
    )
    store.leave(two)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "junit.xml"
    assert report(postgres, store, f"--junitxml={junit}", "--wait=5") == 1
    out = capsys.readouterr().out
    assert "2 tests did not pass: 1 failed, 1 infra (exit code 1)" in out
    assert "unsatisfiable: it needs 8 devices and no live job of the run can hold it" in out
    assert "(joined: host-a (2 devices))" in out
    assert "queue: 1 job joined: host-a (2 devices) ran 3" in out
    cases = ET.parse(junit).getroot().findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["test_a", "test_b", "test_c", "test_eight"]
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "assert 1 == 2"
    assert failure.text == "E  assert 1 == 2"
    assert cases[3].find("failure") is not None
    assert "## devpool: 2 tests did not pass" in summary.read_text()
    store.close()


def test_all_passed_and_json(postgres: Server, capsys: pytest.CaptureFixture[str]) -> None:
    store = new_run(postgres)
    eight = store.join("big", 1, 8, "sim", 30)
    for claim in store.claim(eight, 8, 100):
        store.report(eight, claim, "passed", False, ending(claim.test_id, "passed", time.time()))
    assert report(postgres, store, "--format=json", "--wait=0") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"] == {"passed": 4}
    assert data["verdict"] == "all tests passed (exit code 0)"
    store.close()


def test_a_run_still_going_when_the_wait_ends(
    postgres: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    store = new_run(postgres)
    eight = store.join("big", 1, 8, "sim", 30)  # alive, holding claims, reporting one
    claims = store.claim(eight, 8, 100)
    store.report(eight, claims[0], "passed", False, ending(claims[0].test_id, "passed", 1.0))
    started = time.monotonic()
    assert report(postgres, store, "--wait=0.5") == 2  # as pytest interrupted
    assert time.monotonic() - started < 10
    out = capsys.readouterr().out
    assert "did not finish" in out and "1 of 4 tests ran" in out
    store.close()


def test_a_run_nobody_started(postgres: Server, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["queue", "report", f"--devpool-queue={postgres.url}", "--devpool-queue-run=nobody"]
    assert main(args) == 4
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"queue run 'nobody' at 127.0.0.1:{postgres.port} was never started: no job of it "
        "reached the queue (check --devpool-queue-run)"
    )
    assert len(err.splitlines()) == 1


def test_not_postgres_and_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "report", "--devpool-queue=sqlite:///x", "--devpool-queue-run=r"]) == 4
    assert "must be a PostgreSQL URL" in capsys.readouterr().err
    url = "--devpool-queue=postgresql://u@127.0.0.1:1/db"
    assert main(["queue", "report", url, "--devpool-queue-run=r"]) == 4
    err = capsys.readouterr().err
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in err and len(err.strip().splitlines()) == 1


def test_status_names_jobs_and_what_is_queued(
    postgres: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    store = new_run(postgres)
    two = store.join("small", 7, 2, "sim", 30)
    gone = store.join("gone", 8, 4, "sim", 30)
    claims = store.claim(two, 2, 1.0)  # the longest it can hold: test_c
    store.report(two, claims[0], "passed", False, ending(claims[0].test_id, "passed", 1.0))
    store.claim(two, 2, 1.0)  # test_a: as long as test_b, collected first
    store.leave(gone)
    args = ["queue", "status", f"--devpool-queue={postgres.url}"]
    assert main([*args, f"--devpool-queue-run={store.run_id}"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"queue run {store.run_id!r}: 4 tests: 1 done (1 passed), 1 claimed, 2 queued",
        f"  job {two}: small (2 devices), pid 7, alive, 1 claimed, 1 done",
        f"  job {gone}: gone (4 devices), pid 8, left, 0 claimed, 0 done",
        "queued (2), 1 that no live job can hold (the largest has 2 devices):",
        "  t.py::test_eight (8 devices): no live job can hold it",  # what is stuck comes first
        "  t.py::test_b (1 device)",
    ]
    store.close()


def test_queue_and_run_from_the_project_table(
    postgres: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    store = new_run(postgres)
    eight = store.join("big", 1, 8, "sim", 30)
    for claim in store.claim(eight, 8, 100):
        store.report(eight, claim, "passed", False, ending(claim.test_id, "passed", 1.0))
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.devpool]\nqueue = "{postgres.url}"\nqueue-run = "{store.run_id}"\n'
    )
    monkeypatch.chdir(tmp_path)
    assert main(["queue", "report", "--wait=0"]) == 0
    assert "all tests passed (exit code 0)" in capsys.readouterr().out
    store.close()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://ci:secret@db:5x/q", "Port could not be cast to integer value"),
        ("postgresql://ci:secret@[db/q", "Invalid IPv6 URL"),
    ],
)
def test_a_url_that_cannot_be_read_is_one_sentence(url: str, why: str, tmp_path: Path) -> None:
    for command in ("status", "report"):
        done = subprocess.run(
            [sys.executable, "-c", DEVPOOL, "queue", command, f"--devpool-queue={url}",
             "--devpool-queue-run=r"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        said = done.stdout + done.stderr
        assert done.returncode == 4, said
        assert len(said.strip().splitlines()) == 1 and why in said, said
        assert "secret" not in said and "ci:***@" in said, said


def test_a_password_is_never_shown_wherever_the_url_holds_it() -> None:
    from devpool.database import shown, where

    for url in ("postgresql://ci:s3cret@db:5433/q", "postgresql://ci@db:5433/q?password=s3cret"):
        assert "s3cret" not in shown(url) and "***" in shown(url)
        assert where(url) == "db:5433"
    assert shown("postgresql://ci@db/q?sslmode=require") == "postgresql://ci@db/q?sslmode=require"
