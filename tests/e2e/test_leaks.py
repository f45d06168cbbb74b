"""Every device handed over clean (issue 52): what a test leaves behind is found, named and
ended before the next test, in real sessions on sim devices.

Each target suite records what its tests left (pids, thread ids) in OUT; an autouse fixture
of the target's conftest then looks at /proc itself before every later test and records
what it saw, so "the next test sees nothing of them" is the target's own observation.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sessions import IN_ORDER, events

pytestmark = pytest.mark.usefixtures("_no_autoload")


# The target's conftest: leave() starts what a test leaves; the autouse fixture checks, from
# inside the next test, that nothing a test left is alive or still in this process.
CONFTEST = """
import json, os, signal, subprocess, sys, threading, time
from pathlib import Path

import pytest

OUT = Path({out!r})


def note(kind, **data):
    with open(OUT / "left.jsonl", "a") as handle:
        handle.write(json.dumps(dict(kind=kind, **data)) + "\\n")


def alive(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def server(ignore_term=False):
    code = "import signal, sys, time\\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    code += "print('up', flush=True)\\ntime.sleep(600)\\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        start_new_session=True,
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    proc.stdout.readline()  # its handlers are set
    note("process", pid=proc.pid, test=os.environ.get("DEVPOOL_TEST_ID"))
    return proc.pid


def daemon():
    read, write = os.pipe()
    if os.fork() == 0:
        if os.fork() == 0:
            try:
                os.setsid()
                os.chdir("/")
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # as a daemon does: the session's output is not held
                    os.dup2(null, fd)
                note("process", pid=os.getpid(), test=os.environ.get("DEVPOOL_TEST_ID"))
                os.write(write, b"x")
                os.closerange(3, 1024)
                time.sleep(600)
            finally:
                os._exit(0)
        os._exit(0)
    os.wait()
    os.read(read, 1)


@pytest.fixture(autouse=True)
def _sees_nothing_left():
    seen = []
    path = OUT / "left.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        left = json.loads(line)
        if left["kind"] == "process" and alive(left["pid"]):
            seen.append(left)
        task = f"/proc/{{left.get('pid')}}/task/{{left.get('tid')}}"
        if left["kind"] == "thread" and os.path.exists(task):
            seen.append(left)
    with open(OUT / "checks.jsonl", "a") as handle:
        test = os.environ.get("DEVPOOL_TEST_ID")
        handle.write(json.dumps(dict(test=test, pid=os.getpid(), seen=seen)) + "\\n")
    yield
"""

LEAKING = """
import os, threading, time

import pytest
from conftest import daemon, note, server

stop = threading.Event()


@pytest.mark.device_count(1)
def test_1_server():
    server()


@pytest.mark.device_count(1)
def test_2_daemon():
    daemon()


@pytest.mark.device_count(1)
def test_3_stubborn():
    server(ignore_term=True)


@pytest.mark.device_count(1)
def test_4_thread():
    thread = threading.Thread(target=stop.wait, args=(60,), name="poller")
    thread.start()
    note("thread", pid=os.getpid(), tid=thread.native_id, test=os.environ.get("DEVPOOL_TEST_ID"))


@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(3))
def test_5_after(i):
    pass
"""


def _target(pytester: pytest.Pytester, **modules: str) -> Path:
    out = pytester.path / "out"
    out.mkdir(exist_ok=True)
    pytester.makeconftest(CONFTEST.format(out=str(out)))
    pytester.makepyfile(**modules)
    return out


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids: list[int], bound: float = 10.0) -> list[int]:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def _guards_of(controller: int) -> list[int]:
    """The guard a controller started: devices/leftovers.py run with its pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if (
                    any(a.endswith(b"leftovers.py") for a in argv)
                    and str(controller).encode() in argv
                ):
                    found.append(int(entry.name))
    return found


