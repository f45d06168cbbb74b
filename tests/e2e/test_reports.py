"""End to end: the run record and every report made from it, in real processes on sim devices.

Each test writes a small target project, runs `python -m pytest` (or `devpool run`) on it
in a subprocess of its own session and checks what a user or a CI system would see: the
exit status, the terminal text, the run record, the step summary, the JUnit XML.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

# hypothesis's pytest plugin costs ~0.5 s per process start; workers inherit the arguments.
FAST = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-p", "no:randomly")
DEVPOOL = (sys.executable, "-m", "devpool.cli")
# Variables of the caller's CI that would change what the runs under test print.
_CALLER_ONLY = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "DEVPOOL_SUMMARY_BY_PARENT")

T = TypeVar("T")


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _CALLER_ONLY}
    base.update(extra)
    return base


def pytest_argv(lock: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *FAST, f"--devpool-lock-dir={lock}", *args]


def run(
    argv: list[str], cwd: Path, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=environ if environ is not None else env(),
        capture_output=True,
        text=True,
        timeout=90,
        start_new_session=True,
    )


def wait_for(condition: Callable[[], T], timeout: float, what: str) -> T:
    """Poll until condition() is truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}")
        time.sleep(0.01)


def events_so_far(record: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a record (a line being written or cut off is left out)."""
    try:
        raw = record.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def alive(pid: int) -> bool:
    """Whether a pid is a live pytest process (not gone, not a zombie, not reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and b"pytest" in cmdline


def kill_if_alive(pids: set[int]) -> None:
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def worker_pids(record: Path) -> set[int]:
    return {
        int(e["worker_pid"])
        for e in events_so_far(record)
        if e.get("type") == "job_start" and e.get("worker_pid")
    }


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return found


def project(root: Path, **files: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / f"{name}.py").write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def record_line(stdout: str) -> Path:
    found = re.findall(r"^devpool: run record (.+)$", stdout, re.MULTILINE)
    assert found, f"no 'devpool: run record' line in:\n{stdout}"
    return Path(found[-1].strip())


# ---- 1. the controller SIGKILLed in the middle of a run ----------------------------------

MANY = """
import pathlib
import time

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(200))
def test_many(i):
    time.sleep(0.02)
    if i >= 120:
        # Holds the second part of the run until the test has killed the controller,
        # so the kill always lands mid-run (bounded, in case nothing ever releases it).
        deadline = time.monotonic() + 60
        while not (HERE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
"""


def test_controller_sigkilled_mid_run_leaves_a_readable_record(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", test_many=MANY)
    record = tmp_path / "record.jsonl"
    argv = pytest_argv(
        tmp_path / "locks", "--devices", "sim:0-7", f"--devpool-run-record={record}", "-q"
    )
    workers: set[int] = set()
    with open(tmp_path / "out.txt", "wb") as out:
        controller = subprocess.Popen(
            argv, cwd=root, env=env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(
            lambda: (
                sum(e.get("type") == "job_end" for e in events_so_far(record)) >= 50
                or controller.poll() is not None
            ),
            60,
            "50 job_end lines in the record",
        )
        assert controller.poll() is None, (tmp_path / "out.txt").read_text()
        os.kill(controller.pid, signal.SIGKILL)
        assert controller.wait(timeout=30) == -signal.SIGKILL
        workers = worker_pids(record)
        assert workers, "the record names no worker pid"

        lines = events_so_far(record)
        assert not [e for e in lines if e.get("type") == "session_end"]
        ended = {e["nodeid"] for e in lines if e.get("type") == "job_end"}
        assert len(ended) >= 50 and all(
            e["outcome"] == "passed" for e in lines if e.get("type") == "job_end"
        )

        text = run([*DEVPOOL, "report", str(record)], tmp_path)
        assert text.returncode == 0, text.stderr
        assert "did not finish" in text.stdout
        assert f"{len(ended)} of 200 tests ran" in text.stdout
        assert "Traceback" not in text.stderr

        as_json = run([*DEVPOOL, "report", str(record), "--format", "json"], tmp_path)
        assert as_json.returncode == 0, as_json.stderr
        data = json.loads(as_json.stdout)
        assert data["finished"] is False
        passed = {job["nodeid"] for job in data["jobs"] if job["outcome"] == "passed"}
        assert passed == ended
        assert data["totals"]["passed"] == len(ended)
        # The tests running at the kill are "interrupted", the rest "not run".
        cut = data["totals"].get("interrupted", 0)
        assert data["totals"]["not run"] == 200 - len(ended) - cut
        assert cut == len(data["tests"].get("interrupted", []))

        # Workers die with their controller (PR_SET_PDEATHSIG): none of this run survives.
        wait_for(
            lambda: not [pid for pid in workers if alive(pid)],
            15,
            f"the workers {sorted(workers)} of the killed controller to die",
        )
    finally:
        (root / "release").touch()
        if controller.poll() is None:
            controller.kill()
            controller.wait(timeout=30)
        kill_if_alive(workers | worker_pids(record))


# ---- 2. GitHub Actions: annotations, fenced output, step summary ---------------------------

GH_TESTS = """
import pytest


@pytest.mark.device_count(1)
def test_pass():
    pass


def test_fail():
    assert 1 == 2, "gh-assert-marker"


def test_inject():
    print("::error::injected")
    print("::set-output name=a::b")
    assert False, "inject-marker"
"""


@dataclass
class GitHubRun:
    result: subprocess.CompletedProcess[str]
    lines: list[str]
    summary: str
    source: list[str]
    record: Path

    def line_of(self, name: str) -> int:
        return next(i for i, text in enumerate(self.source, 1) if text.startswith(f"def {name}("))


@pytest.fixture(scope="module")
def gh_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitHubRun]:
    tmp = tmp_path_factory.mktemp("gh")
    root = project(tmp / "proj", test_gh=GH_TESTS)
    summary = tmp / "step_summary.md"
    result = run(
        pytest_argv(tmp / "locks", "--devices", "sim:0-1", "test_gh.py"),
        root,
        env(GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary)),
    )
    text = summary.read_text(encoding="utf-8") if summary.exists() else ""
    source = (root / "test_gh.py").read_text(encoding="utf-8").splitlines()
    yield GitHubRun(result, result.stdout.splitlines(), text, source, record_line(result.stdout))


def test_github_one_annotation_per_failing_test_at_its_line(
    gh_run: GitHubRun, unfenced: Callable[[list[str]], list[str]]
) -> None:
    assert gh_run.result.returncode == 1, gh_run.result.stdout + gh_run.result.stderr
    annotations = [line for line in unfenced(gh_run.lines) if line.startswith("::error ")]
    for name in ("test_fail", "test_inject"):
        mine = [line for line in annotations if f"title=FAILED test_gh.py%3A%3A{name}" in line]
        assert len(mine) == 1, annotations
        assert mine[0].startswith(f"::error file=test_gh.py,line={gh_run.line_of(name)},")
    assert len(annotations) == 2
    assert not [line for line in annotations if "test_pass" in line]


def test_github_groups_every_job_and_fences_its_log(
    gh_run: GitHubRun, unfenced: Callable[[list[str]], list[str]]
) -> None:
    outside = unfenced(gh_run.lines)
    groups = [line for line in outside if line.startswith("::group::")]
    assert len(groups) == 3 and outside.count("::endgroup::") == 3
    assert any(g.startswith("::group::PASSED test_gh.py::test_pass [sim:") for g in groups)
    # The injected lines are in the log, inside a fence.
    assert "::error::injected" in gh_run.lines
    assert "::set-output name=a::b" in gh_run.lines


def test_github_test_output_cannot_inject_commands(
    gh_run: GitHubRun, unfenced: Callable[[list[str]], list[str]]
) -> None:
    outside = unfenced(gh_run.lines)
    injected = [
        line for line in outside if line.lstrip().startswith(("::error::injected", "::set-output"))
    ]
    assert injected == [], "test output reached the log outside every ::stop-commands:: fence"


def test_github_step_summary_has_totals_and_the_failing_tail(gh_run: GitHubRun) -> None:
    summary = gh_run.summary
    assert summary, "GITHUB_STEP_SUMMARY was not written"
    assert "| outcome | tests |" in summary
    assert "| passed | 1 |" in summary and "| failed | 2 |" in summary
    assert "gh-assert-marker" in summary and "inject-marker" in summary
    assert "test_gh.py::test_fail" in summary


def test_html_report_is_written(gh_run: GitHubRun, tmp_path: Path) -> None:
    if importlib.util.find_spec("devpool.report.html") is None:
        pytest.skip("devpool.report.html does not exist yet")
    out = tmp_path / "out.html"
    result = run([*DEVPOOL, "report", str(gh_run.record), "--html", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    assert "<html" in page.lower() and "test_gh.py::test_fail" in page


# ---- 3. the GitHub switch --------------------------------------------------------------------

ONE_PASS = """
def test_one():
    print("hello")
"""


def test_no_github_flag_wins_over_the_environment(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", test_one=ONE_PASS)
    argv = pytest_argv(tmp_path / "locks", "--devices", "sim:0", "--devpool-no-github")
    result = run(argv, root, env(GITHUB_ACTIONS="true"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "::group::" not in result.stdout
    assert "1 passed" in result.stdout


def test_github_flag_without_the_environment(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", test_one=ONE_PASS)
    argv = pytest_argv(tmp_path / "locks", "--devices", "sim:0", "--devpool-github")
    result = run(argv, root, env())
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("::group::")] == [
        line for line in lines if line.startswith("::group::PASSED test_one.py::test_one [cpu]")
    ]
    assert lines.count("::endgroup::") == 1


# ---- 4. --junitxml properties ----------------------------------------------------------------

JUNIT_TESTS = """
import time

import pytest


@pytest.mark.device_count(1)
def test_dev():
    pass


def test_cpu():
    pass


@pytest.mark.timeout(1)
def test_slow():
    time.sleep(60)
"""


def test_junitxml_testcases_carry_devpool_properties(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", test_j=JUNIT_TESTS)
    xml = tmp_path / "junit.xml"
    result = run(pytest_argv(tmp_path / "locks", "--devices", "sim:0-1", f"--junitxml={xml}"), root)
    assert result.returncode == 1, result.stdout + result.stderr
    cases = {case.get("name"): case for case in ET.parse(xml).getroot().iter("testcase")}
    assert set(cases) == {"test_dev", "test_cpu", "test_slow"}
    props = {
        name: {p.get("name"): p.get("value") for p in case.iter("property")}
        for name, case in cases.items()
    }
    # Only what says something: the devices a test held, an outcome pytest has no word for.
    assert set(props["test_dev"]) == {"devpool.devices"}
    assert re.fullmatch(r"sim:[01]", props["test_dev"]["devpool.devices"])
    assert props["test_cpu"] == {}
    assert props["test_slow"] == {"devpool.outcome": "timeout"}
    assert cases["test_slow"].find("failure") is not None


JUNIT_SUITE = """
import time

import pytest


def test_warm_up():
    time.sleep({sleep})


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.device_count({devices})
def test_kernel_matches_reference(dtype):
    pass


class TestScheduler:
    @pytest.mark.parametrize("size", [1, 8, 64])
    def test_plan_is_stable(self, size):
        pass

    def test_empty_plan(self):
        pass


def test_{failing}():
    assert {failing!r} != "fails"
"""


def test_junitxml_is_plain_pytests_order_and_size(tmp_path: Path) -> None:
    """Plain pytest's own file is the oracle: testcases in its (collection) order, not the
    order tests ended in; a green run's file at most 1.5x its size; attempts where tests
    ran again."""
    files = {
        f"test_{name}": JUNIT_SUITE.format(devices=devices, failing=failing, sleep=sleep)
        for name, devices, failing, sleep in (
            ("attention", 1, "plain_helper", 0.5),  # collected first, ends last
            ("collectives", 2, "plain_helper", 0),
            ("optimizer", 1, "fails", 0),
        )
    }
    root = project(tmp_path / "proj", **files)
    plain_xml, ours_xml = tmp_path / "plain.xml", tmp_path / "ours.xml"
    plain = run([sys.executable, "-m", "pytest", *FAST, f"--junitxml={plain_xml}"], root)
    argv = pytest_argv(tmp_path / "locks", "--devices", "sim:0-3", f"--junitxml={ours_xml}")
    ours = run([*argv, "--devpool-reruns=1"], root)
    assert ours.returncode == plain.returncode == 1, ours.stdout + ours.stderr

    def cases(path: Path) -> list[tuple[str | None, str | None]]:
        return [(c.get("classname"), c.get("name")) for c in ET.parse(path).iter("testcase")]

    assert cases(ours_xml) == cases(plain_xml)
    failing = next(c for c in ET.parse(ours_xml).iter("testcase") if c.get("name") == "test_fails")
    failing_props = {p.get("name"): p.get("value") for p in failing.iter("property")}
    assert failing_props == {"devpool.attempt": "2"}
    assert failing.find("rerunFailure") is not None

    # A green run: the same suite, the failing test deselected in both.
    plain_xml.unlink()
    ours_xml.unlink()
    run([sys.executable, "-m", "pytest", *FAST, "-k", "not fails", f"--junitxml={plain_xml}"], root)
    green = run([*argv, "-k", "not fails"], root)
    assert green.returncode == 0, green.stdout + green.stderr
    assert cases(ours_xml) == cases(plain_xml)
    ratio = ours_xml.stat().st_size / plain_xml.stat().st_size
    assert ratio <= 1.5, (ratio, ours_xml.read_text())
    header = '<?xml version="1.0" encoding="utf-8"?>'
    assert ours_xml.read_text().startswith(header) and plain_xml.read_text().startswith(header)


# ---- 5. devpool run: the exit code survives pipes and kills -------------------------------

FAILING_SUITE = """
def test_ok():
    pass


def test_bad():
    assert 1 == 2, "run-marker"
"""

BLOCKING_SUITE = """
import pathlib
import time

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.mark.device_count(1)
def test_block():
    (HERE / "started").touch()
    deadline = time.monotonic() + 60
    while not (HERE / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_other():
    pass
"""


def devpool_run_argv(record: Path, suite: Path, lock: Path) -> list[str]:
    return [
        *DEVPOOL,
        "run",
        "--run-record",
        str(record),
        "--",
        str(suite),
        "--devices",
        "sim:0-1",
        f"--devpool-lock-dir={lock}",
        "-q",
        *FAST,
    ]


def test_devpool_run_returns_pytests_code_where_tee_hides_it(tmp_path: Path) -> None:
    suite = project(tmp_path / "suite", test_s=FAILING_SUITE)
    record = tmp_path / "out" / "r.jsonl"
    argv = devpool_run_argv(record, suite, tmp_path / "L")
    piped = " ".join(f"'{part}'" for part in argv) + f" | tee '{tmp_path / 'log.txt'}'"
    shell = run(["bash", "-c", piped], tmp_path)
    assert shell.returncode == 0, "without pipefail the pipeline reports tee's 0"
    assert "1 failed" in (tmp_path / "log.txt").read_text()
    assert (record.parent / "exitcode").read_text().strip() == "1"

    # Directly, under GitHub Actions: pytest's code, and one step summary (the parent's).
    record2 = tmp_path / "out2" / "r.jsonl"
    summary = tmp_path / "summary.md"
    direct = run(
        devpool_run_argv(record2, suite, tmp_path / "L"),
        tmp_path,
        env(GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary)),
    )
    assert direct.returncode == 1, direct.stdout + direct.stderr
    assert (record2.parent / "exitcode").read_text().strip() == "1"
    assert "1 failed, 1 passed" in direct.stdout
    text = summary.read_text(encoding="utf-8")
    assert text.count("## devpool:") == 1 and "run-marker" in text


def test_devpool_run_summarises_a_killed_pytest(tmp_path: Path) -> None:
    suite = project(tmp_path / "suite", test_b=BLOCKING_SUITE)
    record = tmp_path / "out" / "r.jsonl"
    workers: set[int] = set()
    with open(tmp_path / "stdout.txt", "wb") as out, open(tmp_path / "stderr.txt", "wb") as err:
        wrapper = subprocess.Popen(
            devpool_run_argv(record, suite, tmp_path / "L"),
            cwd=tmp_path,
            env=env(),
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: (suite / "started").exists() or wrapper.poll() is not None,
            60,
            "the blocking test to start",
        )
        assert wrapper.poll() is None, (tmp_path / "stderr.txt").read_text()
        workers = worker_pids(record)
        kids = children(wrapper.pid)
        assert len(kids) == 1, kids
        pytest_pid = kids[0]
        workers.add(pytest_pid)  # cleaned up below if anything goes wrong
        assert b"pytest" in Path(f"/proc/{pytest_pid}/cmdline").read_bytes()
        os.kill(pytest_pid, signal.SIGKILL)

        assert wrapper.wait(timeout=60) == 128 + signal.SIGKILL
        stderr = (tmp_path / "stderr.txt").read_text()
        assert "did not finish" in stderr and "of 2 tests ran" in stderr
        assert "exit code 137" in stderr
        assert (record.parent / "exitcode").read_text().strip() == "137"
        wait_for(
            lambda: not [pid for pid in workers if alive(pid)],
            15,
            f"pytest and its workers {sorted(workers)} to die",
        )
    finally:
        (suite / "release").touch()
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait(timeout=30)
        kill_if_alive(workers | worker_pids(record))
