"""Leased ports and named resources across real processes: exclusion, SIGKILL, no deadlock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from child_processes import SRC, read_line, spawn
from devpool.devices.leases import Holder, Lease
from devpool.devices.ports import (
    acquire_ports,
    bindable,
    ephemeral_range,
    overlap_error,
    parse_range,
)
from devpool.devices.resources import (
    HostBlocked,
    HostLease,
    host_status,
    parse_resources,
    take_host_lease,
)

RANGE = (23000, 23063)  # outside this host's ephemeral range (32768-60999 and the like)
CAPACITY = {"hccl": 1, "license": 3}

# Takes a host lease (ports, resources) and says which ports, then holds it until stdin closes.
CHILD_HOLDS = """
import json, sys
from pathlib import Path
from devpool.devices.leases import Holder
from devpool.devices.resources import HostLease, take_host_lease
folder, ports, wanted = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
got = take_host_lease(folder, Holder.for_this_process("child", "t::child"), ports,
                      (23000, 23063), wanted, {"hccl": 1, "license": 3})
print(json.dumps(list(got.ports)) if isinstance(got, HostLease) else "blocked", flush=True)
sys.stdin.read()
"""


def holder() -> Holder:
    return Holder.for_this_process("s1", "tests/test_x.py::test_a")


def take(folder: Path, ports: int = 0, **wanted: int) -> HostLease | HostBlocked:
    return take_host_lease(folder, holder(), ports, RANGE, wanted, CAPACITY)


def test_parse_range_and_the_ephemeral_overlap(tmp_path: Path) -> None:
    assert parse_range("20000-29999") == (20000, 29999)
    assert parse_range(" 2000 - 2001 ") == (2000, 2001)
    for bad in ("20000", "3-2", "0-100", "29999-20000", 20000, "1024-70000"):
        with pytest.raises(ValueError):
            parse_range(bad)
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("32768\t60999\n")
    assert overlap_error((20000, 29999), ephemeral) is None
    error = overlap_error((30000, 40000), ephemeral)
    assert error is not None and "overlaps the kernel's ephemeral port range 32768-60999" in error
    assert overlap_error((30000, 40000), tmp_path / "absent") is None  # not Linux: no check
    assert ephemeral_range(tmp_path / "absent") is None


def test_parse_resources_names_the_bad_entry() -> None:
    assert parse_resources({"hccl": 1, "license": 4}, "pyproject.toml") == {
        "hccl": 1,
        "license": 4,
    }
    for table, word in (({"hccl": 0}, "hccl"), ({"a-b": 1}, "'a-b'"), ({"x": True}, "x")):
        with pytest.raises(ValueError, match=word):
            parse_resources(table, "pyproject.toml")


def test_ports_are_bindable_distinct_and_exclusive_across_processes(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        first = spawn(procs, ["-c", CHILD_HOLDS, str(tmp_path), "3", "{}"], stdin=True)
        theirs = json.loads(read_line(first))
        mine = take(tmp_path, ports=3)
        assert isinstance(mine, HostLease)
        assert len(set(theirs) | set(mine.ports)) == 6
        assert all(RANGE[0] <= port <= RANGE[1] for port in [*theirs, *mine.ports])
        assert all(bindable(port) for port in mine.ports)
        mine.release()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_port_someone_listens_on_is_never_handed_out(tmp_path: Path) -> None:
    # Two neighbouring ports nothing on this (shared) host uses right now.
    low = next(p for p in range(23000, 23060, 2) if bindable(p) and bindable(p + 1))
    listener = socket.socket()
    listener.bind(("127.0.0.1", low))
    listener.listen()
    try:
        got = acquire_ports(tmp_path, 1, (low, low + 1), start=0)
        assert got is not None
        assert [handle.device for handle in got] == [low + 1]
        os.close(got[0].fd)
        assert acquire_ports(tmp_path, 2, (low, low + 1), start=0) is None
    finally:
        listener.close()


def test_a_sigkilled_holder_frees_its_ports_and_resources(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        child = spawn(
            procs,
            ["-c", CHILD_HOLDS, str(tmp_path), "1", json.dumps({"hccl": 1, "license": 3})],
            stdin=True,
        )
        (port,) = json.loads(read_line(child))
        blocked = take(tmp_path, hccl=1)
        assert isinstance(blocked, HostBlocked) and blocked.what == "hccl"
        assert blocked.holders[0] is not None and blocked.holders[0].pid == child.pid
        assert "resource hccl held by pid" in blocked.describe()
        assert isinstance(take(tmp_path, license=1), HostBlocked)  # all 3 are the child's
        states = host_status(tmp_path)
        assert {(s.kind, s.name) for s in states} == {
            ("port", str(port)),
            ("resource", "hccl"),
            ("resource", "license"),
        }
        assert all(s.holder is not None and s.holder.pid == child.pid for s in states)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        got = take(tmp_path, ports=1, hccl=1, license=3)
        assert isinstance(got, HostLease), got
        got.release()
        assert host_status(tmp_path) == []
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_all_or_nothing_leaves_nothing_held_when_one_resource_is_busy(tmp_path: Path) -> None:
    busy = take(tmp_path, license=3)
    assert isinstance(busy, HostLease)
    got = take(tmp_path, ports=2, hccl=1, license=1)
    assert isinstance(got, HostBlocked) and got.what == "license" and got.free == 0
    assert {s.name for s in host_status(tmp_path)} == {"license"}  # hccl was given back
    busy.release()


def test_a_host_lease_goes_with_its_device_lease(tmp_path: Path) -> None:
    host = take(tmp_path, ports=1, hccl=1)
    assert isinstance(host, HostLease)
    lease = Lease("sim", holder(), [])
    lease.attach(host)
    assert len(lease.fds()) == 2
    lease.set_job("tests/test_y.py::test_b", 4242)
    assert {s.holder.job for s in host_status(tmp_path) if s.holder} == {"tests/test_y.py::test_b"}
    lease.release()
    assert host.released and host_status(tmp_path) == []


# One holder of a random list of requests. Each is taken the way the controller does: the
# devices (whole or by memory), then the host lease; when that fails the devices go back at
# once (no hold-and-wait) and it retries. While holding, it writes a guard file and checks
# every guard present against the capacities; then it removes the guard and releases.
CHILD_REQUESTS = """
import json, os, random, sys, time
from pathlib import Path
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir
from devpool.devices.resources import HostLease, take_host_lease
folder, guards, requests = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
locks = LockDir(folder)
capacity = {"hccl": 1, "license": 3}
rng = random.Random(os.getpid())
deadline = time.monotonic() + 60
done = 0
for turn, req in enumerate(requests):
    while True:
        if time.monotonic() > deadline:
            print(json.dumps({"done": done}), flush=True)
            sys.exit(3)
        holder = Holder.for_this_process("r", f"t::{turn}")
        if req["memory"]:
            got = locks.try_acquire_memory("sim", req["devices"], req["memory"],
                                           {0: 100, 1: 100, 2: 100}, holder)
        elif req["devices"]:
            got = locks.try_acquire("sim", req["devices"], holder)
        else:
            got = Lease("sim", holder, [])
        if isinstance(got, list):
            time.sleep(rng.random() * 0.003)
            continue
        host = take_host_lease(folder, holder, req["ports"], (23100, 23139),
                               req["resources"], capacity)
        if not isinstance(host, HostLease):
            got.release()  # never hold devices while waiting for the rest
            time.sleep(rng.random() * 0.003)
            continue
        got.attach(host)
        break
    guard = guards / f"guard-{os.getpid()}-{turn}"
    mine = {"devices": req["devices"], "memory": req["memory"], "ports": list(host.ports),
            "resources": req["resources"]}
    guard.write_text(json.dumps(mine))
    present = []
    for path in guards.glob("guard-*"):
        try:
            present.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    problems = []
    for device in (0, 1, 2):
        on = [g for g in present if device in g["devices"]]
        wholes = [g for g in on if not g["memory"]]
        if (wholes and len(on) > 1) or sum(g["memory"] for g in on) > 100:
            problems.append(f"device {device}: {on}")
    ports = [p for g in present for p in g["ports"]]
    if len(ports) != len(set(ports)):
        problems.append(f"ports {ports}")
    for name, cap in capacity.items():
        if sum(g["resources"].get(name, 0) for g in present) > cap:
            problems.append(f"{name} over {cap}")
    if problems:
        (guards / f"violation-{os.getpid()}-{turn}").write_text(json.dumps(problems))
    time.sleep(rng.random() * 0.004)
    guard.unlink()
    got.release()
    done += 1
