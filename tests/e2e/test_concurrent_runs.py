"""Concurrent runs on one lock folder: a run waits for what other live runs hold or wait
for, and never ends a test because someone else is using the devices (issue 27).

The property: hypothesis draws 2-6 real sessions started at random offsets on one lock
folder, each with a random mix of 1/2/4/8-device, memory, port and resource tests of 0-200
ms, and sometimes SIGKILLs one of them. Every session not killed ends green, and no two
tests ever held the same device, the same memory beyond a device's capacity, the same port
or the one ring at once (each test writes the interval it held them into a shared file).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessions import FAST

GIB = 1 << 30
CAPACITY = 76 * GIB  # 80 GiB less the default 5% reserve
MEMORY = 30  # GiB a memory test declares: two fit on a device, three do not

PROJECT = """
[tool.devpool]
devices = "sim:0-7"
ports = "{ports}"

[tool.devpool.platforms]
sim = {{ memory = "80GiB" }}

[tool.devpool.resources]
ring = 1
"""

PRELUDE = """
import json
import os
import time

import pytest

HOLDS = {holds!r}
SESSION = {session!r}


def hold(kind, seconds):
    start = time.time()
    time.sleep(seconds)
    line = dict(
        session=SESSION,
        kind=kind,
        devices=os.environ.get("DEVPOOL_DEVICES", ""),
        ports=os.environ.get("DEVPOOL_PORTS", ""),
        start=start,
        end=time.time(),
    )
    # One short O_APPEND write per test: lines of concurrent writers never interleave.
    fd = os.open(HOLDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (json.dumps(line) + "\\n").encode())
    os.close(fd)