def _end(pids: list[int]) -> None:
    """Leftovers of a plain pytest run (nothing ends them there): ours to end."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _record(pytester: pytest.Pytester) -> Path:
    [record] = pytester.path.glob(".devpool/runs/*/record.jsonl")
    return record


def test_what_a_test_leaves_is_ended_before_the_next_test_on_its_device(
    pytester: pytest.Pytester, lock_dir: Path
) -> None:
    out = _target(pytester, test_leaking=LEAKING)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock_dir}", "--devices", "sim:0", timeout=120
    )
    text = result.stdout.str()
    assert result.ret == 0, text  # warn, the default: every test keeps its outcome
    left = _lines(out / "left.jsonl")
    pids = [int(str(entry["pid"])) for entry in left if entry["kind"] == "process"]
    assert len(pids) == 3, left
    assert not _gone(pids), f"leftovers alive after the run: {pids}"
    # Every test after the first looked at /proc itself and saw nothing any test had left.
    checks = _lines(out / "checks.jsonl")
    assert len(checks) == 7, checks
    assert not [check for check in checks if check["seen"]], checks
    # Each leftover named, with its test, pid, command and device, once, and how it ended.
    leaks = events(_record(pytester), "leak")
    by_test = {str(leak["nodeid"]).split("::")[1]: leak for leak in leaks}
    assert set(by_test) == {"test_1_server", "test_2_daemon", "test_3_stubborn", "test_4_thread"}
    assert by_test["test_1_server"]["ended"] == "terminated"
    assert by_test["test_3_stubborn"]["ended"] == "killed"  # SIGTERM ignored: SIGKILL
    assert by_test["test_4_thread"]["kind"] == "thread"
    for name in ("test_1_server", "test_2_daemon", "test_3_stubborn"):
        leak = by_test[name]
        assert leak["pid"] in pids and leak["holds"] == ["sim:0"], leak
        assert f"LEAK test_leaking.py::{name}: pid {leak['pid']}" in text, text
    assert "time.sleep(600)" in str(by_test["test_1_server"]["command"])
    assert "thread `poller running Event.wait`" in text, text
    # The thread cannot be ended: its worker was retired, the next test ran in another.
    thread_pid = next(entry["pid"] for entry in left if entry["kind"] == "thread")
    after = [c for c in checks if str(c["test"]).startswith("test_leaking.py::test_5_after")]
    assert after and all(c["pid"] != thread_pid for c in after), checks


MEMORY = """
import json, os

import pytest


@pytest.mark.device_memory("2GiB")
def test_a_keeps_memory():
    # As a tensor kept in a global keeps torch's caching allocator's blocks.
    with open(os.environ["DEVPOOL_SIM_HELD_FILE"], "w") as held:
        json.dump({"0": 1 << 30}, held)


@pytest.mark.device_memory("2GiB")
def test_b_after():
    path = os.environ["DEVPOOL_SIM_HELD_FILE"]  # this worker holds nothing: a fresh one
    assert not os.path.exists(path) or json.load(open(path)) == {}
"""


def test_a_warm_worker_that_keeps_device_memory_is_retired_and_the_test_named(
    pytester: pytest.Pytester, lock_dir: Path
) -> None:
    out = _target(pytester, test_memory=MEMORY)
    pytester.makepyprojecttoml('[tool.devpool.platforms]\nsim = { memory = "10GiB" }\n')
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock_dir}", "--devices", "sim:0", timeout=120
    )
    text = result.stdout.str()
    assert result.ret == 0, text
    [leak] = events(_record(pytester), "leak")
    assert leak["kind"] == "memory" and leak["ended"] == "retired", leak
    assert str(leak["nodeid"]).endswith("test_a_keeps_memory")
    assert leak["holds"] == ["sim:0 1.0 GiB"], leak
    assert "LEAK test_memory.py::test_a_keeps_memory: device memory in worker pid" in text, text
    checks = {str(c["test"]).split("::")[1]: c for c in _lines(out / "checks.jsonl")}
    assert checks["test_a_keeps_memory"]["pid"] != checks["test_b_after"]["pid"], checks


FIXTURE_SERVER = """
import os

import pytest
from conftest import server


@pytest.fixture(scope="module")
def shared_server():
    pid = server()
    yield pid
    if os.environ.get("STOP_SERVER"):
        os.kill(pid, 15)


@pytest.mark.device_count(1)
def test_first(shared_server):
    pass


@pytest.mark.device_count(1)
def test_second(shared_server):
    assert os.path.exists(f"/proc/{shared_server}")  # still up for its second user
