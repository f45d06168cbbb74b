"""End to end: flaky tests, repeats, quarantine, artifacts and device health on sim devices.

Each test writes a small target project, runs it in a real pytest session (pytester, a
subprocess whose workers are processes too) and checks what a user would see: the exit
status, the closing line, the summary, the JUnit file and the run record. Every session
has a lock folder of its own. Nothing sleeps to wait: the suites under test never wait.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sessions import closing_line, events, job_ends, junit_cases, records, run, suite, text

BUSY = {"2": [{"pid": 4242, "user": "ci2"}]}
BUSY_TEXT = "device sim:2 busy: pid 4242 (user ci2)"


# ---- helpers ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_plugin_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in ("DEVPOOL_SIM_BUSY", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)


def one_error_sentence(result: pytest.RunResult, *words: str) -> str:
    """A usage error: exit 4, a single `ERROR:` line that names the problem, no traceback."""
    assert result.ret == 4, text(result)
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, text(result)
    assert "Traceback" not in text(result)
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


# ---- repeat: a test that fails only on device 2 --------------------------------------------


def test_repeat_shows_failures_only_on_the_bad_device(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    suite(
        pytester,
        out,
        "test_hunt.py",
        """
        @pytest.mark.device_count(1)
        def test_card(devpool_devices):
            assert devpool_devices != [2], "wrong sum on this card"
        """,
    )
    rec = pytester.path / "record.jsonl"
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0-3",
        "--devpool-repeat",
        "20",
        f"--devpool-run-record={rec}",
    )
    assert result.ret == 1, text(result)
    ends = [e for e in events(rec, "job_end") if not e["retried"]]
    assert len(ends) == 20
    assert sorted(e["nodeid"] for e in ends) == sorted(
        f"test_hunt.py::test_card[{turn}-20]" for turn in range(1, 21)
    )
    failed = [e for e in ends if e["outcome"] == "failed"]
    assert failed, "no repeat ran on device 2"
    assert all(e["devices"] == [2] for e in failed), failed
    assert all(e["outcome"] == "passed" for e in ends if e["devices"] != [2])
    used = {d for e in ends for d in e["devices"]}
    assert used == {0, 1, 2, 3}  # repeats spread over the devices

    output = text(result)
    assert "devpool: repeat results" in output
    (line,) = [
        line for line in result.outlines if "test_hunt.py::test_card" in line and "/20" in line
    ]
    passed = 20 - len(failed)
    assert line.startswith(f"{passed}/20 passed"), line
    assert f"failed on: sim:2 ×{len(failed)}" in line, line
    assert re.findall(r"sim:\d", line) == ["sim:2"], line
    assert f"{len(failed)} failed, {passed} passed" in closing_line(result)


# ---- the fake busy probe --------------------------------------------------------------------


def test_busy_device_is_never_handed_out(
    pytester: pytest.Pytester, out: Path, lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = pytester.path / "busy.json"
    busy.write_text(json.dumps(BUSY))
    monkeypatch.setenv("DEVPOOL_SIM_BUSY", str(busy))
    suite(
        pytester,
        out,
        "test_busy.py",
        """
        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(12))
        def test_one(n):
            record(f"one-{n}")


        @pytest.mark.device_count(4)
        def test_all_four():
            record("all-four")
        """,
    )
    rec = pytester.path / "record.jsonl"
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0-3",
        "--devpool-lease-timeout",
        "2.5",  # longer than one busy re-probe (2 s): the wait must not start over
        f"--devpool-run-record={rec}",
    )
    assert result.ret == 1, text(result)
    seen = records(out)
    assert sorted(seen) == sorted(f"one-{n}" for n in range(12)), seen
    assert all(r["devices"] in ("0", "1", "3") for r in seen.values()), seen
    leased = [e["devices"] for e in events(rec, "lease")]
    assert leased and all(2 not in devices for devices in leased), leased

    # The 4-device test cannot get a lease without the busy card: infra, naming it.
    (end,) = job_ends(rec, "test_all_four")
    assert end["outcome"] == "infra" and end["gating"], end
    assert BUSY_TEXT in end["detail"] and "--devpool-lease-timeout" in end["detail"], end
    output = text(result)
    assert f"devpool: {BUSY_TEXT} (not ours): not handing it out" in output
    assert "12 passed" in closing_line(result) and "1 infra" in closing_line(result)


@pytest.mark.parametrize("how", ["option", "pyproject"])
def test_no_probe_hands_out_the_busy_device(
    pytester: pytest.Pytester, out: Path, lock: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "pyproject":
        pytester.makepyprojecttoml("[tool.devpool]\nprobe = false\n")
    busy = pytester.path / "busy.json"
    busy.write_text(json.dumps({"0": [{"pid": 4242, "user": "ci2"}]}))
    monkeypatch.setenv("DEVPOOL_SIM_BUSY", str(busy))
    suite(
        pytester,
        out,
        "test_noprobe.py",
        """
        @pytest.mark.device_count(1)
        def test_one():
            record("one")
        """,
    )
    args = ["--devpool-no-probe"] if how == "option" else []
    result = run(pytester, lock, "--devices", "sim:0", *args)
    assert result.ret == 0, text(result)
    assert records(out)["one"]["devices"] == "0"
    assert "busy: pid 4242" not in text(result)


# ---- a fatal device error retires the device -------------------------------------------------

# devpool starts the biggest requests first. This suite needs the 8-device test to be
# queued behind the test that retires a device, so its conftest orders by collection.
COLLECTION_ORDER = """
import devpool.plan.jobs

