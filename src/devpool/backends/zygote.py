"""The zygote: a fork of the controller, just before it collects, that forks templates.

A template started as `python -m pytest ... --devpool-worker template,...` pays for an
interpreter, pytest, every plugin and the conftests' imports (torch, when a conftest
imports it) before it collects: about a second on a small suite, more with a framework,
on the path of a lease. At the start of its collection the controller has all of that in
memory (its conftests rewritten, as pytest rewrites them) and has taken no lease, run no
thread and imported no test module yet. There it forks once: the zygote, which keeps that
state and forks a template whenever the controller asks, at the start of the run or when
the plan meets a kind no template serves. A template forked so runs pytest's main again
with the template's environment and arguments, and only collects.

The zygote and its templates keep nothing of the controller's: their own session and
process group, a log as stdout and stderr, no file descriptor but their sockets, default
signal handlers, no exit handler of the controller's. The workers of a kind whose template
may not fork are forks of the zygote too, each collecting for itself. When the controller
is not safe to fork (a thread, a device runtime, coverage: worker/template.py's checks),
templates and those workers start as fresh processes.

The controller sends worker/protocol.py's Spawn with the template's socket, or a worker's
pipes and lease fds (SCM_RIGHTS); the zygote adds `--devpool-worker template,FD,PID` or
`CMD,EV,PID`, answers Spawned for each request, in order, and Exited when one ends.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import gc
import io
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from devpool import procfs
from devpool.devices import leftovers
from devpool.worker import protocol

_RESET = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD")
PACKET = 1 << 20  # one request: its environment is the largest part
MAX_FDS = 64  # a worker's pipes and the lease fds of its devices, ports and resources
REPLY_TIMEOUT = 60.0  # a fork takes milliseconds; a zygote this late is stuck


@dataclass(frozen=True)
class Unset:
    """What the controller's pytest set around its collection, as it was before: warning
    filters (pytest applies the ini's filterwarnings while collecting) and the root logger
    (pytest's log capture). Taken before pytest loads the conftests; a fork given its
    environment back starts as a fresh interpreter would."""

    filters: tuple[Any, ...]
    handlers: tuple[logging.Handler, ...]
    level: int

    @classmethod
    def now(cls) -> Unset:
        root = logging.getLogger()
        return cls(tuple(warnings.filters), tuple(root.handlers), root.level)

    def restore(self) -> None:
        cast(list[Any], warnings.filters)[:] = list(self.filters)
        warnings._filters_mutated()  # type: ignore[attr-defined]  # noqa: SLF001
        root = logging.getLogger()
        root.handlers[:] = list(self.handlers)
        root.setLevel(self.level)


UNSET = pytest.StashKey[Unset]()  # on the controller's config, from pytest_load_initial_conftests


class ZygoteGone(Exception):
    """The zygote ended or does not answer: templates start as fresh processes."""


class Zygote:
    """The controller's side: forks the zygote, asks it for templates, hears their ends."""

    def __init__(self, log: Path, unset: Unset | None = None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()  # or a child would write the controller's pending output
        gc.collect()  # no garbage of the controller's is finalised in a child
        leftovers.mark_forks(leftovers.this_run())  # what it forks is told as this run's
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                ours.close()
                _let_go(log, keep=(theirs.fileno(),))
                if unset is not None:
                    unset.restore()
                with contextlib.suppress(OSError, AttributeError):
                    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"devpool-zygote"))
                code = _serve(theirs)
            except BaseException:  # noqa: BLE001 - never return into the controller's code
                with contextlib.suppress(Exception):
                    os.write(2, traceback.format_exc().encode())
            os._exit(code)
        theirs.close()
        self.pid = pid
        self.sock = ours
        self.codes: dict[int, int] = {}  # template pid → exit status, as the zygote heard
        self.gone = False

    def spawn(
        self,
        args: list[str],
        env: Mapping[str, str],
        cwd: Path,
        log: Path,
        fds: Sequence[int],
        template: bool = True,
    ) -> ZygoteChild:
        """A process running `pytest args` as a template (fds: its socket) or as a worker
        that collects for itself (fds: its command and event pipes, then its lease's); the
        fds are sent, not kept."""
        if self.gone:
            raise ZygoteGone
        request = protocol.Spawn(
            args=list(args), env=dict(env), cwd=str(cwd), log=str(log), template=template
        )
        try:
            socket.send_fds(self.sock, [protocol.packet(request)], list(fds))
            deadline = time.monotonic() + REPLY_TIMEOUT
            while True:
                message = self._receive(deadline - time.monotonic())
                if message is None:
                    raise ZygoteGone
                if isinstance(message, protocol.Spawned):
                    return ZygoteChild(self, message.pid)
        except OSError as error:
            raise ZygoteGone from error

    def pump(self) -> None:
        """Take the exit statuses the zygote sent since."""
        while not self.gone and self._receive(0.0, idle=True) is not None:
            pass

    def _receive(self, timeout: float, idle: bool = False) -> protocol.Message | None:
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            if not idle:
                # Stuck: a late answer would give a second process the fds the caller now
                # gives a fresh one. It ends, and what it forked ends with it (PDEATHSIG).
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
                self.gone = True
            return None
        try:
            data = self.sock.recv(PACKET)
        except OSError:
            data = b""
        if not data:
            self.gone = True
            return None
        message = protocol.ZYGOTE_EVENTS.decode(data)
        if isinstance(message, protocol.Exited):
            self.codes[message.pid] = message.code
        return message

    def close(self, grace: float = 5.0) -> None:
        """Let the zygote end once its templates have (they end with it otherwise)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:
                    time.sleep(0.01)
                    continue
            break
        else:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        self.sock.close()
        self.gone = True


class ZygoteChild:
    """A template or worker the zygote forked, seen as subprocess.Popen sees a child (pid, poll,
    wait): its exit status comes from the zygote, which reaps it."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump()
            self.returncode = self.zygote.codes.get(self.pid)
            if self.returncode is None and self.zygote.gone and not procfs.alive(self.pid):
                self.returncode = -signal.SIGKILL  # it ended with the zygote
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(["template", str(self.pid)], timeout or 0.0)
            with contextlib.suppress(OSError):
                select.select([self.zygote.sock], [], [], min(0.05, left or 0.05))
        assert self.returncode is not None
        return self.returncode


def _serve(sock: socket.socket) -> int:
    """The zygote's loop: a template per request, each one's exit status once it ends;
    after the controller's last request, wait for every template, then end."""
    children: dict[int, int] = {}  # pidfd → pid
    listening = True
    while listening or children:
        watched = [*children, sock.fileno()] if listening else list(children)
        ready, _, _ = select.select(watched, [], [])
        for fd in ready:
            if fd not in children:
                data, fds, _, _ = socket.recv_fds(sock, PACKET, MAX_FDS)
                if not data:
                    listening = False
                    continue
                request = protocol.ZYGOTE_COMMANDS.decode(data)
                assert isinstance(request, protocol.Spawn)  # its one command
                pid = _fork_pytest(request, fds)
                for fd in fds:
                    os.close(fd)
                children[os.pidfd_open(pid)] = pid
                _send(sock, protocol.Spawned(pid=pid))
                continue
            pid = children.pop(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            _send(sock, protocol.Exited(pid=pid, code=os.waitstatus_to_exitcode(status)))
    return 0


def _send(sock: socket.socket, message: protocol.Message) -> None:
    with contextlib.suppress(OSError):  # the controller is gone: PDEATHSIG ends us too
        sock.send(protocol.packet(message))


def _fork_pytest(request: protocol.Spawn, fds: list[int]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        parent = os.getppid()
        spec = f"template,{fds[0]},{parent}" if request.template else f"{fds[0]},{fds[1]},{parent}"
        args = [*request.args, "--devpool-worker", spec]
        _let_go(Path(request.log), keep=tuple(fds))
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        sys.argv = [sys.argv[0], *args]
        # pytest's main puts in the template's own assertion rewriting hook.
        sys.meta_path[:] = [
            f for f in sys.meta_path if type(f).__name__ != "AssertionRewritingHook"
        ]
        # Conftests run again, in the template's environment, as in a fresh interpreter
        # (pytest imports a top-level `conftest` again itself, not `tests.conftest`); what
        # they import stays imported.
        for name, module in list(sys.modules.items()):
            if os.path.basename(getattr(module, "__file__", None) or "") == "conftest.py":
                del sys.modules[name]
        code = int(pytest.main(args))
    except BaseException:  # noqa: BLE001 - never return into the zygote's loop
        with contextlib.suppress(Exception):
            os.write(2, traceback.format_exc().encode())
        os._exit(code)
    # Its pages are the zygote's: tearing the interpreter down would copy most of them.
    from devpool.worker.session import exit_without_teardown

    exit_without_teardown(code)


def _let_go(log: Path, keep: tuple[int, ...]) -> None:
    """Everything this child holds of the controller's is let go: files and leases,
    session, signal and exit handlers, standard streams (pytest's capture files)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: end with the parent
    faulthandler.disable()  # pytest's faulthandler plugin enables it again, on our stderr
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
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
    atexit._clear()  # noqa: SLF001 - the controller's exit work is not this process's
    if "logging" in sys.modules:  # what a fresh interpreter's logging registers
        atexit.register(sys.modules["logging"].shutdown)
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


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))
