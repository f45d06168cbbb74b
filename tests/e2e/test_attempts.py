"""End to end: the attempt is the unit of truth (the hold-out cases of a real H200, on sim).

- A deadline ends only the attempt that owns it; once that attempt reported, it is void.
- Tests batched behind an attempt that ended abnormally go back to the queue untouched.
- A context error (the sim twin of a CUDA device-side assert) fails only its test: the
  poisoned worker is discarded, and the device is checked in a fresh process and kept.
  A device that fails its check is retired; a device-level error retires it at once.
- Only the failing test's own output counts, never another test's lines in a shared log.
- A worker that hangs at exit cannot hang the run.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from sessions import IN_ORDER, events

POISON = """
import atexit, os, signal, sys, time
import pytest


def poisoned():
    # As after a CUDA device-side assert: every later use in this process fails the same way.
    if os.environ.get("SIM_POISONED"):
        raise RuntimeError("DEVPOOL-SIM-CONTEXT: device-side assert triggered (poisoned)")


def poison():
    os.environ["SIM_POISONED"] = "1"
    atexit.register(time.sleep, 600)  # and the process hangs at exit, as CUDA's may
    print("DEVPOOL-SIM-CONTEXT: device-side assert triggered")
    raise AssertionError("index 1000 is out of bounds")
"""


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in ("DEVPOOL_SIM_BUSY", "DEVPOOL_SIM_HEALTH", "GITHUB_ACTIONS", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)


def run(pytester: pytest.Pytester, body: str, *args: str) -> tuple[pytest.RunResult, Path]:
    pytester.makepyfile(test_suite=POISON + textwrap.dedent(body))
    record = pytester.path / "record.jsonl"
    lock = pytester.path / "locks"
    lock.mkdir(exist_ok=True)
    result = pytester.runpytest_subprocess(
        *IN_ORDER,
        f"--devpool-lock-dir={lock}",
        f"--devpool-run-record={record}",
        "--devpool-timeout-grace=0.5",
        *args,
        timeout=120,
    )
    return result, record


def finals(record: Path) -> dict[str, str]:
    ends = [e for e in events(record, "job_end") if not e["retried"]]
    names = [e["nodeid"].split("::")[-1] for e in ends]
    assert len(names) == len(set(names)), names  # one final outcome each
    return {e["nodeid"].split("::")[-1]: e["outcome"] for e in ends}


def output(result: pytest.RunResult) -> str:
    return "\n".join(result.outlines + result.errlines)


def test_a_hang_ends_timeout_and_the_tests_batched_behind_it_pass(
    pytester: pytest.Pytester,
) -> None:
    result, record = run(
        pytester,
        """
        @pytest.mark.timeout(1)
        @pytest.mark.device_count(1)
        def test_a_hangs():
            time.sleep(600)

        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(6))
        def test_b_after(n):
            pass
        """,
        "--devices",
        "sim:0",
        "--devpool-reruns-infra=0",
    )
    assert result.ret == 1, output(result)
    seen = finals(record)
    assert seen.pop("test_a_hangs") == "timeout", output(result)
    assert set(seen.values()) == {"passed"} and len(seen) == 6, output(result)
    assert "0s limit" not in output(result)
    # Every attempt's moves are in the record; a timed-out one went through timed-out.
    moves = [e["state"] for e in events(record, "attempt") if e["nodeid"].endswith("a_hangs")]
    assert moves[-2:] == ["timed-out", "concluded"], moves


@pytest.mark.parametrize("sleep", [1.15, 1.3])
def test_a_test_that_reports_as_its_deadline_passes_kills_nothing_else(
    pytester: pytest.Pytester, sleep: float
) -> None:
    result, record = run(
        pytester,
        f"""
        @pytest.mark.timeout(1)
        @pytest.mark.device_count(1)
        def test_a_just_late():
            time.sleep({sleep})

        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(6))
        def test_b_after(n):
            time.sleep(0.1)
        """,
        "--devices",
        "sim:0",
        "--devpool-reruns-infra=0",
    )
    seen = finals(record)
    assert seen.pop("test_a_just_late") in ("passed", "timeout"), output(result)
    assert set(seen.values()) == {"passed"} and len(seen) == 6, output(result)
    assert "0s limit" not in output(result)


def test_a_context_error_fails_only_its_test_and_the_device_is_kept(
    pytester: pytest.Pytester,
) -> None:
    result, record = run(
        pytester,
        """
        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(3))
        def test_a_before(n):
            poisoned()

        @pytest.mark.device_count(1)
        def test_b_indexing_bug():
            poison()

        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(4))
        def test_c_after(n):
            poisoned()
        """,
        "--devices",
        "sim:0",
    )
    text = output(result)
    assert result.ret == 1, text
    seen = finals(record)
    assert seen.pop("test_b_indexing_bug") == "failed", text
    assert set(seen.values()) == {"passed"} and len(seen) == 7, text
    assert not events(record, "device_bad"), text
    (kept,) = events(record, "device_ok")
    assert kept["device"] == 0 and "DEVPOOL-SIM-CONTEXT" in kept["reason"], kept
    assert "sim:0 passed its health check after" in text, text
    assert "1 failed, 7 passed" in result.outlines[-1], text


def test_a_context_error_on_a_device_that_fails_its_check_retires_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    health = pytester.path / "health.json"
    health.write_text(json.dumps({"1": "ECC errors pending"}))
    monkeypatch.setenv("DEVPOOL_SIM_HEALTH", str(health))
    result, record = run(
        pytester,
        """
        @pytest.mark.device_count(1)
        def test_a_indexing_bug(devpool_devices):
            if devpool_devices == [1]:
                poison()

        @pytest.mark.device_count(2)
        def test_z_needs_two():
            pass
        """,
        "--devices",
        "sim:1-2",
        "--devpool-reruns-infra=0",
    )
    text = output(result)
    seen = finals(record)
    if seen["test_a_indexing_bug"] == "passed":
        pytest.skip("the test ran on the healthy device; nothing to check")  # pragma: no cover
    (bad,) = events(record, "device_bad")
    assert bad["device"] == 1 and "ECC errors pending" in bad["reason"], bad
    assert "health check failed" in text, text


def test_only_the_failing_tests_own_output_counts(pytester: pytest.Pytester) -> None:
    result, record = run(
        pytester,
        """
        @pytest.mark.device_count(1)
        def test_a_passes_but_prints_a_fatal_word():
            print("DEVPOOL-SIM-FATAL: said by a test that passed", file=sys.stderr)

        @pytest.mark.device_count(1)
        def test_b_fails_plainly():
            assert 1 == 2
        """,
        "--devices",
        "sim:0",
        "-s",
    )
    text = output(result)
    assert finals(record) == {
        "test_a_passes_but_prints_a_fatal_word": "passed",
        "test_b_fails_plainly": "failed",
    }, text
    assert not events(record, "device_bad"), text


def test_a_worker_that_hangs_at_exit_does_not_hang_the_run(pytester: pytest.Pytester) -> None:
    result, record = run(
        pytester,
        """
        @pytest.mark.device_count(1)
        def test_leaves_a_hang_at_exit():
            atexit.register(time.sleep, 600)
        """,
        "--devices",
        "sim:0",
    )
    assert result.ret == 0, output(result)
    assert finals(record) == {"test_leaves_a_hang_at_exit": "passed"}
