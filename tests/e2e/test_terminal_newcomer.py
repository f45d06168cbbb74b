"""End to end: what a newcomer reads in the terminal (issue 13, part 6), on sim devices.

Each test writes a small target project, runs it in a real pytest session (pytester, a
subprocess whose workers are processes too) and reads the terminal as a user would: the
short test summary, FAILURES, devpool's summary block, -v lines, -x, the waiting line.
Nothing sleeps to wait: a target test that must wait for another waits on a condition.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sessions
from sessions import closing_line, suite, text

from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir


def run(pytester: pytest.Pytester, lock: Path, *args: str) -> pytest.RunResult:
    return sessions.run(pytester, lock, *args, timeout=90)


@pytest.fixture(autouse=True)
def _no_plugin_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in ("DEVPOOL_SIM_BUSY", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "CI"):
        monkeypatch.delenv(name, raising=False)


def section(result: pytest.RunResult, title: str) -> list[str]:
    """The lines of one `=== title ===` section of the terminal, up to the next one."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if re.match(rf"^=+ {title}.* =+$", line))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^=+ .* =+$", lines[i])), None)
    return lines[start + 1 : end]


def ran(out: Path) -> set[str]:
    return {path.stem for path in out.glob("*.json")}


# ---- 1-3: the short summary, FAILURES and devpool's block; a timeout's stacks -------------

ENDINGS = """
def test_pass():
    pass

def test_fail():
    print("printed by test_fail")
    assert 1 == 2

def test_crash():
    print("last words of test_crash", flush=True)
    os.kill(os.getpid(), 9)

def hang_here():
    time.sleep(120)  # the line the test hangs on

@pytest.mark.timeout(1)
def test_hang():
    hang_here()
"""


def test_crash_and_timeout_are_failures_shown_once_with_the_test_frame(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    suite(pytester, out, "test_end.py", ENDINGS)
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0-3",
        "-ra",
        "--devpool-reruns-infra",
        "0",
        "--devpool-timeout-grace",
        "1",
    )
    output = text(result)
    assert result.ret == 1, output

    # 1. The short summary lists the crash and the timeout, each with its own word and reason;
    # the closing line still counts each outcome apart.
    short = section(result, "short test summary info")
    assert "FAILED test_end.py::test_fail - assert 1 == 2" in short, short
    assert any(
        re.match(r"CRASHED test_end\.py::test_crash - worker pid \d+ was killed by SIGKILL", s)
        for s in short
    ), short
    assert any(
        s.startswith("TIMEOUT test_end.py::test_hang - exceeded its 1s limit") for s in short
    )
    assert len([s for s in short if not s.startswith("!")]) == 3, short
    closing = closing_line(result)
    for part in ("1 failed", "1 passed", "1 crashed", "1 timeout"):
        assert part in closing, closing
    assert "3 failed" not in closing and "error" not in closing, closing

    # FAILURES holds every failure in full, the crash and the timeout too.
    failures = section(result, "FAILURES")
    heads = [line.strip("_ ") for line in failures if re.match(r"^_{3,} \S+ _{3,}$", line)]
    assert sorted(heads) == ["test_crash", "test_fail", "test_hang"], failures
    assert "last words of test_crash" in failures

    # 2. Each failure's text appears once; devpool's block is short: outcome, test, devices,
    # reason, log, and a few last lines (no copy of the log's header).
    assert output.count(">       assert 1 == 2") == 1, output
    block = section(result, "devpool: 3 tests did not pass")
    assert any(
        re.match(r"^FAILED\s+test_end\.py::test_fail  \[cpu\]  .*assert 1 == 2", b) for b in block
    )
    assert not any(line.startswith("  | test:") or "request:" in line for line in block), block
    per_test = [line for line in block if not line.startswith("devpool: run record")]
    assert len(per_test) <= 3 * 2 + 5 + 5 + 20, block
    logs = [line.split("log: ", 1)[1] for line in block if line.startswith("  log: ")]
    assert len(logs) == 3 and all((pytester.path / log).is_file() for log in logs), block

    # 3. The timeout's stacks: the test's own frames and the line it hung on, the runner's
    # frames folded into one line, in FAILURES and in the tail devpool's block shows.
    for lines in (failures, block):
        shown = "\n".join(lines)
        assert re.search(r'File ".*test_end\.py", line \d+ in hang_here', shown), shown
        assert "time.sleep(120)  # the line the test hangs on" in shown, shown
        assert re.search(r'File ".*test_end\.py", line \d+ in test_hang', shown), shown
        assert re.search(r"\(\d+ frames of pytest, pluggy and devpool\)", shown), shown
    assert "pluggy/_callers.py" not in output and "_pytest/runner.py" not in output, output


