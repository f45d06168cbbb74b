"""`devpool rerun RUN`: what did not pass in a run folder or a queue run, and bad runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devpool.cli import main
from devpool.queue.store import QueuedTest, QueueStore
from devpool.session.rerun import not_passed, own_arguments
from pg_server import Server


def _record(folder: Path, planned: list[str], endings: list[tuple[str, str, int]]) -> Path:
    """A run folder whose record planned these tests and ended these (nodeid, outcome, try)."""
    folder.mkdir(parents=True)
    now = time.time()
    lines = [
        {
            "v": 1,
            "type": "session_start",
            "time": now,
            "run_id": "20260101-000000-1",
            "args": ["tests", "-x", "--devpool-run-dir=/ci/run", "--devpool-shard", "1/2"],
            "planned": planned,
        }
    ]
    for job, (nodeid, outcome, attempt) in enumerate(endings):
        lines.append(
            {"v": 1, "type": "job_end", "time": now, "job": job, "nodeid": nodeid,
             "outcome": outcome, "attempt": attempt}
        )  # fmt: skip
    (folder / "record.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def test_the_tests_that_did_not_pass_are_failures_and_those_never_ended(tmp_path: Path) -> None:
    planned = [f"t.py::test_{name}" for name in "abcdefg"]
    endings = [
        ("t.py::test_a", "passed", 1),
        ("t.py::test_b", "failed", 1),
        ("t.py::test_c", "failed", 1),  # failed, then passed on its rerun: flaky
        ("t.py::test_c", "flaky", 2),
        ("t.py::test_d", "timeout", 1),
        ("t.py::test_e", "skipped", 1),
        ("t.py::test_f", "crashed", 1),
    ]
    run = _record(tmp_path / "run", planned, endings)

    found = not_passed(str(run), None)

    assert found.tests == ["t.py::test_b", "t.py::test_d", "t.py::test_f", "t.py::test_g"]
    assert found.sentence() == (
        "4 tests of run 20260101-000000-1 did not pass (1 failed, 1 timeout, 1 crashed, 1 not run)"
    )
    assert own_arguments(found.args or []) == ["tests", "-x"]


def test_the_arguments_of_one_run_alone_are_left_out() -> None:
    given = ["-k", "gpu", "--devpool-select", "on", "--devpool-queue=postgresql://h/db",
             "--devpool-run-record", "r.jsonl", "-p", "devpool.session.rerun", "-p", "x"]  # fmt: skip  # noqa: E501
    assert own_arguments(given) == ["-k", "gpu", "-p", "x"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["rerun", "gone"], "no run folder or record at 'gone' (RUN is a run folder"),
        (["rerun", "latest"], "devpool rerun latest: no run under .devpool/runs here"),
        (["rerun", "."], "is a folder without a record.jsonl: no devpool run folder"),
        (["rerun", "7", "--devpool-history=h.sqlite"], "must be a PostgreSQL URL to find a queue"),
    ],
)
def test_a_bad_run_is_one_sentence(
    args: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)

    assert main(args) == 4

    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_a_run_where_all_passed_has_nothing_to_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _record(tmp_path / "run", ["t.py::test_a"], [("t.py::test_a", "passed", 1)])

    assert main(["rerun", str(run)]) == 0

    out = capsys.readouterr().out
    assert out == "devpool rerun: every test of run 20260101-000000-1 passed: nothing to rerun\n"


def test_a_queue_run_id_names_the_run_in_a_postgresql_history(
    postgres: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"rerun-{time.time_ns()}"
    store = QueueStore(postgres.url, run_id)
    store.publish([QueuedTest(f"t.py::test_{name}", 0, "cpu", 1.0) for name in "abcd"], "host")
    job = store.join("host", 1, 0, "sim", 30)
    claims = {claim.test_id: claim for claim in store.claim(job, 0, 2.5)}
    store.report(job, claims.pop("t.py::test_a"), "passed", False)
    store.report(job, claims.pop("t.py::test_b"), "error", True)
    store.close()

    found = not_passed(run_id, postgres.url)

    assert set(found.tests) == {"t.py::test_b", "t.py::test_c", "t.py::test_d"}
    assert found.outcomes == {"error": 1, "not run": 2}
    assert main(["rerun", "elsewhere", f"--devpool-history={postgres.url}"]) == 4
    assert "no queue run 'elsewhere' at" in capsys.readouterr().err
