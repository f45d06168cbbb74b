"""Ports and named resources across 4 concurrent sessions on one host: no EADDRINUSE, no
two holders of a capacity-1 resource at once, every test green; and the user's mistakes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sessions import FAST, events, junit_cases, text

SESSIONS = 4

PROJECT = """
[tool.devpool]
devices = "sim:0-7"
ports = "24000-24999"

[tool.devpool.resources]
hccl = 1
"""

# Each test binds what it was given for a while, as torch.distributed's TCP store binds
# MASTER_PORT; an EADDRINUSE fails it. hccl holders append their hold interval to a file
# every session shares.
SUITE = """
import os
import socket
import time
from pathlib import Path

import pytest

HOLDS = Path({holds!r})


def listen(port):
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.mark.device_count(2)
@pytest.mark.parametrize("rank_pair", range(4))
def test_two_ranks_bind_master_port(rank_pair):
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    port = int(os.environ["MASTER_PORT"])
    assert os.environ["DEVPOOL_PORTS"] == str(port)
    sock = listen(port)
    time.sleep(0.3)
    sock.close()


@pytest.mark.ports(2)
@pytest.mark.parametrize("i", range(3))
def test_two_ports_bound(i, devpool_ports):
    assert len(devpool_ports) == 2 and all(24000 <= p <= 24999 for p in devpool_ports)
    socks = [listen(port) for port in devpool_ports]
    time.sleep(0.3)
    for sock in socks:
        sock.close()


@pytest.mark.resources(hccl=1)
@pytest.mark.parametrize("i", range(3))
def test_holds_the_ring(i):
    assert os.environ["DEVPOOL_RESOURCES"] == "hccl=1"
    began = time.time()
    time.sleep(0.25)
    ended = time.time()
    with HOLDS.open("a") as out:
        out.write(f"{{began}} {{ended}} {{os.getpid()}}\\n")
"""


def project(root: Path, holds: Path) -> Path:
    root.mkdir()
    (root / "pyproject.toml").write_text(PROJECT)
    (root / "test_host.py").write_text(textwrap.dedent(SUITE.format(holds=str(holds))))
    return root


def start(root: Path, lock: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("MASTER_PORT", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            *FAST,
            f"--devpool-lock-dir={lock}",
            "-q",
            f"--junitxml={root / 'junit.xml'}",
            "-p",
            "no:randomly",
        ],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@pytest.fixture(autouse=True)
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions and their workers load devpool alone (FAST), not every installed plugin."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("MASTER_PORT", raising=False)


def test_four_concurrent_sessions_share_ports_and_a_resource_safely(
    tmp_path: Path, lock: Path
) -> None:
    holds = tmp_path / "hccl-holds.txt"
    roots = [project(tmp_path / f"run{i}", holds) for i in range(SESSIONS)]
    procs = [start(root, lock) for root in roots]
    try:
        outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output
        assert "10 passed" in output, output
        assert "EADDRINUSE" not in output and "Address already in use" not in output
    spans = sorted(
        tuple(float(x) for x in line.split()[:2]) for line in holds.read_text().splitlines()
    )
    assert len(spans) == 3 * SESSIONS
    overlaps = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
    assert overlaps == []
    # What each test held is in JUnit and in the run record.
    props = {
        case.get("name", ""): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in junit_cases(roots[0] / "junit.xml")
    }
    ports = {name: p.get("devpool.ports", "") for name, p in props.items()}
    assert all(len(v.split(",")) == 2 for k, v in ports.items() if "two_ports" in k)
    assert all(p.get("devpool.resources") == "hccl=1" for k, p in props.items() if "ring" in k)
    record = next((roots[0] / ".devpool" / "runs").glob("*/record.jsonl"))
    leased = events(record, "host_lease")
    assert {tuple(sorted(e["resources"])) for e in leased} >= {("hccl",)}
    ended = {e["nodeid"]: e for e in events(record, "job_end")}
    assert all(len(e["ports"]) == 2 for k, e in ended.items() if "two_ports" in k)
    assert all(e["resources"] == {"hccl": 1} for k, e in ended.items() if "ring" in k)
    from devpool.report.html import render_html
    from devpool.report.record import read_record

    page = render_html(read_record(record))
    assert "resources: hccl=1" in page and "ports: " in page


def test_unknown_resource_is_a_usage_error_naming_the_test(
    pytester: pytest.Pytester, lock: Path
) -> None:
    pytester.makepyprojecttoml(PROJECT)
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.resources(nccl=1)
        def test_ring():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*FAST, f"--devpool-lock-dir={lock}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = text(result)
    assert "test_bad.py::test_ring: @pytest.mark.resources names unknown resource 'nccl'" in out
    assert "Traceback" not in out


def test_a_ports_range_in_the_ephemeral_range_is_refused(
    pytester: pytest.Pytester, lock: Path
) -> None:
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ephemeral.is_file():
        pytest.skip("no ephemeral port range to overlap on this system")
    low, high = (int(x) for x in ephemeral.read_text().split()[:2])
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess(
        *FAST, f"--devpool-lock-dir={lock}", "--devices=sim:0-1", f"--devpool-ports={low}-{high}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = text(result)
    assert f"overlaps the kernel's ephemeral port range {low}-{high}" in out
    assert "Traceback" not in out


HOLDER = """
import os
import time
from pathlib import Path