# ---- 4: -v prints one whole line per test ---------------------------------------------------

VERBOSE = """
def test_a():
    record("a")
    wait_until(lambda: (OUT / "b.json").exists(), "test_b to start")

def test_b():
    record("b")
    wait_until(lambda: (OUT / "a.json").exists(), "test_a to start")
    assert 0, "b fails"

def test_c():
    pass
"""


def test_verbose_lines_end_with_their_result(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    suite(pytester, out, "test_v.py", VERBOSE)
    # test_a and test_b run at the same time in two workers: their reports interleave.
    result = run(pytester, lock, "--devices", "sim:0-1", "--devpool-cpu-slots", "2", "-v")
    output = text(result)
    assert result.ret == 1, output
    # One whole line per report, naming where it ran as xdist names its worker ([gw0]).
    for name, word in (("test_a", "PASSED"), ("test_b", "FAILED"), ("test_c", "PASSED")):
        line = rf"^\[(sim:[\d,-]+|cpu)\] \[\s*\d+%\] {word} test_v\.py::{name} ?$"
        assert re.search(line, output, re.M), output
    assert not re.search(r"^test_v\.py::test_\w+ *$", output, re.M), output  # id, no result


# ---- 5: -x stops at the first failure -------------------------------------------------------

ONE_WORKER = """
@pytest.mark.parametrize("i", range(5))
def test_fails(i):
    record(f"ran{i}")
    assert 0, f"failure {i}"
"""


def test_maxfail_one_worker_stops_after_the_first_failure(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    suite(pytester, out, "test_x1.py", ONE_WORKER)
    # One CPU slot: one worker gets the tests in batches and must stop at the first failure.
    result = run(pytester, lock, "--devices", "sim:0", "--devpool-cpu-slots", "1", "-x")
    output = text(result)
    assert result.ret == 1, output
    assert "1 failed" in closing_line(result), output
    assert "stopping after 1 failures" in output, output
    assert len(ran(out)) == 1, ran(out)
    short = section(result, "short test summary info")
    assert [line for line in short if line.startswith("FAILED")] == [
        "FAILED test_x1.py::test_fails[0] - AssertionError: failure 0"
    ], output


SEVERAL_WORKERS = """
def job_ended(name):
    record = Path({record!r})
    if not record.exists():
        return False
    for line in record.read_text().splitlines():
        if line.endswith("}") and json.loads(line).get("type") == "job_end":
            if json.loads(line).get("test", "").endswith(name):
                return True
    return False

@pytest.mark.device_count(2)
def test_first():
    record("first")
    wait_until(lambda: (OUT / "running.json").exists(), "test_running to start")
    assert 0, "the first failure"

@pytest.mark.device_count(2)
def test_running():
    record("running")
    wait_until(lambda: job_ended("test_first"), "test_first to end")

@pytest.mark.device_count(2)
@pytest.mark.parametrize("i", range(3))
def test_later(i):
    record(f"later{i}")
"""


def test_maxfail_starts_nothing_after_the_first_failure(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    rec = pytester.path / "record.jsonl"
    suite(pytester, out, "test_x2.py", SEVERAL_WORKERS.replace("{record!r}", repr(str(rec))))
    result = run(pytester, lock, "--devices", "sim:0-3", "-x", f"--devpool-run-record={rec}")
    output = text(result)
    assert result.ret == 1, output
    # The test already running when the first failed ends and is reported, as under
    # pytest-xdist; nothing waiting starts after the failure.
    assert ran(out) == {"first", "running"}, ran(out)
    closing = closing_line(result)
    assert "1 failed" in closing and "1 passed" in closing, closing
    assert "stopping after 1 failures" in output, output
    starts = [e for e in _events(rec) if e["type"] == "job_start"]
    assert sorted(e["nodeid"].split("::")[1] for e in starts) == ["test_first", "test_running"]


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- 6: the waiting line --------------------------------------------------------------------


@pytest.fixture
def other_run(lock: Path) -> Iterator[Lease]:
    """Another run's lease on sim:0 and sim:1, held by this process."""
    holder = Holder.for_this_process("other-session", "tests/other.py::t")
    got = LockDir(lock).try_acquire("sim", [0, 1], holder)
    assert isinstance(got, Lease), got
    yield got
    got.release()


WAITING = """
@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(4))
def test_one_device(i):
    record(f"t{i}")
"""


def test_waiting_line_is_said_once_per_holder(
    pytester: pytest.Pytester, out: Path, lock: Path, other_run: Lease
) -> None:
    suite(pytester, out, "test_w.py", WAITING)
    # Only sim:2 is free: every test waits its turn there, rechecking sim:0-1 meanwhile.
    result = run(pytester, lock, "--devices", "sim:0-2")
    output = text(result)
    assert result.ret == 0, output
    assert ran(out) == {"t0", "t1", "t2", "t3"}
    waiting = [line for line in result.outlines if "waiting for devices held by" in line]
    assert len(waiting) == 1, waiting
    (line,) = waiting
    assert f"pid {os.getpid()}" in line and "other-session" in line, line
    assert line.count(" held by pid ") == 1, line  # one run, named once, whatever it holds
    assert "(this run needs 1 sim device of 3)" in line, line  # what it waits for


# ---- 7: a flaky test links every attempt's log ------------------------------------------------

FLAKY = """
@pytest.mark.device_count(1)
def test_flaky():
    marker = OUT / "failed-once"
    if not marker.exists():
        marker.write_text("x")
        assert 1 == 2, "first attempt fails"
"""


@pytest.mark.parametrize("flaky_result", ["pass", "fail"])
def test_flaky_links_every_attempt_log(
    pytester: pytest.Pytester, out: Path, lock: Path, flaky_result: str
) -> None:
    suite(pytester, out, "test_k.py", FLAKY)
    rec = pytester.path / "record.jsonl"
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0-1",
        "--devpool-reruns",
        "1",
        "--devpool-flaky-result",
        flaky_result,
        f"--devpool-run-record={rec}",
    )
    output = text(result)
    assert result.ret == (0 if flaky_result == "pass" else 1), output
    ends = [e for e in _events(rec) if e["type"] == "job_end"]
    attempt_logs = [e["log"] for e in sorted(ends, key=lambda e: e["attempt"])]
    assert len(attempt_logs) == 2 and all(Path(log).is_file() for log in attempt_logs), ends
    shown = [Path(p) for p in re.findall(r"\S+\.log", _flaky_lines(output, flaky_result))]
    assert [(pytester.path / p).resolve() for p in shown] == [
        Path(log).resolve() for log in attempt_logs
    ], output


def _flaky_lines(output: str, flaky_result: str) -> str:
    """The summary's lines about the flaky test: the logs they name, in order."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^FLAKY\s+test_k\.py", line))
    if flaky_result == "pass":  # one line: logs of every attempt, first to last
        return lines[start].split("logs: ", 1)[1]
    # Gated: `log:` (the last attempt) and `earlier attempts:` lines under it.
    log = next(line for line in lines[start:] if line.startswith("  log: "))
    earlier = next(line for line in lines[start:] if line.startswith("  earlier attempts: "))
    return earlier.split(": ", 1)[1] + " " + log.split(": ", 1)[1]


# ---- issue 21: notes that do not apply to the run -----------------------------------------


def test_sim_memory_note_names_no_nvidia_library(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        test_m="""
        import pytest

        @pytest.mark.device_memory("1GiB")
        def test_m():
            pass
        """
    )
    result = run(pytester, tmp_path / "locks", "--devices", "sim:0-1")
    assert result.ret == 0, text(result)
    assert "memory of sim devices is unknown" in text(result)  # the note is there ...
    assert "pynvml" not in text(result)  # ... without advice that cannot apply to sim


def test_a_run_with_every_test_deselected_says_nothing_of_the_fork_server(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(
        test_d="""
        import pytest

        @pytest.mark.device_count(1)
        def test_dev():
            pass

        def test_cpu():
            pass
        """
    )
    result = run(pytester, tmp_path / "locks", "--devices", "sim:0-1", "-k", "no_such_test")
    assert result.ret == 5, text(result)  # pytest's own: no tests ran
    assert "fork server" not in text(result)
