"""Ports and a capacity-1 host resource under 4 concurrent sessions on one host (issue 22).

The suite: 8 two-rank tests (device_count(2)) that bind the rendezvous port for a while, as
torch.distributed's TCP store binds MASTER_PORT, and connect a second "rank" to it; 4 tests
that bind two ports each; 4 tests that use a resource only one process on the host may use
at a time (an HCCL ring), each writing its hold interval to a file all sessions share.

Variants, each as 4 sessions started together on one host:
- devpool: `--devices sim:0-7`, one lock folder; MASTER_PORT, ports(2) and resources(hccl=1)
  come from devpool;
- xdist + find_free_port(): `pytest -n 2` with the usual fixture (bind port 0, read the port,
  close, hand it to the test); the hccl tests have nothing to keep them apart;
- xdist + MASTER_PORT 29500: `pytest -n 2` where the suite takes torch's default port.

Counted per variant: EADDRINUSE errors (each test that hits one writes a line to a shared
file), overlapping hccl holds, failed tests, and each session's wall time.

    python benchmarks/ports.py [--repeat N] [--sessions 4] [--devpool-src PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

INI = """
[pytest]
markers =
    device_count(n): devices
    ports(n): ports
    resources(**k): host resources
"""

PYPROJECT = """
[tool.devpool.resources]
hccl = 1
"""

SUITE = """
import errno
import os
import socket
import time
from pathlib import Path

import pytest

SHARED = Path({shared!r})
HOLD = 0.25


def listen(port):
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            with (SHARED / "eaddrinuse.txt").open("a") as out:
                out.write(f"{{port}}\\n")
        raise
    sock.listen()
    return sock


@pytest.mark.device_count(2)
@pytest.mark.parametrize("pair", range(8))
def test_two_ranks_rendezvous(pair, master_port):
    server = listen(master_port)
    client = socket.create_connection(("127.0.0.1", master_port))
    conn, _ = server.accept()
    client.sendall(b"rank 1")
    assert conn.recv(16) == b"rank 1"
    time.sleep(HOLD)
    client.close()
    conn.close()
    server.close()


@pytest.mark.ports(2)
@pytest.mark.parametrize("i", range(4))
def test_two_ports(i, two_ports):
    socks = [listen(port) for port in two_ports]
    time.sleep(HOLD)
    for sock in socks:
        sock.close()


@pytest.mark.resources(hccl=1)
@pytest.mark.parametrize("i", range(4))
def test_hccl_ring(i):
    began = time.time()
    time.sleep(HOLD)
    with (SHARED / "hccl.txt").open("a") as out:
        out.write(f"{{began}} {{time.time()}}\\n")
"""

CONFTEST = {
    "devpool": """
import os
import pytest

@pytest.fixture
def master_port():
    return int(os.environ["MASTER_PORT"])

@pytest.fixture
def two_ports(devpool_ports):
    return devpool_ports
""",
    "xdist-free-port": """
import socket
import pytest

def find_free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

@pytest.fixture
def master_port():
    return find_free_port()

@pytest.fixture
def two_ports():
    return [find_free_port(), find_free_port()]
""",
    "xdist-29500": """
import os
import socket
import pytest

def find_free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

@pytest.fixture
def master_port():
    return int(os.environ.get("MASTER_PORT", "29500"))

@pytest.fixture
def two_ports():
    return [find_free_port(), find_free_port()]
""",
}


@dataclass
class Result:
    variant: str
    eaddrinuse: list[int] = field(default_factory=list)
    overlaps: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)


def command(variant: str, root: Path, devpool_src: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env.pop("MASTER_PORT", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = str(devpool_src)
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if variant == "devpool":
        extra = ["-p", "devpool.plugin", "--devices", "sim:0-7"]
        extra += [f"--devpool-lock-dir={root.parent / 'locks'}"]
        extra += [f"--devpool-history={root / 'history.sqlite'}"]
        return [*base, *extra], env
    return [*base, "-p", "xdist.plugin", "-n", "2"], env


def failures(output: str) -> int:
    for line in reversed(output.splitlines()):
        if " failed" in line:
            return int(line.split(" failed")[0].split()[-1])
    return 0


def overlapping(path: Path) -> int:
    if not path.is_file():
        return 0
    spans = sorted(tuple(map(float, line.split())) for line in path.read_text().splitlines())
    return sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1])


def run_variant(variant: str, sessions: int, devpool_src: Path, result: Result) -> None:
    with tempfile.TemporaryDirectory(prefix=f"devpool-ports-{variant}-") as tmp:
        shared = Path(tmp) / "shared"
        shared.mkdir()
        procs = []
        for i in range(sessions):
            root = Path(tmp) / f"session{i}"
            root.mkdir()
            (root / "pytest.ini").write_text(INI)
            (root / "pyproject.toml").write_text(PYPROJECT)
            (root / "conftest.py").write_text(CONFTEST[variant])
            (root / "test_ports.py").write_text(textwrap.dedent(SUITE.format(shared=str(shared))))
            argv, env = command(variant, root, devpool_src)
            started = time.perf_counter()
            proc = subprocess.Popen(
                argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            procs.append((proc, started))
        failed = 0
        for proc, started in procs:
            output, _ = proc.communicate(timeout=600)
            result.walls.append(time.perf_counter() - started)
            failed += failures(output)
        used = shared / "eaddrinuse.txt"
        result.eaddrinuse.append(len(used.read_text().splitlines()) if used.is_file() else 0)
        result.overlaps.append(overlapping(shared / "hccl.txt"))
        result.failed.append(failed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--devpool-src", type=Path, default=SRC)
    args = parser.parse_args(argv)
    results = {name: Result(name) for name in CONFTEST}
    for _ in range(args.repeat):  # variants alternate: drift in load hits all alike
        for name, result in results.items():
            run_variant(name, args.sessions, args.devpool_src, result)
    print(f"{args.sessions} concurrent sessions × 16 tests, {args.repeat} repetitions")
    print(
        "| variant | EADDRINUSE | overlapping hccl holds | failed tests "
        "| session wall (median, max) |"
    )
    print("|---|---|---|---|---|")
    for result in results.values():
        walls = f"{statistics.median(result.walls):.1f} s, {max(result.walls):.1f} s"
        print(
            f"| {result.variant} | {'/'.join(map(str, result.eaddrinuse))} "
            f"| {'/'.join(map(str, result.overlaps))} | {'/'.join(map(str, result.failed))} "
            f"| {walls} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
