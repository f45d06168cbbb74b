"""A fleet of hardware classes in one queue run (issue 56): real devpool jobs of two platforms,
h100 and h200 (both simulated), sharing one run on a real PostgreSQL.

Each test appends the job that ran it to a file, so a test run twice, or by a job of another
class, is seen. The run's verdict is `devpool queue report`'s."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from devpool.queue.store import QueueStore
from pg_server import Server

FAST = ("-p", "devpool.plugin", "-p", "no:hypothesispytest", "-p", "no:cacheprovider")
FAST += ("-p", "no:randomly")
DEVPOOL = "import sys; from devpool.cli import main; sys.exit(main(sys.argv[1:]))"
_runs = itertools.count()

PYPROJECT = """
[tool.devpool.platforms]
h100 = "sim"
h200 = "sim"
"""

SUITE = """
import os
import time
from pathlib import Path

import pytest

OUT = Path({out!r})


def ran(name):
    with open(OUT / (name + ".runs"), "a") as handle:
        handle.write(os.environ["JOB"] + "\\n")


@pytest.mark.platforms(["h100"])
@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(3))
def test_h100(i):
    ran(f"h100_{{i}}")


@pytest.mark.platforms(["h200"])
@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(3))
def test_h200(i):
    ran(f"h200_{{i}}")
    if os.environ["JOB"] == "doomed":  # stops there: says so, then waits to be killed
        (OUT / f"h200_{{i}}.started").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.mark.device_count(1)
def test_any_device():
    ran("any")


def test_cpu():
    ran("cpu")
