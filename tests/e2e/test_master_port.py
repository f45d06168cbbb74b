"""End to end: a MASTER_PORT exported by CI does not make side-by-side tests collide (issue 30).

Two tests that lease ports run at once on two sim devices; each binds MASTER_PORT as a
torch.distributed rank 0 would. The leased port wins over the caller's, one line says so,
and --devpool-keep-master-port keeps the caller's value.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import os
import socket
from pathlib import Path

import pytest


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.device_count(1)
@pytest.mark.ports(1)
def test_rendezvous(rank):
    port = int(os.environ["MASTER_PORT"])
    Path(f"port-{rank}.txt").write_text(str(port))
    if os.environ.get("BIND") == "1":
        with socket.socket() as sock:  # EADDRINUSE if another test had this port
            sock.bind(("127.0.0.1", port))
"""


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOOL_", "PYTEST_"))}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", MASTER_PORT="29500", BIND="1")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "devpool.plugin", "-p", "no:cacheprovider"]
        + ["--devices", "sim:0-1", f"--devpool-lock-dir={root / 'locks'}", "-q", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_leased_port_wins_over_the_callers_and_one_line_says_so(tmp_path: Path) -> None:
    (tmp_path / "test_ranks.py").write_text(SUITE)
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ports = {(tmp_path / f"port-{rank}.txt").read_text() for rank in (0, 1)}
    assert len(ports) == 2 and "29500" not in ports
    said = [line for line in done.stdout.splitlines() if "MASTER_PORT=29500" in line]
    assert len(said) == 1 and "--devpool-keep-master-port" in said[0], done.stdout


def test_keep_master_port_keeps_the_callers(tmp_path: Path) -> None:
    (tmp_path / "test_ranks.py").write_text(SUITE.replace('== "1"', '== "never"'))
    done = run(tmp_path, "--devpool-keep-master-port")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {(tmp_path / f"port-{rank}.txt").read_text() for rank in (0, 1)} == {"29500"}