print(json.dumps({"done": done}), flush=True)
"""

REQUEST = st.fixed_dictionaries(
    {
        "devices": st.lists(st.integers(0, 2), max_size=2, unique=True).map(sorted),
        "memory": st.sampled_from([0, 0, 30, 60]),
        "ports": st.integers(0, 2),
        "resources": st.dictionaries(
            st.sampled_from(["hccl", "license"]), st.integers(1, 3), max_size=2
        ).map(lambda r: {k: min(v, CAPACITY[k]) for k, v in r.items()}),
    }
).map(lambda r: {**r, "memory": r["memory"] if r["devices"] else 0})


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plans=st.lists(st.lists(REQUEST, min_size=1, max_size=8), min_size=3, max_size=4))
def test_random_concurrent_requests_never_exceed_a_capacity_nor_deadlock(
    tmp_path_factory: pytest.TempPathFactory, plans: list[list[dict[str, object]]]
) -> None:
    root = tmp_path_factory.mktemp("holders")
    folder, guards = root / "locks", root / "guards"
    folder.mkdir()
    guards.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD_REQUESTS, str(folder), str(guards), json.dumps(plan)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=SRC),
        )
        for plan in plans
    ]
    try:
        outputs = [proc.communicate(timeout=90)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, plan, output in zip(procs, plans, outputs, strict=True):
        assert proc.returncode == 0, f"a holder never got all its requests: {output}"
        assert json.loads(output.splitlines()[-1]) == {"done": len(plan)}
    assert sorted(p.name for p in guards.glob("violation-*")) == []
    assert host_status(folder) == []  # every holder gave everything back


def test_devpool_locks_lists_held_ports_and_resources_with_their_holders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devpool.cli import main

    procs: list[subprocess.Popen[str]] = []
    try:
        child = spawn(
            procs,
            ["-c", CHILD_HOLDS, str(tmp_path), "2", json.dumps({"hccl": 1, "license": 2})],
            stdin=True,
        )
        ports = json.loads(read_line(child))
        assert main(["locks", "--lock-dir", str(tmp_path)]) == 0
        shown = capsys.readouterr().out
        assert "ports and resources held:" in shown
        for port in ports:
            assert f"port {port}" in shown
        for name in ("hccl[0]", "license[0]", "license[1]"):
            assert f"{name} " in shown
        assert shown.count(f"held by pid {child.pid} ") == 5
        assert "test t::child" in shown
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert main(["locks", "--lock-dir", str(tmp_path)]) == 0
    assert "ports and resources held" not in capsys.readouterr().out  # freed with the child


def test_take_is_one_all_or_nothing_call_for_devices_memory_ports_and_resources(
    tmp_path: Path,
) -> None:
    from devpool.devices.lockdir import Blockers, LockDir, Want

    folder = LockDir(tmp_path / "locks")
    ring = {"ring": 1}
    first = folder.take(
        Want("sim", (0,), resources=ring, resource_capacity=ring), Holder.for_this_process("a")
    )
    assert isinstance(first, Lease) and first.devices == (0,)
    # Device 1 is free, the ring is not: nothing is held afterwards, and the holder is named.
    want = Want(
        "sim",
        (1,),
        memory=8 << 30,
        capacity={1: 64 << 30},
        ports=1,
        port_range=(24000, 24100),
        resources=ring,
        resource_capacity=ring,
    )
    blocked = folder.take(want, Holder.for_this_process("b"))
    assert isinstance(blocked, Blockers) and blocked.devices == []
    assert blocked.host is not None and blocked.host.what == "ring"
    assert "session a" in blocked.host.describe()
    assert not [s for s in folder.status() if s.device == 1 and (s.held or s.shares)]
    first.release()
    second = folder.take(want, Holder.for_this_process("b"))
    assert isinstance(second, Lease) and second.amount == 8 << 30
    host = second.host
    assert host is not None and len(host.ports) == 1 and host.resources == ring
    # A device another run holds whole: Blockers names it, and no port or unit is held.
    third = folder.take(
        Want("sim", (1,), ports=1, port_range=(24000, 24100)), Holder.for_this_process("c")
    )
    assert isinstance(third, Blockers) and [b.device for b in third.devices] == [1]
    second.release()