"""
H100 = [f"test_classes.py::test_h100[{i}]" for i in range(3)]
H200 = [f"test_classes.py::test_h200[{i}]" for i in range(3)]


def project(root: Path) -> Path:
    (root / "out").mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "test_classes.py").write_text(SUITE.format(out=str(root / "out")))
    return root


def env(name: str) -> dict[str, str]:
    found = {**os.environ, "JOB": name, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    found.pop("PYTEST_ADDOPTS", None)
    return found


def start(root: Path, name: str, platform: str, url: str, run: str, *more: str) -> Any:
    """One CI job of a platform: its own lock folder (as if on its own host), 2 devices."""
    lock = root / f"locks-{name}"
    lock.mkdir(exist_ok=True)
    args = [sys.executable, "-m", "pytest", *FAST, "test_classes.py", "-q"]
    args += [f"--devices={platform}:0-1", f"--devpool-lock-dir={lock}"]
    args += [f"--devpool-queue={url}", f"--devpool-queue-run={run}", *more]
    args += [f"--devpool-run-dir={root / ('run-' + name)}"]
    return subprocess.Popen(
        args, cwd=root, env=env(name), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip


def report(url: str, run: str, root: Path, wait: int = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DEVPOOL, "queue", "report", f"--devpool-queue={url}",
         f"--devpool-queue-run={run}", f"--junitxml={root / 'junit.xml'}", f"--wait={wait}"],
        cwd=root, env=env("report"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def ran_by(root: Path) -> dict[str, list[str]]:
    return {p.stem: p.read_text().split() for p in sorted((root / "out").glob("*.runs"))}


def finish(proc: Any) -> str:
    return str(proc.communicate(timeout=180)[0])


def new_run(kind: str) -> str:
    return f"{kind}-{time.time_ns()}-{next(_runs)}"


def wait_until(what: str, check: Any, proc: Any, bound: float = 90) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"waited {bound}s for {what}"
        time.sleep(0.05)


def published(url: str, run: str) -> bool:
    store = QueueStore(url, run)
    try:
        return store.published()
    finally:
        store.close()


def test_two_classes_share_one_run_the_h100_job_seeding(postgres: Server, tmp_path: Path) -> None:
    root = project(tmp_path)
    run = new_run("two")
    h100 = start(root, "h100", "h100", postgres.url, run)
    wait_until("the h100 job to publish the run", lambda: published(postgres.url, run), h100)
    h200 = start(root, "h200", "h200", postgres.url, run)
    outputs = {"h100": finish(h100), "h200": finish(h200)}
    assert (h100.returncode, h200.returncode) == (0, 0), outputs
    assert "this job published its 8 tests" in outputs["h100"]
    assert "joined it, same 8 tests" in outputs["h200"]
    runs = ran_by(root)
    assert all(len(jobs) == 1 for jobs in runs.values()), runs  # every test once
    assert set(runs) == {f"h100_{i}" for i in range(3)} | {f"h200_{i}" for i in range(3)} | {
        "any",
        "cpu",
    }
    for name, jobs in runs.items():  # each on a job of its class
        assert name[:4] not in ("h100", "h200") or jobs == [name[:4]], runs
    verdict = report(postgres.url, run, root)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "all tests passed (exit code 0)" in verdict.stdout
    assert "8 passed" in verdict.stdout
    assert "h100: 1 job, " in verdict.stdout and "h200: 1 job, " in verdict.stdout


def test_a_missing_class_is_not_green_and_a_declared_one_is(
    postgres: Server, tmp_path: Path
) -> None:
    root = project(tmp_path)
    alone = new_run("alone")
    h100 = start(root, "h100", "h100", postgres.url, alone)
    output = finish(h100)
    assert h100.returncode == 0, output
    verdict = report(postgres.url, alone, root)
    assert verdict.returncode == 6, verdict.stdout + verdict.stderr
    said = f"3 tests for h200: no h200 runner joined run {alone}"
    assert said in verdict.stdout
    assert f"3 tests not taken by a runner of their class: {said} (exit code 6)" in verdict.stdout
    assert "5 passed, 3 not taken" in verdict.stdout
    for test in H200:
        assert test in verdict.stdout
    cases = {c.get("name"): c for c in ET.parse(root / "junit.xml").getroot().iter("testcase")}
    failure = cases["test_h200[0]"].find("failure")
    assert failure is not None and said in str(failure.get("message"))
    # a run that covers h100 on purpose: the h200 tests are deselected, with the reason
    partial = new_run("partial")
    h100 = start(root, "h100b", "h100", postgres.url, partial, "--devpool-queue-classes=h100,h300")
    output = finish(h100)
    assert h100.returncode == 0, output
    assert "WARNING: --devpool-queue-classes names h300, which no test's" in output
    verdict = report(postgres.url, partial, root)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "5 passed, 3 deselected" in verdict.stdout
    assert f"3 tests for h200: deselected: run {partial} covers h100" in verdict.stdout
    names = [c.get("name") for c in ET.parse(root / "junit.xml").getroot().iter("testcase")]
    assert not [name for name in names if name.startswith("test_h200")]  # as pytest's file
    # an h200 job of that run claims nothing of its class: the run left it out
    h200 = start(root, "h200b", "h200", postgres.url, partial, "--devpool-queue-classes=h100,h300")
    output = finish(h200)
    assert h200.returncode == 0, output
    assert not [name for name, jobs in ran_by(root).items() if "h200b" in jobs]
    # bad input: an empty list of classes; a job declaring other classes than the run's
    empty = start(root, "empty", "h100", postgres.url, new_run("empty"), "--devpool-queue-classes=")
    output = finish(empty)
    assert empty.returncode == 4, output
    assert "--devpool-queue-classes must be platform names" in output
    assert "Traceback" not in output
    other = start(root, "other", "h100", postgres.url, partial, "--devpool-queue-classes=h200")
    output = finish(other)
    assert other.returncode == 4, output
    assert "every job of a run must declare the same" in output


def test_one_platform_name_means_one_kind(postgres: Server, tmp_path: Path) -> None:
    root = project(tmp_path)
    run = new_run("kinds")
    store = QueueStore(postgres.url, run)
    try:  # a job elsewhere that runs h100 on real CUDA devices
        store.join("gpu-host", 4242, 8, "h100", 30.0, kind="cuda")
    finally:
        store.close()
    job = start(root, "h100", "h100", postgres.url, run)
    output = finish(job)
    assert job.returncode == 4, output
    assert "on gpu-host runs platform 'h100' as kind 'cuda', this job (" in output
    assert "as kind 'sim'" in output and "Traceback" not in output


def test_a_killed_jobs_class_tests_wait_for_their_class(postgres: Server, tmp_path: Path) -> None:
    root = project(tmp_path)
    run = new_run("killed")
    lease = ("--devpool-queue-lease=2",)
    h100 = start(root, "h100", "h100", postgres.url, run, *lease)
    doomed = start(root, "doomed", "h200", postgres.url, run, *lease)
    started = lambda: sorted((root / "out").glob("*.started"))  # noqa: E731
    wait_until("the h200 job to start a test", started, doomed)
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=30)
    for path in started():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(path.read_text()), signal.SIGKILL)  # the test's own worker
    assert h100.communicate(timeout=180)[0] is not None and h100.returncode == 0
    # no h200 job is left: its claimed tests went back, and no job of their class took them
    verdict = report(postgres.url, run, root)
    assert verdict.returncode == 6, verdict.stdout + verdict.stderr
    assert "tests for h200: the h200 runners of run" in verdict.stdout
    assert "left or lost their lease first" in verdict.stdout
    # a job of the same class joins: it takes them, and the run is green
    survivor = start(root, "survivor", "h200", postgres.url, run, *lease)
    output = finish(survivor)
    assert survivor.returncode == 0, output
    runs = ran_by(root)
    for name, jobs in runs.items():  # each h200 test ended on the job of its class left
        if name.startswith("h200"):
            assert set(jobs) <= {"doomed", "survivor"}, runs
            assert jobs.count("survivor") == 1 or jobs == ["doomed"], runs
    verdict = report(postgres.url, run, root)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
