"""The zygote's controller side (backends/zygote.py) against a real zygote forked from this
test process: it answers, reports its children's exits, and a stuck one is ended."""

from __future__ import annotations

import os
import signal
import socket
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


def test_a_child_of_the_zygote_runs_and_its_exit_status_comes_back(tmp_path: Path) -> None:
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


def test_a_stuck_zygote_is_ended_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zygote, "REPLY_TIMEOUT", 0.5)
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


pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the zygote waits on pidfds (Linux)"
)
