"""The run loop driven by scripted workers (tests/run/fake_backend.py): routing, retries,
requeues, timeouts, -x, fatal patterns and the run-alone rule are run/'s decisions alone,
with no worker process (one controller per test)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

FAKE = Path(__file__).with_name("fake_backend.py")


def run(
    pytester: pytest.Pytester, names: list[str], *args: str, body: str = ""
) -> tuple[Any, list[dict]]:
    """A controller on scripted workers over tests with these names (or this module body);
    its record's attempt moves, job ends and device events."""
    pytester.makepyfile(fake_backend=FAKE.read_text(encoding="utf-8"))
    pytester.makepyfile(test_s=body or "".join(f"def {name}(): pass\n" for name in names))
    record = pytester.path / "record.jsonl"
    (pytester.path / "locks").mkdir()
    result = pytester.runpytest_subprocess(
        *("-p", "devpool.plugin", "-p", "no:cacheprovider", "-p", "no:randomly"),
        *("-p", "fake_backend", f"--devpool-lock-dir={pytester.path / 'locks'}"),
        f"--devpool-run-record={record}",
        *args,
        timeout=60,
    )
    lines = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    kept = ("attempt", "job_end", "device_bad", "device_suspect", "device_ok")
    return result, [e for e in lines if e["type"] in kept]


def ends(events: list[dict], name: str) -> list[tuple[int, str]]:
    """Each attempt of the test and how it ended."""
    return [
        (e["attempt"], e["outcome"])
        for e in events
        if e["type"] == "job_end" and e["test"].endswith(name)
    ]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def test_each_ending_reaches_pytest_and_a_crash_is_retried(pytester: pytest.Pytester) -> None:
    names = ["test_pass_a", "test_fail_b", "test_skip_c", "test_crash_d", "test_crash_once_e"]
    result, attempts = run(pytester, [*names, "test_missing_f"], "--devices", "sim:0-1")
    outcomes = result.parseoutcomes()
    assert {k: outcomes.get(k) for k in ("passed", "failed", "skipped", "crashed")} == {
        "passed": 1,
        "failed": 1,
        "skipped": 1,
        "crashed": 1,
    }, result.stdout.str()
    assert outcomes.get("flaky") == 1 and outcomes.get("infra") == 1
    # --devpool-reruns-infra (1): a crash runs once more; a failure does not.
    assert ends(attempts, "test_crash_d") == [(1, "crashed"), (2, "crashed")]
    assert ends(attempts, "test_fail_b") == [(1, "failed")]
    assert ends(attempts, "test_crash_once_e") == [(1, "crashed"), (2, "flaky")]
    # A test its worker did not collect ends infra, with the reason said.
    result.stdout.fnmatch_lines(["*INFRA*the worker did not collect test_s.py::test_missing_f*"])


def test_the_tests_batched_behind_a_crash_go_back_untouched(pytester: pytest.Pytester) -> None:
    names = ["test_crash_a", "test_pass_b", "test_pass_c", "test_pass_d"]
    result, attempts = run(pytester, names, "--devices", "sim:0", "--devpool-cpu-slots=1")
    assert result.parseoutcomes().get("passed") == 3, result.stdout.str()
    sent_back = [e for e in attempts if e.get("state") == "queued"]
    assert sent_back, attempts  # the crash's batch held others: they were sent back
    for event in sent_back:
        assert event["attempt"] == 1  # no attempt of theirs: the same attempt runs later
        assert "ended before it ran" in event["reason"]
        assert ends(attempts, event["nodeid"]) == [(1, "passed")]


def test_a_hung_test_times_out_with_its_stacks_and_the_run_goes_on(
    pytester: pytest.Pytester,
) -> None:
    names = ["test_hang_a", "test_pass_b"]
    result, attempts = run(
        pytester,
        names,
        *("--devices", "sim:0", "--devpool-cpu-slots=1"),
        *("--devpool-test-timeout=0.5", "--devpool-timeout-grace=0.2"),
    )
    outcomes = result.parseoutcomes()
    assert (outcomes.get("timeout"), outcomes.get("passed")) == (1, 1), result.stdout.str()
    assert ends(attempts, "test_hang_a") == [(1, "timeout")]  # no rerun unless asked
    assert ends(attempts, "test_pass_b") == [(1, "passed")]
    states = [
        e["state"] for e in attempts if e["type"] == "attempt" and e["nodeid"].endswith("hang_a")
    ]
    assert "timed-out" in states, states
    result.stdout.fnmatch_lines(
        [
            "*TIMEOUT*test_hang_a*exceeded its 0.5s limit; stacks dumped*",
            "*(a scripted worker has no stacks)*",  # what dump_stacks wrote, in its report
        ]
    )