devpool.plan.jobs.Job.priority = lambda self: (0.0, 0, self.index)
"""


def test_fatal_error_retires_the_device_and_the_run_goes_on(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    pytester.makeconftest(COLLECTION_ORDER)
    suite(
        pytester,
        out,
        "test_fatal.py",
        """
        # Eight at once on eight devices: exactly one of them lands on device 5.
        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(8))
        def test_first(n, devpool_devices):
            record(f"first-{n}")
            if devpool_devices == [5]:
                print("DEVPOOL-SIM-FATAL: card 5 fell off the bus")
                assert False, "device 5 is gone"


        @pytest.mark.device_count(8)
        def test_all_eight():
            record("all-eight")


        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("n", range(10))
        def test_after(n):
            record(f"after-{n}")
        """,
    )
    rec = pytester.path / "record.jsonl"
    result = run(pytester, lock, "--devices", "sim:0-7", f"--devpool-run-record={rec}")
    assert result.ret == 1, text(result)
    seen = records(out)
    firsts = [r for key, r in seen.items() if key.startswith("first-")]
    assert len(firsts) == 8
    assert sorted(r["devices"] for r in firsts) == [str(d) for d in range(8)], firsts
    after = [r for key, r in seen.items() if key.startswith("after-")]
    assert len(after) == 10, seen
    assert all(r["devices"] != "5" for r in after), after
    assert "all-eight" not in seen

    lines = events(rec)
    bad = [i for i, e in enumerate(lines) if e["type"] == "device_bad"]
    assert [lines[i]["device"] for i in bad] == [5], lines
    later = [e for e in lines[bad[0] :] if e["type"] in ("job_start", "lease")]
    assert later and all(5 not in e["devices"] for e in later), later
    failed = [e for e in events(rec, "job_end") if e["outcome"] == "failed"]
    assert [e["devices"] for e in failed] == [[5]], failed

    (eight,) = job_ends(rec, "test_all_eight")
    assert eight["outcome"] == "infra" and eight["gating"], eight
    assert "needs 8 sim devices; only 7 healthy remain" in eight["detail"], eight
    assert "sim:5" in eight["detail"]

    output = text(result)
    assert "devpool: device sim:5 retired: device error 'DEVPOOL-SIM-FATAL'" in output
    assert "only 7 healthy remain" in output
    closing = closing_line(result)
    assert "1 failed" in closing and "17 passed" in closing and "1 infra" in closing, closing


def test_fatal_patterns_table_replaces_the_default(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    pytester.makepyprojecttoml(
        """
        [tool.devpool.fatal-patterns]
        sim = ["card \\\\d+ melted"]
        """
    )
    suite(
        pytester,
        out,
        "test_melt.py",
        """
        @pytest.mark.device_count(2)
        def test_a_default_word_is_no_longer_fatal():
            print("DEVPOOL-SIM-FATAL")
            assert False


        @pytest.mark.device_count(1)
        def test_melts(devpool_devices):
            print(f"card {devpool_devices[0]} melted")
            assert False


        @pytest.mark.device_count(2)
        def test_z_needs_both():
            record("both")
        """,
    )
    result = run(pytester, lock, "--devices", "sim:0-1")
    assert result.ret == 1, text(result)
    output = text(result)
    retired = re.findall(r"devpool: device sim:(\d) retired: device error '(.*?)'", output)
    assert len(retired) == 1 and re.fullmatch(r"card \d melted", retired[0][1]), output
    # The 2-device tests run first (bigger first); after the retirement none is left to fail.
    assert "only 1 healthy remain" not in output
    assert records(out)["both"]["devices"] == "0,1"


# ---- reruns and flaky ----------------------------------------------------------------------

FLAKY = """
@pytest.mark.device_count(1)
def test_flaky():
    marker = OUT / "flaky-failed-once"
    if not marker.exists():
        marker.write_text("x")
        assert 1 == 2, "first attempt: stale value on the card"
