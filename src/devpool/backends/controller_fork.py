"""A template started as a fork of the controller, just before the controller collects.

A template started as `python -m pytest ... --devpool-worker template,...` pays for an
interpreter, pytest, every plugin and the conftests' imports (torch, when a conftest
imports it) before it collects: about a second on a small suite, more with a framework,
on the path of the first lease. At the start of its collection the controller has all of
that in memory (its conftests rewritten, as pytest rewrites them) and has taken no lease,
run no thread and imported no test module yet: a fork of it, given the template's
environment and arguments, runs pytest's main again and only collects.

The child keeps nothing of the controller's: its own session and process group, its log
as stdout and stderr, no file descriptor but its socket, default signal handlers, no exit
handler of the controller's. When the controller is not safe to fork (a thread, a device
runtime, coverage: worker/template.py's checks) the template starts as a fresh process.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import io
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

import pytest

_RESET = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD")


class ForkedChild:
    """A child of this process, seen as subprocess.Popen sees one (pid, poll, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already, by a wait for any child
                self.returncode = 0
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(["template", str(self.pid)], timeout or 0.0)
            try:
                fd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                continue  # gone between the two calls: poll reaps it
            try:
                select.select([fd], [], [], left)
            finally:
                os.close(fd)
        assert self.returncode is not None
        return self.returncode


def fork_template(
    args: list[str], env: Mapping[str, str], cwd: Path, log: Path, keep: tuple[int, ...]
) -> ForkedChild:
    """Fork this process into a template running `pytest args` (keep: its socket's fd)."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()  # or the child would write the controller's pending output
    gc.collect()  # no garbage of the controller's is finalised in the child
    pid = os.fork()
    if pid:
        return ForkedChild(pid)
    code = 70
    try:
        _become_template(args, env, cwd, log, keep)
        code = int(pytest.main(args))
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001 - the child must never return into the controller
        with contextlib.suppress(Exception):
            os.write(2, traceback.format_exc().encode())
    os._exit(code)


def _become_template(
    args: list[str],
    env: Mapping[str, str],
    cwd: Path,
    log: Path,
    keep: tuple[int, ...],
) -> None:
    """Everything the child holds of the controller's is let go before pytest starts."""
    os.setsid()
    faulthandler.disable()  # pytest's faulthandler plugin enables it again, on our stderr
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in _open_fds():
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)  # the controller's leases, record and pipes stay the controller's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in _RESET:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    atexit._clear()  # noqa: SLF001 - the controller's exit work is not the template's
    if "logging" in sys.modules:  # what a fresh interpreter's logging registers
        atexit.register(sys.modules["logging"].shutdown)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    streams = {
        "stdin": io.TextIOWrapper(io.FileIO(0, "r", closefd=False)),
        "stdout": io.TextIOWrapper(io.FileIO(1, "w", closefd=False)),
        "stderr": io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), line_buffering=True, errors="backslashreplace"
        ),
    }
    for name, stream in streams.items():  # the controller's are pytest's capture files
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.argv = [sys.argv[0], *args]
    # pytest's main puts in the template's own assertion rewriting hook.
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "AssertionRewritingHook"]


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))