def test_a_long_timeout_passes_at_once_on_the_scripted_clock(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop reads its time from run/clock.py: on the backend's clock, a 60 s deadline,
    the stacks' wait and the grace after SIGTERM all pass while the backend waits on
    nothing, so the run ends in real seconds with the test's timeout said."""
    monkeypatch.setenv("SCRIPTED_CLOCK", "1")
    began = time.monotonic()
    result, attempts = run(
        pytester,
        ["test_hang_a", "test_pass_b"],
        *("--devices", "sim:0", "--devpool-cpu-slots=1"),
        *("--devpool-test-timeout=60", "--devpool-timeout-grace=30"),
    )
    assert time.monotonic() - began < 30, result.stdout.str()  # far under one deadline
    outcomes = result.parseoutcomes()
    assert (outcomes.get("timeout"), outcomes.get("passed")) == (1, 1), result.stdout.str()
    assert ends(attempts, "test_hang_a") == [(1, "timeout")]
    result.stdout.fnmatch_lines(["*TIMEOUT*test_hang_a*exceeded its 60s limit*"])


def test_a_failure_runs_again_under_reruns_and_gates_once(pytester: pytest.Pytester) -> None:
    result, attempts = run(
        pytester, ["test_fail_a", "test_pass_b"], "--devices", "sim:0", "--devpool-reruns=1"
    )
    outcomes = result.parseoutcomes()
    assert (outcomes.get("failed"), outcomes.get("rerun"), outcomes.get("passed")) == (1, 1, 1)
    assert ends(attempts, "test_fail_a") == [(1, "failed"), (2, "failed")]
    failed = [e for e in attempts if e["type"] == "job_end" and e["test"].endswith("test_fail_a")]
    # The first attempt is a RERUN that gates nothing; the last one is the test's ending.
    assert [(e["retried"], e["gating"]) for e in failed] == [(True, False), (False, True)]
    assert failed[0]["worker_pid"] != failed[1]["worker_pid"]  # in a fresh worker


def test_x_stops_the_run_at_the_first_failure(pytester: pytest.Pytester) -> None:
    names = ["test_fail_a", "test_pass_b", "test_pass_c", "test_pass_d"]
    result, attempts = run(pytester, names, "--devices", "sim:0", "--devpool-cpu-slots=1", "-x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*stopping after 1 failures*"])
    # Tests already handed to the worker may finish; none is started after the stop, and
    # what did not start is said as not run.
    assert ends(attempts, "test_pass_d") == []
    result.stdout.fnmatch_lines(["NOT RUN  test_s.py::test_pass_d*"])
    for name in names:
        assert len(ends(attempts, name)) <= 1, name


def one_device_tests(first: str, others: int) -> str:
    tests = [first, *(f"test_pass_{i}" for i in range(others))]
    return "import pytest\n" + "".join(
        f"\n@pytest.mark.device_count(1)\ndef {name}(): pass\n" for name in tests
    )


def test_a_device_fatal_error_retires_the_device_and_the_run_goes_on(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyprojecttoml('[tool.devpool.fatal-patterns]\nsim = { device = ["lost"] }\n')
    body = one_device_tests("test_fail_lost", 6)  # its failure says "...test_fail_lost"
    result, events = run(pytester, [], "--devices", "sim:0-1", body=body)
    assert result.parseoutcomes() == {"failed": 1, "passed": 6}, result.stdout.str()
    [failed] = [e for e in events if e["type"] == "job_end" and e["outcome"] == "failed"]
    [bad] = [e for e in events if e["type"] == "device_bad"]
    assert bad["device"] == failed["devices"][0] and "test_fail_lost" in bad["reason"]
    after = events[events.index(bad) :]
    # Nothing is handed to the retired device after its error: the rest run on the other.
    assert not [e for e in after if e.get("state") == "sent" and e["devices"] == [bad["device"]]]
    result.stdout.fnmatch_lines([f"*retiring sim:{bad['device']} for this session*"])


def test_a_context_fatal_error_ends_the_worker_and_checks_the_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyprojecttoml('[tool.devpool.fatal-patterns]\nsim = { context = ["poisoned"] }\n')
    body = one_device_tests("test_fail_poisoned", 6)
    result, events = run(pytester, [], "--devices", "sim:0-1", body=body)
    assert result.parseoutcomes() == {"failed": 1, "passed": 6}, result.stdout.str()
    [failed] = [e for e in events if e["type"] == "job_end" and e["outcome"] == "failed"]
    [suspect] = [e for e in events if e["type"] == "device_suspect"]
    assert suspect["device"] == failed["devices"][0]
    after = events[events.index(suspect) :]
    # The poisoned worker is sent nothing more; the device is checked in a fresh process
    # and kept in service.
    sent = [e for e in after if e.get("state") == "sent"]
    assert all(e["worker_pid"] != failed["worker_pid"] for e in sent), sent
    assert [e["device"] for e in after if e["type"] == "device_ok"] == [suspect["device"]]
    assert not [e for e in events if e["type"] == "device_bad"]


def test_benchmarks_run_last_and_each_alone(pytester: pytest.Pytester) -> None:
    """The run-alone rule: a test that measures time (pytest-benchmark's fixture) runs with
    nothing else of the run beside it, after the rest, one at a time."""
    pytest.importorskip("pytest_benchmark")
    body = "".join(f"\ndef test_pass_bench_{c}(benchmark): pass\n" for c in "ab")
    body += "".join(f"\ndef test_pass_{i}(): pass\n" for i in range(6))
    result, events = run(
        pytester, [], "-p", "pytest_benchmark.plugin", "--devices", "sim:0-1", body=body
    )
    assert result.parseoutcomes() == {"passed": 8}, result.stdout.str()
    order = [(e["type"], e.get("state"), e["nodeid"].rsplit("::", 1)[1]) for e in events]
    sent = [name for kind, state, name in order if state == "sent"]
    # First in collection order, yet sent after every other test, and one at a time.
    assert sent[-2:] == ["test_pass_bench_a", "test_pass_bench_b"] or sent[-2:] == [
        "test_pass_bench_b",
        "test_pass_bench_a",
    ], order
    last_other_end = max(
        i for i, (k, _, n) in enumerate(order) if k == "job_end" and "bench" not in n
    )
    first, second = sent[-2:]
    assert order.index(("attempt", "sent", first)) > last_other_end, order
    assert order.index(("attempt", "sent", second)) > order.index(("job_end", None, first)), order
