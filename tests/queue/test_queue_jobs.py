"""Real devpool sessions sharing one run through the queue: several jobs, a killed one, bad input.

Each job is a real pytest process with a lock folder of its own, as if on its own host, and
its own `--devices sim:...` count. Each test appends the job that ran it to a file, so a test
run twice, or by a job that could not hold it, is seen."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from devpool.history.durations import History, TestResult
from devpool.queue.store import QueueStore
from pg_server import Server

FAST = ("-p", "devpool.plugin", "-p", "no:hypothesispytest", "-p", "no:cacheprovider")
FAST += ("-p", "no:randomly")
_runs = itertools.count()
DEVPOOL = "import sys; from devpool.cli import main; sys.exit(main(sys.argv[1:]))"

SUITE = """
import json
import os
import time
from pathlib import Path

import pytest

OUT = Path({out!r})


def ran(name):
    with open(OUT / (name + ".runs"), "a") as handle:
        handle.write(os.environ["JOB"] + "\\n")


def block_in(job, name):
    # in the job the test stops: say so, then wait to be killed or let go (bounded)
    if os.environ["JOB"] != job:
        return
    (OUT / (name + ".started")).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (OUT / "go").exists():
        time.sleep(0.05)


@pytest.mark.parametrize("i", range({cpu}))
def test_cpu(i):
    ran(f"cpu{{i}}")
    block_in({block!r}, f"cpu{{i}}")
    time.sleep(0.05)


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(4))
def test_one(i):
    ran(f"one{{i}}")
    time.sleep(0.05)
    assert i != 3


@pytest.mark.device_count(2)
def test_two():
    ran("two")


@pytest.mark.device_count(4)
def test_four():
    ran("four")


@pytest.mark.device_count(8)
def test_eight():
    ran("eight")