"""


@pytest.mark.parametrize(("flaky_result", "code"), [("pass", 0), ("fail", 1)])
def test_flaky_test(
    pytester: pytest.Pytester, out: Path, lock: Path, flaky_result: str, code: int
) -> None:
    suite(pytester, out, "test_flaky.py", FLAKY)
    xml = pytester.path / "junit.xml"
    rec = pytester.path / "record.jsonl"
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0-1",
        "--devpool-reruns",
        "2",
        "--devpool-flaky-result",
        flaky_result,
        f"--junitxml={xml}",
        f"--devpool-run-record={rec}",
    )
    assert result.ret == code, text(result)
    closing = closing_line(result)
    assert "1 flaky" in closing and "1 rerun" in closing, closing
    assert "failed" not in closing, closing  # a flaky test is not counted as a failure
    ends = job_ends(rec, "test_flaky")
    assert [(e["outcome"], e["retried"]) for e in ends] == [("failed", True), ("flaky", False)]
    assert ends[1]["gating"] is (flaky_result == "fail")
    assert all(e["devices"] and Path(e["log"]).is_file() for e in ends), ends
    if flaky_result == "pass":
        assert "devpool: 1 flaky (failed, then passed on a rerun)" in text(result)
    else:
        assert "devpool: 1 test did not pass" in text(result)
    assert re.search(r"^FLAKY\s+test_flaky.py::test_flaky  \[sim:\d\]", text(result), re.M)

    (case,) = junit_cases(xml)
    assert case.get("name") == "test_flaky"
    if flaky_result == "pass":
        (flaky,) = case.findall("flakyFailure")
        assert "first attempt: stale value on the card" in (flaky.text or "")
        assert case.findall("rerunFailure") == [] and case.find("failure") is None
    else:
        # Gated: the testcase fails, and still carries the first attempt's failure.
        assert case.find("failure") is not None
        (earlier,) = case.findall("rerunFailure") + case.findall("flakyFailure")
        assert "first attempt: stale value on the card" in (earlier.text or "")


def test_reruns_keep_every_attempt(pytester: pytest.Pytester, out: Path, lock: Path) -> None:
    suite(
        pytester,
        out,
        "test_retry.py",
        """
        @pytest.mark.device_count(1)
        def test_always():
            assert 0, "broken for real"


        @pytest.mark.device_count(1)
        def test_crash(devpool_devices):
            record(f"crash-{os.getpid()}")
            if not (OUT / "crashed-once").exists():
                (OUT / "crashed-once").write_text("x")
                os._exit(7)
        """,
    )
    xml = pytester.path / "junit.xml"
    rec = pytester.path / "record.jsonl"
    result = run(
        pytester,
        lock,
        "--devices",
        "sim:0-1",
        "--devpool-reruns",
        "2",
        "--devpool-reruns-infra",
        "1",
        f"--junitxml={xml}",
        f"--devpool-run-record={rec}",
    )
    assert result.ret == 1, text(result)
    closing = closing_line(result)
    # The crash that passed on its rerun is flaky too.
    assert "1 failed" in closing and "3 rerun" in closing and "1 flaky" in closing, closing
    assert "passed" not in closing, closing

    # The crash ran again once, in a fresh worker.
    pids = [r["pid"] for key, r in records(out).items() if key.startswith("crash-")]
    assert len(pids) == 2 and pids[0] != pids[1], pids
    crash = job_ends(rec, "test_crash")
    assert [(e["outcome"], e["retried"], e["attempt"]) for e in crash] == [
        ("crashed", True, 1),
        ("flaky", False, 2),
    ]
    assert crash[0]["worker_pid"] != crash[1]["worker_pid"]
    assert crash[0]["devices"] and crash[1]["devices"]
    assert Path(crash[0]["log"]).is_file() and "exited with code 7" in crash[0]["detail"]

    always = job_ends(rec, "test_always")
    assert [(e["outcome"], e["retried"]) for e in always] == [
        ("failed", True),
        ("failed", True),
        ("failed", False),
    ]
    for attempt in always:
        assert attempt["devices"], attempt
        assert "broken for real" in Path(attempt["log"]).read_text(), attempt
    assert len({e["log"] for e in always}) == 3

    cases = {case.get("name"): case for case in junit_cases(xml)}
    assert sorted(cases) == ["test_always", "test_crash"]
    case = cases["test_always"]
    assert len(case.findall("failure")) == 1
    reruns = case.findall("rerunFailure")
    assert len(reruns) == 2 and all("broken for real" in (r.text or "") for r in reruns)
    assert case.findall("flakyFailure") == []
    assert len(cases["test_crash"].findall("flakyFailure")) == 1


# ---- quarantine ----------------------------------------------------------------------------

FAILING = """
def test_a():
    assert 0, "known bad a"


