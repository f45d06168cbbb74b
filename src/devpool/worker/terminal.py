"""The user's terminal, lent to a worker while one of its tests is at a debugger prompt.

Every way into pytest's debugger (breakpoint(), pdb.set_trace(), --pdb, --trace, --pdbcls)
goes through pytestPDB._init_pdb, which suspends pytest's capture, so that the test's
standard streams are the process's own while the prompt lasts. Here, before that, the
worker asks the controller for its terminal (a `debugger` event) and waits for the grant
(`terminal`): the controller's own stdin, stdout and stderr, opened through /proc. They
stand in for this process's own streams (the files pytest's capture puts back when it
suspends) until the debugger is left, so pdb, readline and what the test prints at the
prompt read and write the user's terminal, or the pipe or /dev/null CI gave the run, as
in plain pytest. The controller holds every other output meanwhile (run/terminal.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import unittest
from collections.abc import Callable, Generator
from typing import Any

import pytest

from devpool.worker import protocol, wire

_ROLES = ((0, "in_", "stdin", os.O_RDONLY), (1, "out", "stdout", os.O_WRONLY),
          (2, "err", "stderr", os.O_WRONLY))  # fmt: skip


class Terminal:
    """This worker's loan of the controller's terminal: taken at a debugger, given back
    when the debugger is left (pytest_leave_pdb), the test ends, or the run is quit."""

    def __init__(
        self,
        config: pytest.Config,
        send: Callable[[protocol.Message], None],
        commands: Callable[[], wire.Commands | None],
    ) -> None:
        self.config = config
        self._send = send
        self._commands = commands
        self._saved: dict[int, int] = {}  # a real stream's fd → its own file, kept aside
        self._lent: dict[int, os.stat_result] = {}  # fd 0, 1, 2 → the terminal file lent there
        self._real: dict[int, int] = {}  # fd 0, 1, 2 → where its own stream is (_real_fds)
        self._stdin_closed = False
        self.held = False

    @classmethod
    def install(
        cls,
        config: pytest.Config,
        send: Callable[[protocol.Message], None],
        commands: Callable[[], wire.Commands | None],
    ) -> Terminal:
        """The worker's loan, registered as a plugin; every way into pytest's debugger asks
        for the terminal first."""
        from _pytest.debugging import pytestPDB

        self = cls(config, send, commands)
        config.pluginmanager.register(self, "devpool-terminal")
        original: Any = pytestPDB._init_pdb  # noqa: SLF001 - a bound classmethod
        terminal = self

        def _init_pdb(cls: Any, method: str, *args: Any, **kwargs: Any) -> Any:
            terminal.take()
            debugger = original(method, *args, **kwargs)
            if terminal._stdin_closed:
                sys.stdin = None  # as a process whose fd 0 is closed
            own_setup = debugger.setup

            def setup(frame: Any, tb: Any) -> Any:
                # A breakpoint set at the prompt (`b N`, then `c`) stops again in this
                # debugger, past _init_pdb: it asks for the terminal again, before pytest's
                # wrapper suspends the capture that `c` resumed.
                if not terminal.held:
                    terminal.take()
                    if terminal._stdin_closed:
                        sys.stdin = None
                return own_setup(frame, tb)

            debugger.setup = setup
            return debugger

        pytestPDB._init_pdb = classmethod(_init_pdb)  # type: ignore[method-assign,assignment]  # noqa: SLF001
        return self

    # ---- pytest's hooks -------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        """--pdb: the traceback pytest prints before the prompt goes to the terminal too."""
        excinfo = getattr(call, "excinfo", None)
        if not self.config.getvalue("usepdb") or excinfo is None:
            return
        if not isinstance(excinfo.value, unittest.SkipTest):
            self.take(post_mortem=True)

    def pytest_leave_pdb(self) -> None:
        self.give_back()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self) -> Generator[None, object, object]:
        """pytest.exit() in a test, `q` at the debugger's prompt: the worker's session ends
        here, and the controller ends the run as plain pytest's ends (`quit`)."""
        try:
            return (yield)
        except pytest.exit.Exception as exc:
            self.give_back()
            self._send(protocol.Quit(msg=exc.msg, returncode=exc.returncode))
            raise

    def pytest_runtest_logfinish(self) -> None:
        self.give_back()  # whatever else left the debugger, the test is over

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self) -> None:
        """A debugger left without `continue` (Ctrl-D's BdbQuit): the phase's report is the
        first thing after it, and the worker's own terminal writes its letter."""
        self.give_back()

    # ---- the loan -------------------------------------------------------------------------

    def take(self, post_mortem: bool = False) -> None:
        """Ask the controller for its terminal and wait for it; what it lends stands in for
        the streams pytest's capture gives back when it suspends."""
        if self.held:
            return
        self.held = True
        # post_mortem: pytest shows the failure at the prompt, and not again in its summary.
        pid = os.getpid()
        self._send(protocol.Debugger(pid=pid, post_mortem=post_mortem))
        commands = self._commands()
        # A ranks(n) test's grant goes to each of its ranks: this one takes its own.
        grant = None
        if commands is not None:
            grant = commands.wait_for(protocol.Lend, lambda lend: lend.pid == pid)
        if grant is None or not grant.lent:
            return  # nothing lent (another host's worker, or the controller is gone)
        self._stdin_closed = grant.stdin is None
        self._real = real_fds(self.config)
        for fd, _, name, mode in _ROLES:
            path = getattr(grant, name)
            if path is None:
                continue  # closed in the controller: its own stays (stdin: sys.stdin goes)
            try:
                lent = os.open(path, mode | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError:
                continue
            real = self._real[fd]
            # Capture suspended already (between a test's phases, where --pdb comes in):
            # the stream itself is its own file now, and is lent too.
            if real != fd and _same_file(fd, real):
                os.dup2(lent, fd)
            self._saved[real] = os.dup(real)
            os.dup2(lent, real)
            self._lent[fd] = os.fstat(lent)
            os.close(lent)
        stdout = sys.__stdout__
        if 1 in self._lent and stdout is not None and os.isatty(self._real[1]):
            with contextlib.suppress(AttributeError, ValueError):
                stdout.reconfigure(line_buffering=True)

    def give_back(self) -> None:
        """The debugger was left: the worker's own streams again, and the controller told."""
        if not self.held:
            return
        self.held = False
        for fd, lent in self._lent.items():
            # pytest's capture resumed over fd 0-2, except after a quit: one still on the
            # terminal gets the worker's own file back too.
            real = self._real[fd]
            with contextlib.suppress(OSError):
                if real != fd and os.path.samestat(os.fstat(fd), lent):
                    os.dup2(self._saved[real], fd)
        for real, saved in self._saved.items():
            with contextlib.suppress(OSError):
                os.dup2(saved, real)
                os.close(saved)
        self._saved, self._lent = {}, {}
        if self._stdin_closed and sys.stdin is None:
            sys.stdin = sys.__stdin__
        self._stdin_closed = False
        stdout = sys.__stdout__
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stdout.reconfigure(line_buffering=os.isatty(stdout.fileno()))  # type: ignore[union-attr]
        with contextlib.suppress(OSError):  # the controller is gone: nobody to tell
            self._send(protocol.DebuggerLeft(pid=os.getpid()))


def real_fds(config: pytest.Config) -> dict[int, int]:
    """Where this process's own stdin, stdout and stderr are: under pytest's fd capture, the
    copies it keeps to put back when it suspends; else the file descriptors themselves."""
    capman = config.pluginmanager.getplugin("capturemanager")
    capturing = getattr(capman, "_global_capturing", None)
    found = {}
    for fd, part, _, _ in _ROLES:
        saved = getattr(getattr(capturing, part, None), "targetfd_save", None)
        found[fd] = saved if isinstance(saved, int) else fd
    return found


def read_stdin_from(path: str) -> bool:
    """-s with one test at a time: the tests' input() reads the run's own stdin."""
    try:
        given = os.open(path, os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    os.dup2(given, 0)
    os.close(given)
    return True


def _same_file(one: int, other: int) -> bool:
    try:
        return os.path.samestat(os.fstat(one), os.fstat(other))
    except OSError:
        return False
