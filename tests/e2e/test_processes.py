"""End to end: real pytest sessions on simulated devices, their workers, signals and leases.

Every session gets its own lock folder, so these tests never touch the host's real one.
Nothing here sleeps to wait for something: each wait polls a condition under a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sessions import records

from devpool.devices import leftovers
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir

T = TypeVar("T")
PLUGIN_ARGS = ("-p", "devpool.plugin")

# Put at the top of every generated suite: lets a test record what it saw and wait on a
# file under a deadline (never an unbounded sleep).
PRELUDE = """
import json
import os
import time
from pathlib import Path

import pytest

OUT = Path({out!r})


def record(key, **data):
    data.update(
        key=key,
        pid=os.getpid(),
        devices=os.environ.get("DEVPOOL_DEVICES"),
        visible=os.environ.get("DEVPOOL_SIM_VISIBLE_DEVICES"),
        platform=os.environ.get("DEVPOOL_PLATFORM"),
    )
    tmp = OUT / (key + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, OUT / (key + ".json"))


def wait_for(path, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not Path(path).exists():
        assert time.monotonic() < deadline, f"{{path}} never appeared"
        time.sleep(0.02)
"""


# ---- helpers ------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], T], seconds: float, what: str, every: float = 0.01) -> T:
    """Poll predicate until it returns something truthy; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {seconds:g}s waiting for {what}")
        time.sleep(every)


def alive(pid: int) -> bool:
    """True while pid is a running (not zombie) process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return text.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def held(lock: Path) -> dict[int, Holder | None]:
    """Device → holder, for every device of the lock folder that someone holds now."""
    return {state.device: state.holder for state in LockDir(lock).status() if state.held}


def suite(pytester: pytest.Pytester, out: Path, name: str, body: str) -> Path:
    return pytester.makepyfile(**{name: PRELUDE.format(out=str(out)) + textwrap.dedent(body)})


def run_session(
    pytester: pytest.Pytester, lock: Path, *args: str, autoload: bool = False
) -> pytest.RunResult:
    """Run a session to its end; autoload=True loads devpool (and all) from entry points."""
    args = (f"--devpool-lock-dir={lock}", "-p", "no:cacheprovider", *args)
    if not autoload:
        return pytester.runpytest_subprocess(*PLUGIN_ARGS, *args, timeout=60)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
        return pytester.runpytest_subprocess(*args, timeout=60)


def closing_line(result: pytest.RunResult) -> str:
    return result.outlines[-1] if result.outlines else ""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Session:
    """A controller we start ourselves, to signal it or watch it while it runs."""

    def __init__(self, cwd: Path, lock: Path, args: tuple[str, ...], log: Path) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PYTEST_ADDOPTS", None)
        self.log = log
        argv = [sys.executable, "-m", "pytest", *PLUGIN_ARGS, f"--devpool-lock-dir={lock}"]
        argv += ["-p", "no:cacheprovider", *args]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # A shell without job control starts background jobs with SIGINT ignored,
                # and children inherit that: give the session Ctrl-C as a terminal would.
                preexec_fn=_default_sigint,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, seconds: float) -> int:
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"session pid {self.pid} still running after {seconds:g}s:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(autouse=True)
def _no_plugin_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every worker is a whole pytest start; other plugins of this environment (hypothesis
    # alone costs a second each) would make these tests slow. The workers inherit both.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def launch(tmp_path: Path, lock: Path) -> Iterator[Callable[..., Session]]:
    """Start sessions with Popen; any still running at the end is killed by its own pgid."""
    started: list[Session] = []

    def start(*args: str, cwd: Path | None = None) -> Session:
        log = tmp_path / f"session-{len(started)}.log"
        session = Session(cwd or Path.cwd(), lock, args, log)
        started.append(session)
        return session

    yield start
    for session in started:
        session.kill()


# ---- 1, 2: packing ------------------------------------------------------------------------


def _no_device_shared_in_time(runs: list[dict[str, Any]]) -> None:
    by_device: dict[str, list[tuple[float, float, str]]] = {}
    for run in runs:
        for device in run["devices"].split(","):
            if device:
                by_device.setdefault(device, []).append((run["start"], run["end"], run["key"]))
    for device, spans in by_device.items():
        spans.sort()
        for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"sim:{device} used by {first} and {second} at the same time"


def test_one_device_tests_are_packed_in_parallel_without_sharing(
    pytester: pytest.Pytester, lock: Path, out: Path
) -> None:
    suite(
        pytester,
        out,
        "test_pack",
        """
        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("i", range(8))
        def test_one(i, devpool_devices, devpool_platform):
            start = time.monotonic()
            time.sleep(0.5)
            record(f"t{i}", start=start, end=time.monotonic(),
                   fixture=devpool_devices, fixture_platform=devpool_platform)
        """,
    )
    # This one loads devpool from its entry point, as users get it.
    result = run_session(pytester, lock, "--devices", "sim:0-3", autoload=True)
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=8)
    runs = list(records(out).values())
    assert len(runs) == 8
    for run in runs:
        assert run["devices"] in {"0", "1", "2", "3"}, run
        assert run["visible"] == run["devices"], run
        assert run["fixture"] == [int(run["devices"])], run
        assert run["platform"] == "sim" and run["fixture_platform"] == "sim", run
    _no_device_shared_in_time(runs)
    overlapping = [
        (a["key"], b["key"])
        for a in runs
        for b in runs
        if a["key"] < b["key"] and a["start"] < b["end"] and b["start"] < a["end"]
    ]
    assert overlapping, f"no two tests ran at the same time: {runs}"


def test_mixed_sizes_get_the_right_number_of_distinct_devices(
    pytester: pytest.Pytester, lock: Path, out: Path
) -> None:
    suite(
        pytester,
        out,
        "test_mixed",
        """
        def _run(name, devpool_devices):
            start = time.monotonic()
            time.sleep(0.2)
            record(name, start=start, end=time.monotonic(), fixture=devpool_devices)

        @pytest.mark.device_count(4)
        def test_four(devpool_devices):
            _run("four", devpool_devices)

        @pytest.mark.device_count(2)
        @pytest.mark.parametrize("i", range(2))
        def test_two(i, devpool_devices):
            _run(f"two{i}", devpool_devices)

        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("i", range(3))
        def test_one(i, devpool_devices):
            _run(f"one{i}", devpool_devices)

        @pytest.mark.parametrize("i", range(2))
        def test_cpu(i, devpool_devices):
            _run(f"cpu{i}", devpool_devices)
        """,
    )
    result = run_session(pytester, lock, "--devices", "sim:0-3")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=8)
    runs = records(out)
    expected = {"four": 4, "two0": 2, "two1": 2, "one0": 1, "one1": 1, "one2": 1}
    expected.update(cpu0=0, cpu1=0)
    assert sorted(runs) == sorted(expected)
    for name, count in expected.items():
        run = runs[name]
        ids = [int(part) for part in run["devices"].split(",") if part]
        assert len(ids) == len(set(ids)) == count, run
        assert set(ids) <= {0, 1, 2, 3}, run
        assert run["fixture"] == ids, run
        assert run["visible"] == run["devices"], run
    assert runs["cpu0"]["devices"] == "" and runs["cpu1"]["devices"] == ""
    _no_device_shared_in_time(list(runs.values()))


# ---- 3: two sessions on one host ----------------------------------------------------------


def test_two_concurrent_sessions_never_hold_the_same_device(
    tmp_path: Path, lock: Path, launch: Callable[..., Session]
) -> None:
    shared = tmp_path / "guards"
    shared.mkdir()
    body = f"""
import os
import time

import pytest

SHARED = {str(shared)!r}
SPANS = os.path.join(os.path.dirname(__file__), "spans.txt")


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(100))
def test_guard(i, devpool_devices):
    (device,) = devpool_devices
    guard = os.path.join(SHARED, f"dev-{{device}}")
    # Fails with FileExistsError if another test, of either session, holds this device now.
    fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    start = time.monotonic()
    try:
        time.sleep(0.01)
    finally:
        os.close(fd)
        os.unlink(guard)
    with open(SPANS, "a") as spans:
        spans.write(f"{{start}} {{time.monotonic()}}\\n")