import pytest

OUT = Path({out!r})


@pytest.mark.resources(hccl=1)
def test_holds_and_hangs():
    (OUT / "holder.tmp").write_text(str(os.getpid()))
    os.replace(OUT / "holder.tmp", OUT / "holder.pid")
    time.sleep(120)
"""

WAITER = """
import os

import pytest


@pytest.mark.resources(hccl=1)
def test_gets_the_ring_once_free():
    assert os.environ["DEVPOOL_RESOURCES"] == "hccl=1"
"""


def wait_for(condition: Callable[[], bool], bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"waited {bound}s for {what}"
        time.sleep(0.05)


def record_text(root: Path) -> str:
    return "".join(p.read_text() for p in (root / ".devpool" / "runs").glob("*/record.jsonl"))


def held_by(lock: Path) -> set[int]:
    from devpool.devices.resources import host_status

    return {s.holder.pid for s in host_status(lock) if s.holder and s.name == "hccl"}


def test_a_sigkilled_session_frees_its_resource_for_the_next_run(
    tmp_path: Path, lock: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    for root, body in ((first, HOLDER.format(out=str(out))), (second, WAITER)):
        root.mkdir()
        (root / "pyproject.toml").write_text(PROJECT)
        (root / "test_it.py").write_text(textwrap.dedent(body))
    holder = start(first, lock)
    waiter: subprocess.Popen[str] | None = None
    try:
        wait_for((out / "holder.pid").is_file, 60, "the first run's test to hold hccl")
        worker = int((out / "holder.pid").read_text())
        assert held_by(lock) == {holder.pid}  # the controller's record: its lease
        waiter = start(second, lock)
        wait_for(lambda: "session_start" in record_text(second), 60, "the second run to start")
        assert waiter.poll() is None and "job_start" not in record_text(second)  # it waits
        os.kill(holder.pid, signal.SIGKILL)  # the controller and its worker, both holders
        os.kill(worker, signal.SIGKILL)
        output = waiter.communicate(timeout=120)[0]
        assert waiter.returncode == 0, output
        assert "1 passed" in output
    finally:
        for proc in (holder, waiter):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_a_resource_held_past_the_lease_timeout_ends_infra_naming_the_holder(
    pytester: pytest.Pytester, lock: Path
) -> None:
    from devpool.devices.leases import Holder
    from devpool.devices.resources import HostLease, take_host_lease

    held = take_host_lease(
        lock,
        Holder.for_this_process("other-run", "t::other"),
        0,
        (24000, 24999),
        {"hccl": 1},
        {"hccl": 1},
    )
    assert isinstance(held, HostLease)
    try:
        pytester.makepyprojecttoml(PROJECT)
        pytester.makepyfile(test_wait=WAITER)
        result = pytester.runpytest_subprocess(
            *FAST, f"--devpool-lock-dir={lock}", "--devpool-lease-timeout=1", timeout=60
        )
    finally:
        held.release()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = text(result)
    assert "no lease on hccl within --devpool-lease-timeout 1s" in out
    assert f"resource hccl held by pid {os.getpid()}" in out


CHAINED = """
import pytest


@pytest.mark.resources(hccl=1)
@pytest.mark.order(1)
def test_first():
    pass


@pytest.mark.resources(hccl=1)
@pytest.mark.order(2)
def test_second():
    pass


@pytest.mark.resources(hccl=1)
@pytest.mark.order(3)
def test_third():
    pass
"""


def test_a_chain_whose_first_test_never_gets_its_lease_ends_whole(
    pytester: pytest.Pytester, lock: Path
) -> None:
    """pytest-order ties the three tests into one chain: the first waits out the lease timeout,
    and the two behind it end with it, naming it (they were once lost: 'a devpool bug')."""
    from devpool.devices.leases import Holder
    from devpool.devices.resources import HostLease, take_host_lease

    held = take_host_lease(
        lock, Holder.for_this_process("other-run", "t::other"), 0, (24000, 24999),
        {"hccl": 1}, {"hccl": 1},
    )  # fmt: skip
    assert isinstance(held, HostLease)
    try:
        pytester.makepyprojecttoml(PROJECT)
        pytester.makepyfile(test_chain=CHAINED)
        result = pytester.runpytest_subprocess(
            *FAST, "-p", "pytest_order", f"--devpool-lock-dir={lock}",
            "--devpool-lease-timeout=1", "-rA", timeout=60,
        )  # fmt: skip
    finally:
        held.release()
    out = text(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "a devpool bug" not in out, out
    assert "3 infra" in out.splitlines()[-1], out
    assert "no lease on hccl within --devpool-lease-timeout 1s" in out
    assert out.count("the first test of its chain, test_chain.py::test_first, did not start") >= 2