"""

MARKS = {
    "cpu": [],
    "d1": ["device_count(1)"],
    "d2": ["device_count(2)"],
    "d4": ["device_count(4)"],
    "d8": ["device_count(8)"],
    "mem1": [f'device_memory("{MEMORY}GiB")'],
    "mem2": ["device_count(2)", f'device_memory("{MEMORY}GiB")'],
    "port": ["device_count(1)", "ports(1)"],
    "ring": ["device_count(1)", "resources(ring=1)"],
}

tests_ = st.lists(
    st.tuples(st.sampled_from(sorted(MARKS)), st.sampled_from([0.0, 0.02, 0.05, 0.1, 0.2])),
    min_size=3,
    max_size=14,
)
sessions_ = st.lists(
    st.tuples(tests_, st.sampled_from([0.0, 0.0, 0.1, 0.3, 0.6])), min_size=2, max_size=6
)


def write_suite(root: Path, session: str, holds: Path, tests: list[tuple[str, float]]) -> None:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT.format(ports=PORTS))
    body = [PRELUDE.format(holds=str(holds), session=session)]
    for i, (kind, seconds) in enumerate(tests):
        marks = "".join(f"@pytest.mark.{mark}\n" for mark in MARKS[kind])
        body.append(f"\n{marks}def test_{i}_{kind}():\n    hold({kind!r}, {seconds})\n")
    (root / "test_mix.py").write_text("".join(body))


PORTS = "25000-25200"


def start(root: Path, lock: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.pop("MASTER_PORT", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *FAST, f"--devpool-lock-dir={lock}", "-q"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its process group: a SIGKILL takes its workers too
    )


@pytest.fixture(autouse=True)
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions and their workers load devpool alone (FAST), not every installed plugin."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("MASTER_PORT", raising=False)


def overlaps(holds: list[dict[str, Any]]) -> list[str]:
    """Every pair of holds that shared what only one may hold, or memory past capacity."""
    found = []
    by_device: dict[str, list[tuple[float, float, int, str]]] = defaultdict(list)
    by_port: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    ring: list[tuple[float, float, str]] = []
    for h in holds:
        who = f"{h['session']}:{h['kind']}"
        amount = MEMORY * GIB if h["kind"].startswith("mem") else CAPACITY
        for device in filter(None, h["devices"].split(",")):
            by_device[device].append((h["start"], h["end"], amount, who))
        for port in filter(None, h["ports"].split(",")):
            by_port[port].append((h["start"], h["end"], who))
        if h["kind"] == "ring":
            ring.append((h["start"], h["end"], who))
    for device, spans in by_device.items():
        for start, _, _, who in spans:
            # At each hold's start: the holds open then, this one included.
            open_ = [s for s in spans if s[0] <= start < s[1]]
            if sum(s[2] for s in open_) > CAPACITY:
                found.append(f"sim:{device} at {start}: {[s[3] for s in open_]} ({who})")
    for what, spans3 in [*(("port " + p, s) for p, s in by_port.items()), ("ring", ring)]:
        spans3.sort()
        for a, b in zip(spans3, spans3[1:], strict=False):
            if b[0] < a[1]:
                found.append(f"{what}: {a[2]} and {b[2]}")
    return found


def run_sessions(
    tmp: Path, draw: list[tuple[list[tuple[str, float]], float]], kill: int | None
) -> None:
    lock = tmp / "locks"
    lock.mkdir()
    holds = tmp / "holds.jsonl"
    roots = []
    for k, (tests, _) in enumerate(draw):
        write_suite(tmp / f"run{k}", f"run{k}", holds, tests)
        roots.append(tmp / f"run{k}")
    procs: list[subprocess.Popen[str]] = []
    try:
        for root, (_, offset) in zip(roots, draw, strict=True):
            time.sleep(offset)  # the drawn start offset, not a wait for anything
            procs.append(start(root, lock))
        if kill is not None:
            victim = procs[kill % len(procs)]
            time.sleep(0.5)  # mid-run for most draws: after its start, before its end
            os.killpg(victim.pid, signal.SIGKILL)
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for k, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        if kill is not None and proc is procs[kill % len(procs)]:
            continue
        assert proc.returncode == 0, f"run{k}:\n{output[-3000:]}"
        assert f"{len(draw[k][0])} passed" in output, f"run{k}:\n{output[-3000:]}"
        assert "INFRA" not in output, output
    lines = holds.read_text().splitlines() if holds.exists() else []
    assert overlaps([json.loads(line) for line in lines]) == []


@pytest.mark.timeout(900)
@settings(
    max_examples=int(os.environ.get("DEVPOOL_CONCURRENT_EXAMPLES", "6")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(draw=sessions_, kill=st.one_of(st.none(), st.none(), st.integers(0, 5)))
def test_concurrent_sessions_wait_for_each_other_and_end_green(
    tmp_path_factory: pytest.TempPathFactory,
    draw: list[tuple[list[tuple[str, float]], float]],
    kill: int | None,
) -> None:
    run_sessions(tmp_path_factory.mktemp("concurrent"), draw, kill)


def test_the_stress_mix_of_issue_27_ends_green_in_four_sessions(tmp_path: Path) -> None:
    """4 sessions at once of the mix that ended every test infra about 1 time in 5."""
    mix = [("d1", 0.02)] * 24 + [("d2", 0.02)] * 8 + [("d4", 0.02)] * 4
    run_sessions(tmp_path, [(mix, 0.0)] * 4, None)


WAITERS_SUITE = """
import pytest

@pytest.mark.device_count(4)
@pytest.mark.parametrize("i", range(3))
def test_four(i):
    pass

@pytest.mark.device_count(1)
@pytest.mark.parametrize("i", range(6))
def test_one(i):
    pass
"""


def waiting_room(lock: Path, count: int) -> list[subprocess.Popen[bytes]]:
    """`count` live runs that wait for devices and hold none, as runs between two leases do:
    each a real process with its file in the lock folder's waiting room."""
    room = lock / "waiting"
    room.mkdir(exist_ok=True)
    procs = []
    for k in range(count):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(proc)
        waiter = dict(
            session=f"other{k}",
            pid=proc.pid,
            host=socket.gethostname(),
            platform="sim",
            since=time.time() - 60,
            wants=1,
        )
        (room / f"other{k}.json").write_text(json.dumps(waiter))
    return procs