def test_b():
    assert 0, "known bad b"


def test_ok():
    pass
"""


def assert_not_gating(result: pytest.RunResult, *names: str) -> None:
    assert result.ret == 0, text(result)
    closing = closing_line(result)
    assert f"{len(names)} quarantined" in closing and "failed" not in closing, closing
    lines = result.outlines
    (head,) = [i for i, line in enumerate(lines) if "quarantined, failed, not gating" in line]
    assert f"devpool: {len(names)} quarantined, failed, not gating" in lines[head]
    listed = lines[head + 1 : head + 1 + len(names)]
    for name in names:
        assert any(name in line and line.startswith("FAILED") for line in listed), lines


def test_quarantine_marker_does_not_gate(pytester: pytest.Pytester, out: Path, lock: Path) -> None:
    suite(
        pytester,
        out,
        "test_q.py",
        """
        @pytest.mark.quarantine(reason="races the allocator", owner="ana", until="2099-12-31")
        def test_a():
            assert 0, "known bad a"


        def test_ok():
            pass
        """,
    )
    result = run(pytester, lock, "--devices", "sim:0-1")
    assert_not_gating(result, "test_q.py::test_a")
    assert "races the allocator; owner ana; until 2099-12-31" in text(result)
    assert "WARNING" not in text(result)
    assert "1 passed" in closing_line(result)


def test_quarantine_table_and_file(
    pytester: pytest.Pytester, out: Path, lock: Path, tmp_path: Path
) -> None:
    pytester.makepyprojecttoml(
        """
        [tool.devpool.quarantine."test_t.py::test_a"]
        reason = "NCCL hang"
        owner = "ana"
        until = 2099-01-01
        """
    )
    qfile = tmp_path / "quarantine.toml"
    qfile.write_text(
        '["test_t.py::test_b"]\nreason = "driver bug"\n'
        '["test_t.py::test_gone"]\nreason = "deleted test"\n'
    )
    suite(pytester, out, "test_t.py", FAILING)
    result = run(pytester, lock, "--devices", "sim:0-1", f"--devpool-quarantine-file={qfile}")
    assert_not_gating(result, "test_t.py::test_a", "test_t.py::test_b")
    output = text(result)
    assert "NCCL hang; owner ana; until 2099-01-01" in output and "driver bug" in output
    warnings = [line for line in result.outlines if "WARNING" in line]
    assert len(warnings) == 1, warnings
    assert "'test_t.py::test_gone'" in warnings[0]
    assert "matches no collected test" in warnings[0]


def test_quarantine_scoped_to_another_platform_gates(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    pytester.makepyprojecttoml(
        """
        [tool.devpool.quarantine."test_s.py::test_a"]
        reason = "only bad on real GPUs"
        platforms = ["cuda"]

        [tool.devpool.quarantine."test_s.py::test_b"]
        reason = "bad on the simulator"
        platforms = ["sim"]
        """
    )
    suite(pytester, out, "test_s.py", FAILING)
    result = run(pytester, lock, "--devices", "sim:0-1")
    assert result.ret == 1, text(result)
    closing = closing_line(result)
    assert "1 failed" in closing and "1 quarantined" in closing, closing
    output = text(result)
    assert re.search(r"FAILED\s+test_s.py::test_a", output), output
    assert "matches no collected test" not in output  # out of scope here, not stale


EXPIRED = """
@pytest.mark.quarantine(reason="waiting for the driver", owner="bo", until="2020-01-31")
def test_old():
    assert 0, "still broken"