"""


@pytest.mark.parametrize("stop", [True, False], ids=["stopped", "left"])
def test_a_wider_fixtures_server_is_its_own_until_the_fixture_ends(
    pytester: pytest.Pytester, lock_dir: Path, monkeypatch: pytest.MonkeyPatch, stop: bool
) -> None:
    if stop:
        monkeypatch.setenv("STOP_SERVER", "1")
    out = _target(pytester, test_fixture=FIXTURE_SERVER)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock_dir}", "--devices", "sim:0", timeout=120
    )
    text = result.stdout.str()
    assert result.ret == 0, text
    leaks = events(_record(pytester), "leak")
    if stop:
        assert leaks == [], leaks  # the fixture stopped its own server: nobody leaked
    else:
        [leak] = leaks  # charged to the fixture, found at its teardown, not to test_first
        assert leak["fixture"] == "shared_server (module)", leak
        assert str(leak["nodeid"]).endswith("test_first"), leak
    pids = [int(str(e["pid"])) for e in _lines(out / "left.jsonl")]
    assert not _gone(pids)


FAILING = """
import pytest
from conftest import server


@pytest.mark.device_count(1)
def test_leaves():
    server()


@pytest.mark.device_count(1)
def test_clean():
    pass
"""


def test_fail_mode_fails_the_leaking_test_and_off_looks_at_nothing(
    pytester: pytest.Pytester, lock_dir: Path
) -> None:
    out = _target(pytester, test_modes=FAILING)
    junit = pytester.path / "junit.xml"
    args = (*IN_ORDER, f"--devpool-lock-dir={lock_dir}", "--devices", "sim:0")
    failed = pytester.runpytest_subprocess(
        *args, "--devpool-leaks=fail", f"--junitxml={junit}", timeout=120
    )
    text = failed.stdout.str()
    assert failed.ret == 1, text
    assert "ERROR at teardown of test_leaves" in text and "[devpool] LEAK pid" in text, text
    cases = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}
    assert cases["test_leaves"].find("error") is not None
    assert cases["test_clean"].find("error") is None and cases["test_clean"].find("failure") is None
    props = [p.get("name") for p in cases["test_leaves"].iter("property")]
    assert "devpool_leak" in props, props

    off = pytester.runpytest_subprocess(*args, "--devpool-leaks=off", timeout=120)
    assert off.ret == 0 and "LEAK" not in off.stdout.str(), off.stdout.str()
    pids = [int(str(e["pid"])) for e in _lines(out / "left.jsonl")]
    assert len(pids) == 2
    # off: nothing ended it in its worker; the worker's exit took it (not its test's end).
    _end(pids)

    bad = pytester.runpytest_subprocess(*args, "--devpool-leaks=maybe", timeout=60)
    assert bad.ret == 4
    said = [line for line in bad.stderr.lines + bad.stdout.lines if "leaks" in line]
    assert len(said) == 1 and "Traceback" not in bad.stderr.str(), said


ORACLE = """
import os, subprocess, sys, threading

import pytest
from conftest import daemon, server


@pytest.mark.device_count(1)
def test_server_passes():
    server()


@pytest.mark.device_count(1)
def test_daemon_fails():
    daemon()
    assert False


@pytest.mark.device_count(1)
def test_skips():
    server()
    pytest.skip("left something first")


@pytest.mark.device_count(1)
@pytest.mark.xfail(reason="known")
def test_xfails():
    daemon()
    raise RuntimeError


@pytest.mark.device_count(1)
def test_clean():
    pass
"""


def test_outcomes_of_leaking_tests_equal_plain_pytest(
    pytester: pytest.Pytester, lock_dir: Path
) -> None:
    out = _target(pytester, test_oracle=ORACLE)

    def outcomes(*args: str) -> dict[str, str]:
        junit = pytester.path / "oracle.xml"
        pytester.runpytest_subprocess(*args, f"--junitxml={junit}", timeout=120)
        found = {}
        for case in ET.parse(junit).iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            found[str(case.get("name"))] = ",".join(kinds) or "passed"
        return found

    plain = outcomes("-p", "no:devpool", "-p", "no:cacheprovider")
    left = [int(str(e["pid"])) for e in _lines(out / "left.jsonl")]
    _end(left)  # plain pytest ends nothing a test left
    under = outcomes(*IN_ORDER, f"--devpool-lock-dir={lock_dir}", "--devices", "sim:0-1")
    assert under == plain
    ours = [int(str(e["pid"])) for e in _lines(out / "left.jsonl")][len(left) :]
    assert len(ours) == len(left) and not _gone(ours)


KILLED = """
import os, time