def test_a_run_whose_share_is_too_small_waits_for_the_others(
    pytester: pytest.Pytester, lock: Path
) -> None:
    """Three other runs wait: this run's fair share (2 of 8) is below its 4-device tests.
    It waits for them (it once ended all 9 tests infra at once), and runs when they leave."""
    pytester.makepyfile(test_it=WAITERS_SUITE)
    others = waiting_room(lock, 3)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOOL_")}
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        session = subprocess.Popen(
            [sys.executable, "-m", "pytest", *FAST, f"--devpool-lock-dir={lock}"]
            + ["--devices", "sim:0-7", "-q"],
            cwd=pytester.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        room = lock / "waiting"
        deadline = time.monotonic() + 60
        # It joins the waiting room itself, so the others' fair shares make room for it.
        while not [p for p in room.glob("*.json") if not p.name.startswith("other")]:
            assert session.poll() is None, session.communicate()[0]
            assert time.monotonic() < deadline, "the run never joined the waiting room"
            time.sleep(0.05)
        assert session.poll() is None  # it waits, and has ended nothing
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
    output = session.communicate(timeout=120)[0]
    assert session.returncode == 0, output
    assert "9 passed" in output and "INFRA" not in output, output


def test_a_share_that_never_comes_ends_infra_after_the_lease_timeout_naming_the_waiters(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyfile(test_it=WAITERS_SUITE)
    others = waiting_room(lock, 3)
    try:
        result = pytester.runpytest_subprocess(
            *FAST,
            f"--devpool-lock-dir={lock}",
            "--devices",
            "sim:0-7",
            "--devpool-lease-timeout=1",
            timeout=120,
        )
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
    out = result.stdout.str()
    assert result.ret == 1, out
    assert "not placed within --devpool-lease-timeout 1s" in out, out
    pids = ", ".join(f"pid {p.pid}" for p in others)
    assert f"runs waiting for a share: {pids}" in out or all(
        f"pid {p.pid}" in out for p in others
    ), out


HOLDER = """
import time
from pathlib import Path

import pytest


@pytest.mark.device_count(2)
def test_holds_two():
    Path({flag!r}).write_text("held")
    deadline = time.monotonic() + 60
    while not Path({release!r}).exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
"""

WAITER = """
import pytest


@pytest.mark.device_count(2)
@pytest.mark.device_memory("30GiB")
@pytest.mark.parametrize("i", range(3))
def test_two_shared(i):
    pass


@pytest.mark.device_count(2)
def test_two_whole():
    pass
"""


def test_the_waiting_line_names_the_other_run_once_and_never_itself(tmp_path: Path) -> None:
    """A run whose memory and whole-device requests wait for another run's lease: its
    waiting line names that run and its test, once, on a line of its own."""
    lock = tmp_path / "locks"
    lock.mkdir()
    flag, release = tmp_path / "held", tmp_path / "release"
    roots = []
    for name, body in (("holder", HOLDER.format(flag=str(flag), release=str(release))),):
        root = tmp_path / name
        root.mkdir()
        (root / "pyproject.toml").write_text(
            '[tool.devpool]\ndevices = "sim:0-1"\n\n[tool.devpool.platforms]\n'
            'sim = { memory = "80GiB" }\n'
        )
        (root / "test_it.py").write_text(body)
        roots.append(root)
    waiter = tmp_path / "waiter"
    waiter.mkdir()
    (waiter / "pyproject.toml").write_text((roots[0] / "pyproject.toml").read_text())
    (waiter / "test_it.py").write_text(WAITER)
    holder = start(roots[0], lock)
    second: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        second = start(waiter, lock)
        room = lock / "waiting"
        deadline = time.monotonic() + 60
        while not list(room.glob("*.json")):  # it waits, and says so
            assert second.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        release.write_text("")
        out = second.communicate(timeout=120)[0]
        assert holder.wait(timeout=60) == 0
    finally:
        for proc in (holder, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert second.returncode == 0, out
    lines = [line for line in out.splitlines() if "waiting for devices" in line]
    assert len(lines) == 1, out
    assert lines[0].startswith(
        "devpool: waiting for devices held by other runs (this run needs 2 sim devices of 2): "
        "sim:0,1 held by"
    ), lines[0]
    assert f"pid {holder.pid} " in lines[0] and "test test_it.py::test_holds_two" in lines[0]
    assert f"pid {second.pid} " not in lines[0], lines[0]