"""
    # Each controller waits, once it has collected, until both have (bounded): on a loaded
    # host one run could otherwise end before the other starts, and prove nothing.
    barrier = tmp_path / "collected"
    barrier.mkdir()
    conftest = f"""
import os
import time

BARRIER = {str(barrier)!r}


def pytest_collection_finish(session):
    if session.config.getoption("devpool_worker", None):
        return  # a worker or template collects too: only the controllers meet
    open(os.path.join(BARRIER, os.path.basename(str(session.config.rootpath))), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(BARRIER)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
"""
    sessions = []
    for name in ("a", "b"):
        copy = tmp_path / name
        copy.mkdir()
        (copy / "pytest.ini").write_text("[pytest]\n")
        (copy / "test_guard.py").write_text(body)
        (copy / "conftest.py").write_text(conftest)
        sessions.append(launch("-q", "--devices", "sim:0-7", cwd=copy))
    for session in sessions:
        code = session.wait(75)
        text = session.output()
        assert code == 0, text
        assert "100 passed" in text.splitlines()[-1], text
    assert not list(shared.iterdir())
    assert not held(lock)
    # The two runs must really have competed for the devices, or this proves nothing.
    windows = []
    for name in ("a", "b"):
        spans = [line.split() for line in (tmp_path / name / "spans.txt").read_text().splitlines()]
        windows.append((min(float(s) for s, _ in spans), max(float(e) for _, e in spans)))
    (a_start, a_end), (b_start, b_end) = windows
    # Contended: their tests overlapped in time, or one run waited on the other's leases
    # (a run keeps its devices while it has work queued, so the other may wait it out).
    overlapped = a_start < b_end and b_start < a_end
    waited = any("waiting for devices held by other runs" in s.output() for s in sessions)
    assert overlapped or waited, f"the sessions never met: {windows}"


# ---- 4, 5: crashes --------------------------------------------------------------------------


def test_sigkilled_worker_is_crashed_and_its_lease_freed_at_once(
    pytester: pytest.Pytester, lock: Path, out: Path, launch: Callable[..., Session]
) -> None:
    go = out / "go"
    suite(
        pytester,
        out,
        "test_kill",
        f"""
        import signal

        @pytest.mark.device_count(1)
        def test_killed():
            record(f"killed-{os.getpid()}", at=time.monotonic())
            os.kill(os.getpid(), signal.SIGKILL)

        @pytest.mark.device_count(1)
        def test_other_device():
            pass

        def test_cpu_waits():
            record("cpu")
            wait_for({str(go)!r})
        """,
    )
    session = launch("-rA", "--devices", "sim:0-1")

    def first_kill() -> dict[str, Any] | None:
        kills = [run for key, run in records(out).items() if key.startswith("killed-")]
        return min(kills, key=lambda run: run["at"]) if kills else None

    marker = wait_until(first_kill, 30, "the killed test's marker")
    device, killed_pid = int(marker["devices"]), marker["pid"]

    def lease_gone() -> bool:
        holder = held(lock).get(device, "free")
        if holder == "free":
            return True
        # Another worker of this run (a rerun, say) may hold it now: the dead one let go.
        return holder is not None and holder.worker_pid not in (None, killed_pid)

    wait_until(lease_gone, 10, f"sim:{device} to be released")
    freed_after = time.monotonic() - marker["at"]
    assert session.proc.poll() is None, "the run must still be going (the CPU test waits)"
    go.touch()
    code = session.wait(30)
    text = session.output()
    assert freed_after < 1.0, f"sim:{device} was freed {freed_after:.2f}s after the kill"
    assert code == 1, text
    closing = text.strip().splitlines()[-1]
    assert "1 crashed" in closing and "2 passed" in closing, text
    # devpool may rerun a crashed test (--devpool-reruns-infra); every attempt was killed.
    killed = [run["pid"] for key, run in records(out).items() if key.startswith("killed-")]
    assert any(f"worker pid {pid} was killed by SIGKILL" in text for pid in killed), text
    assert not any(alive(pid) for pid in killed)
    assert not held(lock)


def test_exit_code_crash_then_the_next_test_runs_in_a_fresh_worker(
    pytester: pytest.Pytester, lock: Path, out: Path
) -> None:
    suite(
        pytester,
        out,
        "test_exit",
        """
        @pytest.mark.device_count(1)
        def test_exits():
            record("exits")
            os._exit(3)

        @pytest.mark.device_count(1)
        def test_after():
            record("after")
        """,
    )
    result = run_session(pytester, lock, "--devices", "sim:0")
    text = result.stdout.str()
    assert result.ret == 1, text
    assert "1 crashed" in closing_line(result) and "1 passed" in closing_line(result), text
    assert "exited with code 3" in text, text
    runs = records(out)
    assert runs["exits"]["pid"] != runs["after"]["pid"]
    assert not held(lock)


# ---- 6: timeouts ----------------------------------------------------------------------------


def test_timeout_dumps_stacks_and_kills_the_whole_process_group(
    pytester: pytest.Pytester, lock: Path, out: Path
) -> None:
    suite(
        pytester,
        out,
        "test_hang",
        """
        import subprocess

        def _hang(name):
            child = subprocess.Popen(["sleep", "60"])
            record(name, child=child.pid)
            time.sleep(60)

        @pytest.mark.timeout(1)
        @pytest.mark.device_count(1)
        def test_hangs_with_marker():
            _hang("marker")

        def test_hangs_with_default_limit():
            _hang("default")

        @pytest.mark.timeout(30)
        def test_marker_beats_default():
            time.sleep(1.5)
        """,
    )
    started = time.monotonic()
    result = run_session(
        pytester,
        lock,
        "--devices",
        "sim:0-1",
        "--devpool-test-timeout=1",
        "--devpool-timeout-grace=1",
    )
    elapsed = time.monotonic() - started
    text = result.stdout.str()
    assert result.ret == 1, text
    assert "2 timeout" in closing_line(result) and "1 passed" in closing_line(result), text
    assert "most recent call first" in text, text
    assert "test_hangs_with_marker" in text and "test_hangs_with_default_limit" in text, text
    assert "in _hang" in text, text  # a frame of the hanging test, from faulthandler
    assert elapsed < 30, f"the hanging tests were not cut short ({elapsed:.1f}s)"
    runs = records(out)
    for name in ("marker", "default"):
        child = runs[name]["child"]
        wait_until(lambda child=child: not alive(child), 5, f"the test's child pid {child} to end")
    assert not held(lock)


# ---- 7: devices held by another run ---------------------------------------------------------


@pytest.fixture
def foreign_lease(lock: Path) -> Iterator[Lease]:
    holder = Holder.for_this_process("other-session", "tests/other.py::t")
    got = LockDir(lock).try_acquire("sim", [0], holder)
    assert isinstance(got, Lease), got
    yield got
    got.release()


def test_lease_held_elsewhere_ends_infra_naming_the_holder(
    pytester: pytest.Pytester, lock: Path, out: Path, foreign_lease: Lease
) -> None:
    suite(
        pytester,
        out,
        "test_busy",
        """
        @pytest.mark.device_count(1)
        def test_needs_device():
            record("ran")
        """,
    )
    started = time.monotonic()
    result = run_session(pytester, lock, "--devices", "sim:0", "--devpool-lease-timeout", "2")
    elapsed = time.monotonic() - started
    text = result.stdout.str()
    assert result.ret == 1, text
    assert "1 infra" in closing_line(result), text
    assert f"pid {os.getpid()}" in text, text
    assert "other-session" in text and "tests/other.py::t" in text, text
    assert not records(out), "the test must not run on a device another run holds"
    assert 2 <= elapsed < 20, f"took {elapsed:.1f}s with --devpool-lease-timeout 2"
    assert list(held(lock)) == [0]  # still ours, untouched


def test_lease_released_by_the_other_run_lets_the_test_pass(
    pytester: pytest.Pytester,
    lock: Path,
    out: Path,
    foreign_lease: Lease,
    launch: Callable[..., Session],
) -> None:
    suite(
        pytester,
        out,
        "test_wait",
        """
        @pytest.mark.device_count(1)
        def test_needs_device():
            record("ran", at=time.monotonic())
        """,
    )
    session = launch("--devices", "sim:0", "--devpool-lease-timeout", "30")
    try:
        wait_until(lambda: "waiting for devices" in session.output(), 10, "the waiting message")
    finally:
        released_at = time.monotonic()
        foreign_lease.release()
    code = session.wait(30)
    text = session.output()
    assert code == 0, text
    assert "1 passed" in text.strip().splitlines()[-1], text
    assert f"pid {os.getpid()}" in text and "other-session" in text, text
    assert records(out)["ran"]["at"] > released_at
    assert not held(lock)


# ---- 8, 9: interrupting the controller ------------------------------------------------------

WAITING_SUITE = """
@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(2))
def test_device(i):
    record(f"device{{i}}")
    wait_for({go!r})