import pytest
from conftest import daemon, server


@pytest.mark.device_count(1)
def test_holds(tmp_path):
    server()
    daemon()
    open(os.environ["READY_FILE"], "w").close()
    time.sleep(300)
"""


def test_a_sigkilled_controller_leaves_nothing_a_test_started(
    pytester: pytest.Pytester, lock_dir: Path, tmp_path: Path
) -> None:
    out = _target(pytester, test_killed=KILLED)
    ready = tmp_path / "ready"
    env = {**os.environ, "READY_FILE": str(ready)}
    argv = [sys.executable, "-m", "pytest", *IN_ORDER, f"--devpool-lock-dir={lock_dir}"]
    controller = subprocess.Popen(
        [*argv, "--devices", "sim:0", "-q"],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and controller.poll() is None, "never ready"
            time.sleep(0.05)
        pids = [int(str(e["pid"])) for e in _lines(out / "left.jsonl")]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        guards = _guards_of(controller.pid)
        assert guards, "no guard process beside the controller"
        controller.kill()
        controller.wait(10)
        assert not _gone(pids), f"leftovers {pids} outlived a SIGKILLed controller"
        assert not _gone(guards), "the guard outlived its work"  # it goes once they are gone
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()


ENDING = """
import os, signal, subprocess, sys, time

import pytest
from conftest import note

EXITS_AFTER = (
    "import signal, sys, time\\n"
    "def later(*_):\\n"
    "    time.sleep({seconds})\\n"
    "    sys.exit(0)\\n"
    "signal.signal(signal.SIGTERM, later)\\n"
    "print('up', flush=True)\\n"
    "time.sleep(600)\\n"
)


def started(seconds):
    proc = subprocess.Popen(
        [sys.executable, "-c", EXITS_AFTER.format(seconds=seconds)],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
    )
    proc.stdout.readline()  # its handler is set
    note("process", pid=proc.pid, test=os.environ.get("DEVPOOL_TEST_ID"))
    return proc


@pytest.mark.device_count(1)
def test_ends_its_child_without_waiting():
    os.kill(started(0.02).pid, signal.SIGTERM)  # it exits 20 ms later, unwaited for


@pytest.mark.device_count(1)
def test_kills_a_hung_tools_group():
    # As a probe ends a hung tool: SIGKILL to its session, only the shell waited for; the
    # shell's child is still being ended by the kernel as the test returns.
    tool = subprocess.Popen(["/bin/sh", "-c", "sleep 30; true"], start_new_session=True)
    time.sleep(0.1)
    os.killpg(tool.pid, signal.SIGKILL)
    tool.wait()


@pytest.mark.device_count(1)
def test_leaves_a_slow_one():
    os.kill(started(2.0).pid, signal.SIGTERM)  # still there well after the test
"""


def test_a_process_ending_as_its_test_returns_is_no_leak(
    pytester: pytest.Pytester, lock_dir: Path
) -> None:
    """As cargo-nextest's leak-timeout: what ends within devices/leftovers.SETTLE of the
    test's end is not named; what is still there after it is (here, in fail mode)."""
    out = _target(pytester, test_ending=ENDING)
    result = pytester.runpytest_subprocess(
        *IN_ORDER, f"--devpool-lock-dir={lock_dir}", "--devices", "sim:0",
        "--devpool-leaks=fail", timeout=120,
    )  # fmt: skip
    text = result.stdout.str()
    leaks = events(_record(pytester), "leak")
    assert [str(leak["nodeid"]).split("::")[1] for leak in leaks] == ["test_leaves_a_slow_one"]
    assert "ERROR at teardown of test_leaves_a_slow_one" in text, text
    assert "LEAK test_ending.py::test_ends" not in text and "test_kills" not in text, text
    assert result.ret == 1, text
    pids = [int(str(e["pid"])) for e in _lines(out / "left.jsonl")]
    assert len(pids) == 2 and not _gone(pids), pids
