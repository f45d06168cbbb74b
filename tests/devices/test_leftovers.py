"""devices/leftovers.py on real processes: found below us, ended with escalation, and a
run's orphans told from another run's by their mark."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from devpool.devices import leftovers

SLEEPER = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(600)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(600)",
]


def _started(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_a_child_out_of_our_group_is_found_named_and_terminated() -> None:
    proc = _started(SLEEPER, start_new_session=True)
    try:
        assert leftovers.has_children()
        below = leftovers.descendants(os.getpid())
        [found] = [p for p in below if p.pid == proc.pid]
        assert found.sid == proc.pid != os.getsid(0)
        left = leftovers.describe(found)
        assert "time.sleep(600)" in left.command and "\n" not in left.command
        assert leftovers.end([found]) == {proc.pid: "terminated"}
        assert leftovers.read(proc.pid) is None  # ended and reaped (no zombie left)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_one_that_ignores_sigterm_is_killed_within_the_grace() -> None:
    proc = _started(STUBBORN, start_new_session=True)
    try:
        [found] = [p for p in leftovers.descendants(os.getpid()) if p.pid == proc.pid]
        began = time.monotonic()
        assert leftovers.end([found], grace=0.5) == {proc.pid: "killed"}
        assert time.monotonic() - began < 2.0
        assert leftovers.read(proc.pid) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pid_that_is_another_process_now_is_not_signalled() -> None:
    """A process found, ended and its pid reused before end() signals: the new holder of the
    pid (a process as it was read, started at another time) is left alone."""
    proc = _started(SLEEPER, start_new_session=True)
    try:
        [found] = [p for p in leftovers.descendants(os.getpid()) if p.pid == proc.pid]
        earlier = dataclasses.replace(found, start=found.start - 1)  # the pid's former holder
        assert leftovers.end([earlier], grace=0.2) == {proc.pid: "exited"}
        assert proc.poll() is None  # the live process behind the pid never got a signal
        assert leftovers.end([found], grace=2.0) == {proc.pid: "terminated"}
        assert leftovers.read(proc.pid) is None  # ended and reaped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_settled_keeps_what_outlives_the_wait_and_leaves_exit_statuses_to_their_parent() -> None:
    ending = _started([sys.executable, "-c", "import sys, time; print('up', flush=True); "
                       "time.sleep(0.5); sys.exit(3)"])  # fmt: skip
    staying = _started(SLEEPER)
    try:
        procs = [
            p for p in leftovers.descendants(os.getpid()) if p.pid in (ending.pid, staying.pid)
        ]
        assert len(procs) == 2
        began = time.monotonic()
        assert [p.pid for p in leftovers.settled(procs, within=2.0)] == [staying.pid]
        assert time.monotonic() - began >= 2.0  # one stayed: the whole wait
        assert ending.wait(5) == 3  # a zombie until its parent waits: its status is intact
        began = time.monotonic()
        assert leftovers.settled([p for p in procs if p.pid == ending.pid], within=5.0) == []
        assert time.monotonic() - began < 1.0  # none alive: no wait
    finally:
        staying.kill()
        staying.wait()


def test_a_process_with_nothing_below_it_has_no_children() -> None:
    code = "from devpool.devices import leftovers; print(leftovers.has_children())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_subreaper_adopts_a_double_forked_daemon() -> None:
    """The daemon's parent exits at once; the subreaper above it, not init, adopts it."""
    code = """
import os, sys, time
from devpool.devices import leftovers
assert leftovers.make_subreaper()
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        time.sleep(600)
        os._exit(0)
    os._exit(0)
os.wait()
time.sleep(0.2)
below = leftovers.descendants(os.getpid())
print(len(below), below[0].ppid == os.getpid())
print(leftovers.end(below)[below[0].pid])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.split() == ["1", "True", "terminated"], out


ORPHANS = """
import os, signal, subprocess, sys, time
from devpool.devices import leftovers

run = leftovers.RunMark.of(leftovers.this_run(), os.getpid())
# sh backgrounds a sleeper and exits: it is orphaned (to init, or to a subreaper above this
# process: a devpool worker running this test). Its output must not hold run()'s pipe.
line = sys.executable + " -c 'import time; time.sleep(600)' </dev/null >/dev/null 2>&1 & echo $!"
pids = []
for mark in (run.mark, "another.1"):
    env = {**os.environ, leftovers.MARK_ENV: mark}
    done = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True)
    pids.append(int(done.stdout))
try:
    deadline = time.monotonic() + 5
    found = []
    while time.monotonic() < deadline and pids[0] not in found:
        found = [p.pid for p in leftovers.orphans(run)]
    print(pids[0] in found, pids[1] in found)