"""


def test_expired_quarantine_warns_loudly(pytester: pytest.Pytester, out: Path, lock: Path) -> None:
    suite(pytester, out, "test_e.py", EXPIRED)
    result = run(pytester, lock, "--devices", "sim:0")
    assert result.ret == 0, text(result)
    (warning,) = [line for line in result.outlines if "WARNING" in line]
    assert warning.startswith("devpool: WARNING: quarantine of test_e.py::test_old expired")
    assert "2020-01-31" in warning


def test_expired_quarantine_is_an_error_when_strict(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    suite(pytester, out, "test_e.py", EXPIRED)
    result = run(pytester, lock, "--devices", "sim:0", "--devpool-strict-quarantine")
    one_error_sentence(result, "test_e.py::test_old", "expired on 2020-01-31")
    assert not records(out)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ('reason = "r"\nuntil = "2026-13-01"', ("until='2026-13-01' is not a date",)),
        ('reason = "r"\nownr = "ana"', ("unknown key 'ownr'",)),
        ('owner = "ana"', ('needs reason = "',)),
    ],
    ids=["bad-date", "unknown-key", "no-reason"],
)
def test_malformed_quarantine_entry_is_one_sentence(
    pytester: pytest.Pytester, out: Path, lock: Path, fields: str, words: tuple[str, ...]
) -> None:
    pytester.makepyprojecttoml(f'[tool.devpool.quarantine."test_m.py::test_a"]\n{fields}\n')
    suite(pytester, out, "test_m.py", FAILING)
    result = run(pytester, lock, "--devices", "sim:0")
    one_error_sentence(result, "'test_m.py::test_a'", *words)


def test_malformed_quarantine_file_is_one_sentence(
    pytester: pytest.Pytester, out: Path, lock: Path, tmp_path: Path
) -> None:
    qfile = tmp_path / "q.toml"
    qfile.write_text('[quarantine."test_m.py::test_a"]\nreason = "r"\nuntil = "2026-13-01"\n')
    suite(pytester, out, "test_m.py", FAILING)
    result = run(pytester, lock, "--devices", "sim:0", f"--devpool-quarantine-file={qfile}")
    one_error_sentence(result, str(qfile), "2026-13-01")


# ---- artifacts -----------------------------------------------------------------------------

ARTIFACTS = """
def test_fails(devpool_artifacts):
    (devpool_artifacts / "out.txt").write_text("all zeros")
    record("fails", folder=str(devpool_artifacts))
    assert 0, "wrong values"


def test_passes(devpool_artifacts):
    (devpool_artifacts / "out.txt").write_text("fine")
    record("passes", folder=str(devpool_artifacts))
"""


def test_artifacts_kept_on_failure_removed_on_success(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    suite(pytester, out, "test_art.py", ARTIFACTS)
    rec = pytester.path / "record.jsonl"
    result = run(pytester, lock, "--devices", "sim:0-1", f"--devpool-run-record={rec}")
    assert result.ret == 1, text(result)
    seen = records(out)
    kept = Path(seen["fails"]["folder"])
    assert (kept / "out.txt").read_text() == "all zeros"
    assert kept.parent.name == "artifacts"
    assert f"  artifacts: {kept}" in result.outlines, text(result)
    (end,) = job_ends(rec, "test_fails")
    assert end["artifacts"] == str(kept)

    assert not Path(seen["passes"]["folder"]).exists()
    (end,) = job_ends(rec, "test_passes")
    assert end["artifacts"] is None


def test_keep_artifacts_keeps_passing_ones(
    pytester: pytest.Pytester, out: Path, lock: Path
) -> None:
    suite(pytester, out, "test_art.py", ARTIFACTS)
    result = run(pytester, lock, "--devices", "sim:0", "--devpool-keep-artifacts", "-k", "passes")
    assert result.ret == 0, text(result)
    kept = Path(records(out)["passes"]["folder"])
    assert (kept / "out.txt").read_text() == "fine"


# ---- devpool doctor --------------------------------------------------------------------------


def test_doctor_shows_probe_and_lock_folder(tmp_path: Path, lock: Path) -> None:
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps(BUSY))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOOL_")}
    environ["DEVPOOL_SIM_BUSY"] = str(busy)
    done = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "doctor", "--devices", "sim:0-3"]
        + ["--lock-dir", str(lock)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "probe sim:2: pid 4242 (user ci2)" in lines, done.stdout
    assert "probe sim:0: no other process" in lines, done.stdout
    assert any(line.startswith(f"lock folder {lock}: writable") for line in lines), done.stdout


def test_a_quarantined_test_that_kept_passing_is_ready_to_release(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(
        test_mended="""
        import pytest

        @pytest.mark.quarantine(reason="was flaky", owner="kai")
        def test_mended():
            pass
        """
    )
    history = pytester.path / "history.sqlite"
    for attempt in range(1, 6):
        result = run(pytester, lock, "--devices", "sim:0", f"--devpool-history={history}")
        assert result.ret == 0, text(result)
        ready = "test_mended.py::test_mended is quarantined but passed its last 5 runs"
        assert (ready in text(result)) == (attempt == 5), (attempt, text(result))
