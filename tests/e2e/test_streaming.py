"""End to end: batches stream (the next part goes out before the worker runs dry), and a
failure in the middle of a streamed batch still ends every test exactly once.

Real pytest sessions on simulated devices; the run record tells what was sent when.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

SUITE = """
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_many(i):
    assert i != {fail}
"""


@pytest.fixture(autouse=True)
def _only_devpool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # no other plugin interferes


def _run(
    pytester: pytest.Pytester, n: int, fail: int, *args: str
) -> tuple[pytest.RunResult, list[Any]]:
    pytester.makepyfile(test_many=SUITE.format(n=n, fail=fail))
    record = pytester.path / "record.jsonl"
    result = pytester.runpytest_subprocess(
        "-p",
        "devpool.plugin",
        "-p",
        "no:cacheprovider",
        f"--devpool-lock-dir={pytester.path / 'locks'}",
        f"--devpool-history={pytester.path / 'history.sqlite'}",
        f"--devpool-run-record={record}",
        "--devices",
        "sim:0",
        "--devpool-cpu-slots",
        "1",
        *args,
        timeout=120,
    )
    events = [json.loads(line) for line in record.read_text().splitlines()]
    return result, events


def _streamed(events: list[Any]) -> int:
    """How many parts were sent to a worker that still had sent tests it had not started
    (right after one of them started): only streaming sends then."""
    unstarted: dict[int, set[int]] = {}  # worker pid → jobs sent, not started
    worker_of: dict[int, int] = {}
    last: dict[int, str] = {}  # worker pid → the state of its previous move
    parts = 0
    for event in events:
        if event.get("type") != "attempt":
            continue
        job, state = event["job"], event["state"]
        if state == "sent":
            pid = event["worker"]  # a fork's pid is known only once it runs
            if last.get(pid) == "started" and unstarted.get(pid):
                parts += 1
            worker_of[job] = pid
            unstarted.setdefault(pid, set()).add(job)
        elif job in worker_of:
            pid = worker_of[job]
            unstarted[pid].discard(job)
            if state == "queued":
                del worker_of[job]
        else:
            continue
        last[worker_of.get(job, event.get("worker_pid", -1))] = state
    return parts


def test_a_worker_gets_the_next_part_before_it_runs_dry(pytester: pytest.Pytester) -> None:
    result, events = _run(pytester, n=120, fail=-1)
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=120)
    assert _streamed(events) >= 1, "no part of a batch was sent while the worker had tests left"
    ends = [e for e in events if e["type"] == "job_end"]
    assert len(ends) == 120 and len({e["job"] for e in ends}) == 120


@pytest.mark.parametrize("fresh", [False, True], ids=["warm", "fresh-after-failure"])
def test_a_failure_in_a_streamed_batch_ends_every_test_once(
    pytester: pytest.Pytester, fresh: bool
) -> None:
    args = ("--devpool-fresh-after-failure",) if fresh else ()
    result, events = _run(pytester, 120, 37, *args)
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(passed=119, failed=1)
    ends = [e for e in events if e["type"] == "job_end"]
    assert sorted(e["job"] for e in ends) == sorted({e["job"] for e in ends})  # once each
    assert len(ends) == 120
    failed = [e for e in ends if e["outcome"] == "failed"]
    assert [e["nodeid"] for e in failed] == ["test_many.py::test_many[37]"]
    pids = {e["job"]: e["worker_pid"] for e in ends}
    after = {pids[e["job"]] for e in ends if e["job"] > failed[0]["job"]}
    if fresh:  # nothing more ran in the failed test's worker: the rest ran in another
        assert failed[0]["worker_pid"] not in after, (failed[0], after)
    else:  # an ordinary failure costs only its own outcome: the worker went on
        assert failed[0]["worker_pid"] in after, (failed[0], after)