"""


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "out").mkdir()
    yield tmp_path


def write_suite(root: Path, cpu: int = 8, block: str = "") -> None:
    text = SUITE.format(out=str(root / "out"), cpu=cpu, block=block)
    (root / "test_mix.py").write_text(text)


def start(
    root: Path, name: str, devices: int, url: str, run: str, *more: str
) -> subprocess.Popen[str]:
    """One CI job: its own lock folder and device count, the same command otherwise."""
    lock = root / f"locks-{name}"
    lock.mkdir(exist_ok=True)
    env = job_env(name)
    args = [sys.executable, "-m", "pytest", *FAST, "test_mix.py", "-q"]
    args += [f"--devices=sim:0-{devices - 1}", f"--devpool-lock-dir={lock}"]
    args += [f"--devpool-queue={url}", f"--devpool-queue-run={run}", *more]
    args += [f"--devpool-run-dir={root / ('run-' + name)}"]
    return subprocess.Popen(
        args, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def job_env(name: str) -> dict[str, str]:
    """A job's environment: plugins as FAST loads them, the job's name for the tests."""
    env = {**os.environ, "JOB": name, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def report(
    url: str, run: str, cwd: Path, junit: Path, wait: int = 30
) -> subprocess.CompletedProcess[str]:
    """`devpool queue report` of the run, its JUnit file written to `junit`."""
    return subprocess.run(
        [sys.executable, "-c", DEVPOOL, "queue", "report", f"--devpool-queue={url}",
         f"--devpool-queue-run={run}", f"--junitxml={junit}", f"--wait={wait}"],
        cwd=cwd, env=job_env("report"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def ran_by(root: Path) -> dict[str, list[str]]:
    """test name → the jobs that ran it, in order."""
    return {p.stem: p.read_text().split() for p in sorted((root / "out").glob("*.runs"))}


def queue_rows(url: str, run: str) -> dict[str, tuple[str, str | None]]:
    store = QueueStore(url, run)
    try:
        return {row.test_id: (row.state, row.outcome) for row in store.tests()}
    finally:
        store.close()


def wait_for(path: Path, proc: subprocess.Popen[str], bound: float = 60) -> None:
    deadline = time.monotonic() + bound
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"waited {bound}s for {path}"
        time.sleep(0.05)


def test_three_jobs_share_one_run(postgres: Server, project: Path) -> None:
    write_suite(project)
    run = f"three-{time.time_ns()}-{next(_runs)}"
    jobs = {
        name: start(project, name, devices, postgres.url, run)
        for name, devices in (("two", 2), ("four", 4), ("eight", 8))
    }
    outputs = {name: proc.communicate(timeout=240)[0] for name, proc in jobs.items()}
    codes = {name: proc.returncode for name, proc in jobs.items()}
    runs = ran_by(project)
    expected = {f"cpu{i}" for i in range(8)} | {f"one{i}" for i in range(4)}
    assert set(runs) == expected | {"two", "four", "eight"}, outputs
    assert all(len(who) == 1 for who in runs.values()), runs  # every test once
    assert runs["eight"] == ["eight"]
    assert runs["four"][0] in ("four", "eight")
    rows = queue_rows(postgres.url, run)
    assert len(rows) == 15
    assert all(state == "done" for state, _ in rows.values())
    assert rows["test_mix.py::test_one[3]"] == ("done", "failed")
    failing_job = runs["one3"][0]
    for name, code in codes.items():  # each job's exit code is the verdict of what it ran
        assert code == (1 if name == failing_job else 0), outputs[name]
    assert "test_one[3]" in outputs[failing_job]
    assert "this job published its 15 tests" in "".join(outputs.values())
    # each job's progress counts the tests it claimed: it ends at 100%, as a whole run does
    for name, output in outputs.items():
        shown = re.findall(r"\[ *(\d+)%\]", output)
        assert shown[-1:] == (["100"] if name in sum(runs.values(), []) else []), output
    # the run's one verdict: each test once, in collection order, exit as pytest's
    junit = project / "junit.xml"
    verdict = report(postgres.url, run, project, junit, wait=30)
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr
    assert "1 test did not pass: 1 failed (exit code 1)" in verdict.stdout
    assert "1 failed, 14 passed" in verdict.stdout  # the closing line's order
    names = [c.get("name") for c in ET.parse(junit).getroot().iter("testcase")]
    assert names == [f"test_cpu[{i}]" for i in range(8)] + [f"test_one[{i}]" for i in range(4)] + [
        "test_two",
        "test_four",
        "test_eight",
    ]


def test_a_killed_jobs_claims_go_to_another(postgres: Server, project: Path) -> None:
    write_suite(project, cpu=6, block="doomed")
    run = f"kill-{time.time_ns()}-{next(_runs)}"
    lease = ("--devpool-queue-lease=2",)
    doomed = start(project, "doomed", 2, postgres.url, run, *lease)
    started = next(iter(sorted((project / "out").glob("*.started"))), None)
    deadline = time.monotonic() + 120
    while started is None:
        assert doomed.poll() is None, doomed.communicate()[0]
        assert time.monotonic() < deadline, "the doomed job never reached its blocking test"
        time.sleep(0.05)
        started = next(iter(sorted((project / "out").glob("*.started"))), None)
    survivor = start(project, "survivor", 8, postgres.url, run, *lease)
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=30)
    worker = int(started.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker, signal.SIGKILL)  # the test's own worker, which the test told its pid
    output = survivor.communicate(timeout=240)[0]
    runs = ran_by(project)
    rows = queue_rows(postgres.url, run)
    assert all(state == "done" for state, _ in rows.values()), (rows, output)
    blocked = started.name.removesuffix(".started")
    assert runs[blocked] == ["doomed", "survivor"], output  # claimed, lost, run by the other
    assert rows[f"test_mix.py::test_cpu[{blocked[3:]}]"] == ("done", "passed")
    # every test once in the queue, whatever ran twice: the killed job reported nothing late
    assert sorted(rows) == sorted(
        [f"test_mix.py::test_cpu[{i}]" for i in range(6)]
        + [f"test_mix.py::test_one[{i}]" for i in range(4)]
        + ["test_mix.py::test_two", "test_mix.py::test_four", "test_mix.py::test_eight"]
    )
    # its exit code is the verdict of what it ran: test_one[3] fails wherever it runs
    assert survivor.returncode == (1 if "survivor" in runs["one3"] else 0), output
    # one verdict: every test once in the merged JUnit, the lost job's included
    junit = project / "junit.xml"
    verdict = report(postgres.url, run, project, junit, wait=30)
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr  # test_one[3] failed
    cases = [(c.get("name"), c) for c in ET.parse(junit).getroot().iter("testcase")]
    assert [name for name, _ in cases] == [t.split("::")[1] for t in rows]
    (lost,) = [c for name, c in cases if name == f"test_cpu[{blocked[3:]}]"]
    assert lost.find("failure") is None and lost.find("error") is None


def test_differing_collection_and_missing_run_id(postgres: Server, project: Path) -> None:
    write_suite(project, cpu=3)
    run = f"differ-{time.time_ns()}-{next(_runs)}"
    store = QueueStore(postgres.url, run)
    store.publish([], "elsewhere")
    store.close()
    job = start(project, "late", 2, postgres.url, run)
    output = job.communicate(timeout=120)[0]
    assert job.returncode == 4, output
    assert "this job's collection differs from queue run" in output
    assert "has 10 tests the run does not (test_mix.py::test_cpu[0]," in output
    assert "Traceback" not in output
    env = {k: v for k, v in job_env("x").items() if not k.startswith("GITHUB_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, "test_mix.py", "-q", "--devices=sim:0-1",
         f"--devpool-queue={postgres.url}", f"--devpool-lock-dir={project / 'l'}"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "--devpool-queue needs --devpool-queue-run=ID" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    both = subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, "test_mix.py", "-q", "--devices=sim:0-1",
         f"--devpool-queue={postgres.url}", "--devpool-queue-run=r", "--devpool-shard=1/2",
         f"--devpool-lock-dir={project / 'l'}"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert both.returncode == 4, both.stdout + both.stderr
    assert "--devpool-queue and --devpool-shard both split the suite" in both.stdout + both.stderr
    # without --devices devpool is off: every job would run every test, so it is refused
    off = subprocess.run(
        [sys.executable, "-m", "pytest", *FAST, "test_mix.py", "-q",
         f"--devpool-queue={postgres.url}", "--devpool-queue-run=r"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert off.returncode == 4, off.stdout + off.stderr
    assert "--devpool-queue needs --devices (auto, or this job's devices)" in off.stderr
    assert "Traceback" not in off.stdout + off.stderr


def test_result_carries_what_the_report_needs(postgres: Server, project: Path) -> None:
    write_suite(project, cpu=1)
    run = f"result-{time.time_ns()}-{next(_runs)}"
    job = start(project, "solo", 8, postgres.url, run)
    output = job.communicate(timeout=120)[0]
    assert job.returncode == 1, output
    store = QueueStore(postgres.url, run)
    try:
        failed = next(t for t in store.tests() if t.test_id.endswith("test_one[3]"))
    finally:
        store.close()
    assert failed.result is not None
    assert "assert 3 != 3" in failed.result["text"]
    assert json.loads(json.dumps(failed.result))["outcome"] == "failed"


def first_started(root: Path, proc: subprocess.Popen[str], bound: float = 120) -> Path:
    """The .started file of the test that blocks in `proc`, once it has started."""
    deadline = time.monotonic() + bound
    while not (found := sorted((root / "out").glob("*.started"))):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"waited {bound}s for the blocking test to start"
        time.sleep(0.05)
    return found[0]


def test_a_stalled_jobs_late_report_is_refused(postgres: Server, project: Path) -> None:
    write_suite(project, cpu=4, block="stalled")
    run = f"stall-{time.time_ns()}-{next(_runs)}"
    lease = ("--devpool-queue-lease=1.5",)
    stalled = start(project, "stalled", 2, postgres.url, run, *lease)
    started = first_started(project, stalled)
    blocked = started.name.removesuffix(".started")
    os.kill(stalled.pid, signal.SIGSTOP)  # its controller and heartbeat stop; the test waits
    try:
        other = start(project, "other", 8, postgres.url, run, *lease)
        other_output = other.communicate(timeout=240)[0]
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    (project / "out" / "go").write_text("")  # the stalled job's test now ends, too late
    stalled_output = stalled.communicate(timeout=120)[0]
    runs = ran_by(project)
    assert runs[blocked] == ["stalled", "other"], (stalled_output, other_output)
    # the outcomes it had not reported when its lease ran out (its blocked test's among them)
    assert "of this job refused by the queue, its claim lost" in stalled_output, stalled_output
    lost = r"this job's lease was lost: job \d+: the queue ended this job's lease .*; it joined"
    assert re.search(lost + r" again as job \d+", stalled_output), stalled_output
    rows = queue_rows(postgres.url, run)
    assert len(rows) == 11 and all(state == "done" for state, _ in rows.values())


def test_jobs_ride_out_a_database_restart(postgres: Server, project: Path) -> None:
    write_suite(project, cpu=6, block="a")
    run = f"restart-{time.time_ns()}-{next(_runs)}"
    lease = ("--devpool-queue-lease=20",)
    first = start(project, "a", 2, postgres.url, run, *lease)
    first_started(project, first)
    second = start(project, "b", 8, postgres.url, run, *lease)
    postgres.stop()  # every connection of both jobs is cut mid-run
    postgres.start()
    (project / "out" / "go").write_text("")
    outputs = [proc.communicate(timeout=240)[0] for proc in (first, second)]
    rows = queue_rows(postgres.url, run)
    assert len(rows) == 13, outputs
    assert all(state == "done" for state, _ in rows.values()), (rows, outputs)
    assert rows["test_mix.py::test_one[3]"] == ("done", "failed")
    assert all("Traceback" not in output for output in outputs), outputs
    runs = ran_by(project)
    assert set(runs) == {f"cpu{i}" for i in range(6)} | {f"one{i}" for i in range(4)} | {
        "two",
        "four",
        "eight",
    }


def test_a_test_skipped_on_a_small_host_runs_on_a_big_one(postgres: Server, project: Path) -> None:
    # plan/skips.py plans a test pytest skips here for lack of devices as a CPU test; the
    # queue still publishes what it asks for, so both jobs agree and only the big one takes it
    (project / "test_mix.py").write_text(
        "import os\nimport pytest\n\n\n"
        "@pytest.mark.device_count(4)\n"
        "@pytest.mark.skipif(os.environ['JOB'] == 'small', reason='needs a big host')\n"
        "def test_big():\n    assert os.environ['JOB'] == 'big'\n\n\n"
        "def test_cpu():\n    pass\n"
    )
    run = f"skip-{time.time_ns()}-{next(_runs)}"
    small = start(project, "small", 2, postgres.url, run)
    big = start(project, "big", 8, postgres.url, run)
    outputs = [proc.communicate(timeout=180)[0] for proc in (small, big)]
    assert (small.returncode, big.returncode) == (0, 0), outputs
    assert queue_rows(postgres.url, run)["test_mix.py::test_big"] == ("done", "passed"), outputs


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    counts=st.tuples(st.integers(0, 6), st.integers(0, 4), st.integers(0, 2), st.integers(0, 2)),
    failing=st.sets(st.integers(0, 13), max_size=3),
    flaky=st.sets(st.integers(0, 13), max_size=2),
    sizes=st.tuples(st.sampled_from([2, 4]), st.sampled_from([2, 4])),
    kill=st.sampled_from([None, 0, 1]),
    delay=st.floats(0.0, 0.5),
)
# a 4-device test with only 2-device jobs: unsatisfiable, no job killed
@example(counts=(0, 0, 0, 1), failing=set(), flaky=set(), sizes=(2, 2), kill=None, delay=0.0)
def test_random_suites_and_kills_give_one_verdict(
    postgres: Server,
    counts: tuple[int, int, int, int],
    failing: set[int],
    flaky: set[int],
    sizes: tuple[int, int],
    kill: int | None,
    delay: float,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="devpool-queue-"))
    try:
        (root / "out").mkdir()
        tests: list[tuple[str, int]] = []
        body = ["import os, time", "import pytest", "from pathlib import Path", ""]
        body.append(f"OUT = Path({str(root / 'out')!r})")
        for size, count in zip((0, 1, 2, 4), counts, strict=True):
            for i in range(count):
                name = f"test_d{size}_{i}"
                fails = len(tests) in failing
                once = len(tests) in flaky - failing  # fails its first attempt only
                tests.append((name, size))
                marker = f"@pytest.mark.device_count({size})\n" if size else ""
                body.append(
                    f"\n\n{marker}def {name}():\n"
                    f"    with open(OUT / '{name}', 'a') as f:\n"
                    "        f.write(os.environ['JOB'] + '\\n')\n"
                    f"    time.sleep(0.05)\n    assert {not fails}\n"
                    + (f"    if {once} and not (OUT / '{name}.once').exists():\n"
                       f"        (OUT / '{name}.once').touch()\n"
                       "        assert False, 'its first attempt fails'\n")
                )  # fmt: skip
        if not tests:
            return
        (root / "test_mix.py").write_text("\n".join(body) + "\n")
        run = f"random-{time.time_ns()}-{next(_runs)}"
        lease = ("--devpool-queue-lease=1.5", "--devpool-reruns=1")
        jobs = [
            start(root, f"j{i}", size, postgres.url, run, *lease) for i, size in enumerate(sizes)
        ]
        if kill is not None:
            deadline = time.monotonic() + 60
            while not any((root / "out").iterdir()) and jobs[kill].poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            time.sleep(delay)  # anywhere in its run, or after its end
            with contextlib.suppress(ProcessLookupError):
                os.killpg(jobs[kill].pid, signal.SIGKILL)
        outputs = [job.communicate(timeout=240)[0] for job in jobs]
        junit = root / "junit.xml"
        verdict = report(postgres.url, run, root, junit, wait=60)
        cases = list(ET.parse(junit).getroot().iter("testcase"))
        assert [c.get("name") for c in cases] == [name for name, _ in tests], (
            verdict.stdout,
            outputs,
        )
        survivors = [size for i, size in enumerate(sizes) if i != kill]
        for case, (name, size) in zip(cases, tests, strict=True):
            failure = case.find("failure")
            log = root / "out" / name
            ran_by = log.read_text().split() if log.exists() else []
            if failure is not None and "unsatisfiable" in str(failure.get("message")):
                assert size > max(survivors)  # no job that lived could hold it
            elif tests.index((name, size)) in failing:
                assert failure is not None, (name, verdict.stdout)
                # the rerun ran too (moved or not), and the report folds the first attempt in
                assert len(ran_by) >= 2 or kill is not None, (name, ran_by, outputs)
            else:
                assert failure is None, (name, verdict.stdout, outputs)
                assert ran_by, name
        bad = any(c.find("failure") is not None or c.find("error") is not None for c in cases)
        assert verdict.returncode == (1 if bad else 0), verdict.stdout
    finally:  # hypothesis runs many examples: none leaves its folder behind
        shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


MOVED = """
import os
import time
from pathlib import Path

