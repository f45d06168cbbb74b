"""The zygote's controller side (backends/zygote.py) against a real zygote forked from this
test process: it answers, reports its children's exits, and a stuck one is ended."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devpool.backends import zygote


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def child_runs(tmp_path: Path) -> None:
    forks = zygote.Zygote(tmp_path / "zygote.log")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # A "template" whose pytest run fails at once: an unknown option, exit status 4.
        child = forks.spawn(
            ["--no-such-option"], dict(os.environ), tmp_path, tmp_path / "t.log", [theirs.fileno()]
        )
        theirs.close()
        assert child.wait(timeout=60) == 4
        assert "--no-such-option" in (tmp_path / "t.log").read_text()
    finally:
        ours.close()
        forks.close()
    assert not alive(forks.pid)


def stuck_zygote(tmp_path: Path) -> None:
    zygote.REPLY_TIMEOUT = 0.5  # this process is the scenario's own
    forks = zygote.Zygote(tmp_path / "zygote.log")
    os.kill(forks.pid, signal.SIGSTOP)
    _, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with pytest.raises(zygote.ZygoteGone):
        forks.spawn([], {}, tmp_path, tmp_path / "t.log", [theirs.fileno()])
    assert forks.gone
    deadline = time.monotonic() + 10
    while alive(forks.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(forks.pid), "the stuck zygote was left running"
    forks.close(grace=1.0)
    with pytest.raises(zygote.ZygoteGone):
        forks.spawn([], {}, tmp_path, tmp_path / "t.log", [theirs.fileno()])


def in_a_fresh_process(scenario: str, tmp_path: Path) -> None:
    """Run a scenario of this module in a fresh interpreter. A zygote forked from this test
    process would inherit whatever earlier tests left in it (a Ray client's gRPC state), as
    a controller's would, which is why the controller checks itself before it forks one
    (forkserver.unsafe_reason); the scenarios fork it unchecked."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "import test_zygote_process as scenarios\n"
        f"scenarios.{scenario}(Path({str(tmp_path)!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_child_of_the_zygote_runs_and_its_exit_status_comes_back(tmp_path: Path) -> None:
    in_a_fresh_process("child_runs", tmp_path)


def test_a_stuck_zygote_is_ended_and_says_so(tmp_path: Path) -> None:
    in_a_fresh_process("stuck_zygote", tmp_path)


pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the zygote waits on pidfds (Linux)"
)