def test_cpu():
    record("cpu")
    wait_for({go!r})
"""


def _workers_running(out: Path, launch: Callable[..., Session], pytester: pytest.Pytester) -> Any:
    suite(pytester, out, "test_sleepy", WAITING_SUITE.format(go=str(out / "never")))
    session = launch("--devices", "sim:0-1", "--devpool-max-parallel", "3")
    runs = wait_until(lambda: len(records(out)) == 3 and records(out), 30, "three running tests")
    pids = [run["pid"] for run in runs.values()]
    assert len(set(pids)) == 3 and session.pid not in pids
    return session, pids


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_ends_workers_and_frees_devices(
    pytester: pytest.Pytester,
    lock: Path,
    out: Path,
    launch: Callable[..., Session],
    signum: int,
) -> None:
    session, pids = _workers_running(out, launch, pytester)
    assert set(held(lock)) == {0, 1}
    os.kill(session.pid, signum)
    code = session.wait(20)
    assert code == 2, session.output()
    wait_until(lambda: not any(alive(pid) for pid in pids), 5, f"workers {pids} to end")
    assert not held(lock)
    if signum == signal.SIGTERM:  # said as a SIGTERM, not as Ctrl-C at a line of devpool's
        shown = session.output()
        banner = [line for line in shown.splitlines() if line.startswith("!!")]
        assert banner and "SIGTERM" in banner[-1], shown
        assert "KeyboardInterrupt" not in shown and "controller.py" not in shown, shown


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_collecting_ends_the_run_as_ctrl_c_and_leaves_nothing(
    pytester: pytest.Pytester,
    lock: Path,
    out: Path,
    launch: Callable[..., Session],
    signum: int,
) -> None:
    # A CI step's timeout can come during a long collection (a suite importing torch): it
    # ends the run with pytest's interrupted exit and banner, not a silent -15, and the
    # zygote and templates the collection started end with it.
    collecting = out / "collecting"
    pytester.makepyfile(
        test_slow_import=f"""
        import pathlib, time

        pathlib.Path({str(collecting)!r}).touch()
        time.sleep(60)

        def test_never():
            pass
        """
    )
    session = launch("--devices", "sim:0")
    wait_until(collecting.exists, 30, "the collection to start")
    ours = [p.pid for p in leftovers.descendants(session.pid)]  # its zygote and templates
    assert ours, "no zygote or template beside the collection"
    os.kill(session.pid, signum)
    assert session.wait(20) == 2, session.output()
    shown = session.output()
    assert "Traceback" not in shown and "controller.py" not in shown, shown
    if signum == signal.SIGTERM:
        banner = [line for line in shown.splitlines() if line.startswith("!!")]
        assert banner and "SIGTERM" in banner[-1], shown
    wait_until(lambda: not any(alive(pid) for pid in ours), 10, f"processes {ours} to end")


def test_a_sigterm_while_the_run_is_planned_ends_it_as_ctrl_c_and_leaves_nothing(
    pytester: pytest.Pytester, lock: Path, out: Path, launch: Callable[..., Session]
) -> None:
    # Between the collection and the first test the controller plans, joins a queue and
    # starts its record: seconds on a large suite or a slow database. The signal comes
    # there (the controller only: the conftest is imported by its templates too).
    planning = out / "planning"
    pytester.makeconftest(
        f"""
        import os, pathlib, time
        from devpool.session import jobs

        plan_run = jobs.plan_run

        def slow_plan(*args, **kwargs):
            if not os.environ.get("DEVPOOL_RUN_ID"):
                pathlib.Path({str(planning)!r}).touch()
                time.sleep(60)
            return plan_run(*args, **kwargs)

        jobs.plan_run = slow_plan
        """
    )
    suite(pytester, out, "test_planned", "def test_one():\n    record('one')\n")
    session = launch("--devices", "sim:0")
    wait_until(planning.exists, 30, "the plan to start")
    ours = [p.pid for p in leftovers.descendants(session.pid)]  # its zygote and templates
    os.kill(session.pid, signal.SIGTERM)
    assert session.wait(20) == 2, session.output()
    shown = session.output()
    assert "Traceback" not in shown and "controller.py" not in shown, shown
    banner = [line for line in shown.splitlines() if line.startswith("!!")]
    assert banner and "SIGTERM" in banner[-1], shown
    assert "one" not in records(out)
    wait_until(lambda: not any(alive(pid) for pid in ours), 10, f"processes {ours} to end")
    assert not held(lock)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_results_are_written_waits_for_them_and_exits_2(
    pytester: pytest.Pytester, lock: Path, out: Path, signum: int
) -> None:
    # The signal comes inside pytest_sessionfinish, as a Ctrl-C right at the end of a run can.
    pytester.makeconftest(
        f"""
        import os, time

        def pytest_sessionfinish(session):
            if not os.environ.get("DEVPOOL_RUN_ID"):  # the controller only
                os.kill(os.getpid(), {int(signum)})
                time.sleep(0.2)
        """
    )
    suite(pytester, out, "test_end", "def test_one():\n    record('one')\n")
    result = run_session(pytester, lock, "--devices", "sim:0")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 2, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    name = signal.Signals(signum).name
    assert f"devpool: {name} while the run wrote its results: written first" in output, output
    [record_file] = pytester.path.glob(".devpool/runs/*/record.jsonl")
    assert '"session_end"' in record_file.read_text()  # the record was finished


def test_sigkilled_controller_takes_its_workers_and_leases_with_it(
    pytester: pytest.Pytester, lock: Path, out: Path, launch: Callable[..., Session]
) -> None:
    session, pids = _workers_running(out, launch, pytester)
    os.kill(session.pid, signal.SIGKILL)
    session.wait(5)
    wait_until(lambda: not any(alive(pid) for pid in pids), 5, f"workers {pids} to end")
    wait_until(lambda: not held(lock), 5, "every device to be free")


# ---- 10: isolation ----------------------------------------------------------------------------


def test_isolation_gives_fresh_processes_and_warm_reuse_shares_one(
    pytester: pytest.Pytester, lock: Path, out: Path
) -> None:
    suite(
        pytester,
        out,
        "test_iso",
        """
        # Run in this order on the one device: before, before, isolated, after, after.
        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("i", range(2))
        def test_before(i):
            record(f"before{i}")

        @pytest.mark.isolate
        @pytest.mark.device_count(1)
        def test_isolated():
            record("isolated")

        @pytest.mark.device_count(1)
        @pytest.mark.parametrize("i", range(2))
        def test_after(i):
            record(f"after{i}")
        """,
    )
    result = run_session(pytester, lock, "--devices", "sim:0", "--devpool-isolation", "job")
    assert result.ret == 0, result.stdout.str()
    pids = [run["pid"] for run in records(out).values()]
    assert len(pids) == 5 and len(set(pids)) == 5, pids

    for path in out.glob("*.json"):
        path.unlink()
    result = run_session(pytester, lock, "--devices", "sim:0")
    assert result.ret == 0, result.stdout.str()
    pid = {name: run["pid"] for name, run in records(out).items()}
    assert pid["before0"] == pid["before1"], f"warm reuse: one worker for both {pid}"
    assert pid["after0"] == pid["after1"], f"warm reuse: one worker for both {pid}"
    others = {value for name, value in pid.items() if name != "isolated"}
    assert pid["isolated"] not in others, f"the isolated test shared its worker {pid}"


# ---- 11: devpool locks ------------------------------------------------------------------------


def _locks(lock: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "devpool.cli", "locks", "--lock-dir", str(lock)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_devpool_locks_shows_the_running_test_then_free(
    pytester: pytest.Pytester, lock: Path, out: Path, launch: Callable[..., Session]
) -> None:
    go = out / "go"
    suite(
        pytester,
        out,
        "test_hold",
        f"""
        @pytest.mark.device_count(1)
        def test_holds():
            record("holds")
            wait_for({str(go)!r})
        """,
    )
    session = launch("--devices", "sim:0")
    wait_until(lambda: records(out).get("holds"), 30, "the test to start")
    try:
        listing = _locks(lock)
    finally:
        go.touch()
    line = next((row for row in listing.splitlines() if "sim:0 " in row), "")
    assert f"held by pid {session.pid}" in line, listing
    assert "test_hold.py::test_holds" in line, listing
    assert session.wait(30) == 0, session.output()
    line = next((row for row in _locks(lock).splitlines() if "sim:0 " in row), "")
    assert line.split() == ["sim:0", "free"], line


# ---- 12: a worker that never finishes starting -----------------------------------------------


def test_a_worker_hanging_in_collection_ends_infra_instead_of_hanging_the_run(
    pytester: pytest.Pytester, lock: Path
) -> None:
    # Workers see DEVPOOL_DEVICES; the controller does not: only workers hang here.
    pytester.makeconftest(
        """
        import os
        import time

        if "DEVPOOL_DEVICES" in os.environ:
            time.sleep(60)
        """
    )
    pytester.makepyfile(test_hang_collect="def test_never_reached():\n    pass\n")
    started = time.monotonic()
    result = run_session(
        pytester, lock, "--devices", "sim:0", "--devpool-worker-start-timeout", "2"
    )
    took = time.monotonic() - started
    output = result.stdout.str()
    assert result.ret == 1, output
    assert "1 infra" in closing_line(result), output
    assert "did not finish starting (collection) within 2s" in output
    assert took < 40, f"the run took {took:.0f}s: it waited on the hung worker"