finally:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
"""


def test_a_runs_orphans_are_those_of_its_mark() -> None:
    """Orphans exec'd with this run's mark are found; another run's are not."""
    out = subprocess.run(
        [sys.executable, "-c", ORPHANS], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "False"], out


@pytest.mark.parametrize("kind", ["process", "thread", "memory"])
def test_each_kind_of_leak_is_said_in_one_line(kind: str) -> None:
    from devpool.worker import leaks, protocol

    message = protocol.Leak(
        nodeid="t.py::a",
        kind=kind,
        pid=42,
        command="srv --port 30001" if kind == "process" else "poller running wait",
        holds=["sim:0", "port 30001"] if kind == "process" else [],
        ended="terminated",
    )
    line = leaks.line(message)
    assert "\n" not in line and line.endswith(": terminated")
    assert ("42" in line) and (kind != "process" or "`srv --port 30001`" in line)


RUN_ALIKE = """
import ctypes, os, sys, time
from devpool.devices import leftovers

mark = sys.stdin.readline().strip()  # not in argv or the environment: the runs look alike
assert leftovers.mark_forks(mark)
if os.fork() == 0:  # a template, never exec'd
    ctypes.CDLL(None).prctl(15, b"devpool-tmpl")
    if os.fork() == 0:  # its worker, lost when the template ends at once
        ctypes.CDLL(None).prctl(15, b"devpool-worker")
        print(os.getpid(), flush=True)
        time.sleep(600)
    os._exit(0)
time.sleep(600)
"""

REAPER = """
import os, signal, subprocess, sys, time
from devpool.devices import leftovers

leftovers.make_subreaper()  # the lost workers come to this process, which maps no mark
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # and are reaped here as they end: no zombie
for mark in ("A.1", "B.1"):
    run = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "STARTED_AS": "a run"},  # the same for both runs
    )
    run.stdin.write(mark + "\\n")
    run.stdin.close()
    print(run.pid, run.stdout.readline().strip(), flush=True)
time.sleep(600)
"""

SWEEPS = """
import dataclasses, sys
from devpool.devices import leftovers

pairs = [[int(word) for word in pair.split(",")] for pair in sys.argv[1:]]
runs = [leftovers.RunMark.of(mark, pid) for mark, (pid, _) in zip(("A.1", "B.1"), pairs)]
workers = [worker for _, worker in pairs]
for run in runs:
    found = {p.pid for p in leftovers.orphans(run)}
    print(run.mapped, *(w in found for w in workers))
# Told by the environment and the command line alone, each run takes the other's too.
found = {p.pid for p in leftovers.orphans(dataclasses.replace(runs[0], mapped=False))}
print(*(w in found for w in workers))
"""


def test_a_lost_fork_of_a_run_started_alike_is_that_runs_alone() -> None:
    """Two runs with the same command line and environment each lose a worker (its template
    ended): each run's sweep finds its own by the memfd its controller mapped, not the
    other's, which an environment and command line alone cannot tell apart."""
    probe = "from devpool.devices import leftovers; print(leftovers.mark_forks('probe.0'))"
    offered = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if offered.stdout.strip() != "True":
        pytest.skip("this kernel or sandbox offers no memfd: runs are told by environment")
    reaper = subprocess.Popen(
        [sys.executable, "-c", REAPER, RUN_ALIKE], stdout=subprocess.PIPE, text=True
    )
    pairs: list[list[int]] = []
    try:
        assert reaper.stdout is not None
        pairs = [[int(word) for word in reaper.stdout.readline().split()] for _ in range(2)]
        deadline = time.monotonic() + 5
        while any(getattr(leftovers.read(w), "ppid", 0) != reaper.pid for _, w in pairs):
            assert time.monotonic() < deadline, pairs
            time.sleep(0.01)
        # Swept from a process beside them: the reaper is no ancestor of the sweeper.
        out = subprocess.run(
            [sys.executable, "-c", SWEEPS, *(f"{run},{worker}" for run, worker in pairs)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    finally:
        for pid in (pid for pair in pairs for pid in pair):  # the reaper reaps them
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while leftovers.descendants(reaper.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        reaper.kill()
        reaper.wait()
        if reaper.stdout is not None:
            reaper.stdout.close()
    assert out.stdout.splitlines() == ["True True False", "True False True", "True True"], out


def test_the_guard_runs_this_file_alone_with_no_site_packages() -> None:
    """The guard is `python -I -S leftovers.py` (run/leaks.py): the file imports nothing of
    devpool's or of site-packages, or the guard dies at its first line and nothing outlives
    a SIGKILLed controller's sweep (tests/e2e/test_leaks.py sees it end to end)."""
    code = f"import runpy; runpy.run_path({leftovers.__file__!r}); print('loaded')"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "loaded\n", done.stderr