import pytest

from devpool.queue.store import QueueStore

OUT = Path({out!r})


@pytest.mark.parametrize("i", range(4))
def test_cpu(i):
    time.sleep(0.05)


@pytest.mark.device_count(1)
def test_flaky():
    with open(OUT / "flaky.runs", "a") as handle:
        handle.write(os.environ["JOB"] + "\\n")
    if not (OUT / "failed-once").exists():
        # fail once the other job has joined: there is another job to take the rerun
        store = QueueStore({url!r}, {run!r})
        deadline = time.monotonic() + 60
        while len(store.jobs()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        store.close()
        (OUT / "failed-once").touch()
        assert False, "the first attempt fails"
"""


def test_a_rerun_moves_to_another_job(postgres: Server, project: Path) -> None:
    run = f"moved-{time.time_ns()}-{next(_runs)}"
    suite = MOVED.format(out=str(project / "out"), url=postgres.url, run=run)
    (project / "test_mix.py").write_text(suite)
    jobs = {name: start(project, name, 2, postgres.url, run, "--devpool-reruns=1") for name in "ab"}
    outputs = {name: proc.communicate(timeout=240)[0] for name, proc in jobs.items()}
    ran = (project / "out" / "flaky.runs").read_text().split()
    assert len(ran) == 2 and ran[0] != ran[1], (ran, outputs)  # the rerun ran in the other job
    assert {name: proc.returncode for name, proc in jobs.items()} == {"a": 0, "b": 0}, outputs
    assert "1 flaky" in outputs[ran[1]], outputs[ran[1]]
    assert queue_rows(postgres.url, run)["test_mix.py::test_flaky"] == ("done", "flaky")
    junit = project / "junit.xml"
    verdict = report(postgres.url, run, project, junit, wait=30)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    (case,) = [
        c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "test_flaky"
    ]
    (earlier,) = case.findall("flakyFailure")
    assert earlier.get("message", "").startswith("attempt 1 on "), earlier.attrib
    assert "the first attempt fails" in (earlier.text or ""), earlier.text


CHAINED = """
import os
import time

import pytest


def ran(name):
    with open({out!r} + "/" + name + ".runs", "a") as handle:
        handle.write(os.environ["JOB"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_cpu(i):
    ran(f"cpu{{i}}")
    time.sleep(0.1)


@pytest.mark.dependency()
def test_make():
    ran("make")


@pytest.mark.dependency(depends=["test_make"])
def test_use():
    ran("use")


@pytest.mark.dependency(depends=["test_use"])
def test_use_again():
    ran("use_again")
"""


def test_a_dependency_chain_runs_whole_in_one_job(postgres: Server, project: Path) -> None:
    (project / "test_mix.py").write_text(CHAINED.format(out=str(project / "out")))
    run = f"chain-{time.time_ns()}-{next(_runs)}"
    plugin = ("-p", "pytest_dependency")
    jobs = {name: start(project, name, 1, postgres.url, run, *plugin) for name in "ab"}
    outputs = {name: proc.communicate(timeout=240)[0] for name, proc in jobs.items()}
    assert {name: proc.returncode for name, proc in jobs.items()} == {"a": 0, "b": 0}, outputs
    runs = ran_by(project)
    assert all(len(who) == 1 for who in runs.values()), runs  # every test once
    assert runs["make"] == runs["use"] == runs["use_again"], runs  # the chain in one job
    rows = queue_rows(postgres.url, run)
    assert {outcome for _, outcome in rows.values()} == {"passed"}, rows  # none skipped


ORDERED = """
import os
import time
from pathlib import Path

import pytest

OUT = Path({out!r})


def until(done):
    deadline = time.monotonic() + 60
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_for(name):
    until((OUT / name).exists)


@pytest.mark.device_count(2)
def test_busy():  # only job b holds 2 devices: it stays busy until job a was killed
    (OUT / "busy.started").touch()
    wait_for("a.killed")


@pytest.mark.order(1)
def test_first():
    if not (OUT / "first.failed").exists():
        (OUT / "first.failed").touch()
        assert False, "the first attempt fails: its rerun moves to job b"


def moved():
    # Job a's controller put test_first's rerun back on the queue: its attempt is 2. The
    # worker runs test_second before its controller has read test_first's ending.
    from devpool.queue.store import QueueStore

    store = QueueStore({url!r}, {run!r})
    try:
        row = store.db.execute(
            "SELECT attempt FROM devpool_queue_tests WHERE run_id = %(run)s AND test_id = %(t)s",
            store._args(t="test_mix.py::test_first"),
        ).fetchone()
        return row is not None and row[0] >= 2
    finally:
        store.close()


@pytest.mark.order(2)
def test_second():
    if os.environ["JOB"] == "a":
        until(moved)
        (OUT / "second.started").touch()
        wait_for("never")  # killed here


@pytest.mark.order(3)
def test_third():
    pass
"""


def test_a_chain_whose_first_test_moved_runs_after_its_job_was_lost(
    postgres: Server, project: Path
) -> None:
    """Job a holds the chain; its first test's rerun moves to job b; a is killed in the
    second test. b then claims the rerun and the rest of the chain together, and runs all."""
    run = f"chain-moved-{time.time_ns()}-{next(_runs)}"
    (project / "test_mix.py").write_text(
        ORDERED.format(out=str(project / "out"), url=postgres.url, run=run)
    )
    # one test a batch (estimates of 100 s): b claims test_busy alone, a the chain
    more = ("-p", "pytest_order", "--devpool-reruns=1", "--devpool-default-estimate=100")
    more += ("--devpool-queue-lease=1.5",)
    b = start(project, "b", 2, postgres.url, run, *more)
    wait_for(project / "out" / "busy.started", b)
    a = start(project, "a", 1, postgres.url, run, *more)
    wait_for(project / "out" / "second.started", a)
    os.killpg(a.pid, signal.SIGKILL)
    a.wait(timeout=30)
    time.sleep(2.5)  # past a's lease: b's next claim takes the rerun and the rest together
    (project / "out" / "a.killed").touch()
    try:
        output = b.communicate(timeout=120)[0]
    finally:  # a job that hangs is not left behind
        if b.poll() is None:
            os.killpg(b.pid, signal.SIGKILL)
    assert b.returncode == 0, output
    rows = queue_rows(postgres.url, run)
    assert rows == {
        "test_mix.py::test_busy": ("done", "passed"),
        "test_mix.py::test_first": ("done", "flaky"),
        "test_mix.py::test_second": ("done", "passed"),
        "test_mix.py::test_third": ("done", "passed"),
    }, output


STALLED_CHAIN = """
import os
import time
from pathlib import Path

import pytest

OUT = Path({out!r})


@pytest.mark.device_count(1)
def test_block():
    if os.environ["JOB"] == "stalled":
        (OUT / "block.started").touch()
        deadline = time.monotonic() + 60
        while not (OUT / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.mark.device_count(1)
@pytest.mark.dependency()
def test_c1():
    (OUT / ("c1." + os.environ["JOB"])).touch()


@pytest.mark.device_count(1)
@pytest.mark.dependency(depends=["test_c1"])
def test_c2():
    pass
"""


def test_a_lost_lease_drops_a_whole_unstarted_chain(postgres: Server, project: Path) -> None:
    """The stalled job held the chain behind its blocked test on its one device: when its
    lease is lost, the chain is dropped unrun, none of it said to be lost track of."""
    (project / "test_mix.py").write_text(STALLED_CHAIN.format(out=str(project / "out")))
    run = f"stall-chain-{time.time_ns()}-{next(_runs)}"
    # the blocking test the longest: it runs first, and the chain (claimed with it) waits
    history = project / "history.sqlite"
    with History(history) as past:
        past.add(
            TestResult(f"test_mix.py::{name}", "passed", seconds, "sim", 1, "sim-1", time.time())
            for name, seconds in (("test_block", 3.0), ("test_c1", 0.5), ("test_c2", 0.5))
        )
    more = ("-p", "pytest_dependency", "--devpool-queue-lease=1.5", f"--devpool-history={history}")
    stalled = start(project, "stalled", 1, postgres.url, run, *more)
    wait_for(project / "out" / "block.started", stalled)
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        other = start(project, "other", 1, postgres.url, run, *more)
        other_output = other.communicate(timeout=120)[0]
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    (project / "out" / "go").touch()
    stalled_output = stalled.communicate(timeout=120)[0]
    assert other.returncode == 0, other_output
    assert (project / "out" / "c1.other").exists() and not (project / "out" / "c1.stalled").exists()
    assert "infra" not in stalled_output and "lost track" not in stalled_output, stalled_output
    assert stalled.returncode == 0, stalled_output
