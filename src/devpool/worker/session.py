"""Worker side: a child pytest bound to one lease; runs the items it is sent, streams reports.

The plugin a worker process registers: its process's set-up and the hooks. A template
starts in the template role (worker/template_role.py) and each fork it makes becomes a
worker; every other worker is one from the start (worker/worker_role.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import os
import signal
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from devpool import compat
from devpool.worker import capture, leaks, protocol, warned, worklist
from devpool.worker import template as forkserver
from devpool.worker.held import Outbox, held_file
from devpool.worker.once import ONCE_ENV, OnceProcessPlugin
from devpool.worker.template_role import TemplateRole
from devpool.worker.terminal import Terminal
from devpool.worker.worker_role import WorkerRole

# Options that select or stop tests belong to the controller alone: the worker must be
# able to run any node id it is sent, and never stop itself on a failure.
_CONTROLLER_ONLY = {"keyword": "", "markexpr": "", "lf": False, "failedfirst": False,
                    "newfirst": False, "stepwise": False, "stepwise_skip": False,
                    "maxfail": 0, "deselect": []}  # fmt: skip


def _die_with_parent(name: bytes) -> None:
    """Ask Linux to SIGKILL this worker when the controller dies, so no orphan keeps a device;
    and name it (ps -o comm, /proc/PID/comm): a template forked from the controller keeps
    the controller's command line."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, ctypes.c_char_p(name[:15]))  # PR_SET_NAME
    except (OSError, AttributeError):
        return


def exit_without_teardown(code: int) -> NoReturn:
    """End a forked process as interpreter exit would, without tearing the interpreter
    down: join non-daemon threads and run threading's exit hooks (concurrent.futures
    finishes queued work), then every atexit handler (tests', plugins', logging's)."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # noqa: SLF001
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class WorkerSession:
    """The pytest plugin a worker registers instead of the controller."""

    def __init__(self, config: pytest.Config, spec: str) -> None:
        self.config = config
        # A template (fork server) collects, then forks workers: "template,SOCKET,PARENT",
        # and on a Ray node ",PATH": where the node's rank actors ask it for forks too.
        server: forkserver.ForkServer | None = None
        if spec.startswith("template,"):
            _, sock, parent_pid, *listen = spec.split(",", 3)
            parent = int(parent_pid)
            server = forkserver.ForkServer(int(sock), listen[0] if listen else None)
            self.fd_in = fd_out = -1  # a forked child gets its own pipes
        else:
            self.fd_in, fd_out, parent = (int(part) for part in spec.split(","))
        # What goes to the controller, and what waits for the next write (worker/held.py).
        self.outbox = Outbox(fd_out)
        _die_with_parent(b"devpool-tmpl" if server is not None else b"devpool-worker")
        if os.getppid() != parent:  # the controller died before prctl took effect
            os._exit(3)
        stop_at_failure = bool(getattr(config.option, "maxfail", 0))
        for name, value in _CONTROLLER_ONLY.items():
            if hasattr(config.option, name):
                setattr(config.option, name, value)
        # Not an xdist worker (plugins would read xdist's keys): other plugins are adjusted
        # one by one, e.g. junitxml and --lf state are written by the controller alone.
        # What they publish for the controller goes where xdist's workers put it.
        config.workeroutput = {}  # type: ignore[attr-defined]
        compat.configure_worker(config)
        self.worklist = worklist.Worklist(
            os.environ.get("DEVPOOL_COLLECT_ONLY"), os.environ.get(worklist.NODEIDS_ENV)
        )
        self._stacks: Any = None
        self._log: Path | None = None  # this process's log (the backends name it so)
        self._open_stacks(holds=server is None)  # a template runs no test: it holds nothing
        self.forked = False  # a child of a template: it ends without interpreter shutdown
        self.exitstatus = 0
        self.template = TemplateRole(config, server) if server is not None else None
        once = warned.OnceWarnings()  # warnings plain pytest shows once per run
        config.pluginmanager.register(once, "devpool-once-warnings")
        # The debugger's prompt gets the controller's terminal (worker/terminal.py).
        self.terminal = Terminal.install(config, self.send, lambda: self.worker.commands)
        # What each test leaves behind (processes, threads, device memory): worker/leaks.py.
        self.leaks = leaks.LeakWatch()
        if self.leaks.active:
            config.pluginmanager.register(self.leaks, "devpool-leaks")
        self.worker = WorkerRole(
            config, self.outbox, self.worklist, self.leaks, once, stop_at_failure
        )

    def send(self, *messages: protocol.Message) -> None:
        """Send messages after those held (they keep their order), in one write."""
        self.outbox.send(*messages)

    def _exit_forked(self) -> None:
        """A forked worker ends here, once pytest and the plugins are done: the atexit
        handlers (tests', plugins', logging's) run, and then the process exits without
        tearing the interpreter down. Finalising every module and object it shares with its
        template would copy most of its pages (seconds of CPU with torch imported)."""
        if self.forked:
            exit_without_teardown(self.exitstatus)

    def _exit_last(self) -> None:
        """Make the forked exit the config's outermost cleanup: every cleanup registered so
        far (capture, assertion rewriting, plugins') and later runs before it."""
        config: Any = self.config
        stack = getattr(config, "_cleanup_stack", None)  # pytest >= 8.1
        if isinstance(stack, contextlib.ExitStack):
            outer = contextlib.ExitStack()
            outer.callback(self._exit_forked)
            outer.enter_context(stack)
            config._cleanup_stack = outer  # noqa: SLF001
            return
        cleanups = getattr(config, "_cleanup", None)  # pytest 8.0: a list popped from the end
        if isinstance(cleanups, list):
            cleanups.insert(0, self._exit_forked)
        else:
            config.add_cleanup(self._exit_forked)

    def _open_stacks(self, holds: bool) -> None:
        """faulthandler writes every thread's stack to this file when the controller asks;
        holds: this process runs tests, and keeps what it holds back in the held file."""
        stacks = os.environ.get("DEVPOOL_STACKS_FILE")
        inherited = self._stacks  # a forked child's copy of its template's file
        if stacks:
            self._log = Path(stacks).with_suffix(".log")
            self._stacks = open(stacks, "w")  # noqa: SIM115 - lives as long as the process
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
            if holds:
                self.outbox.keep_in(held_file(Path(stacks)))
        if inherited is not None and inherited is not self._stacks:
            # Closed here, never left to the collector: its ResourceWarning would reach the
            # first test, an error under filterwarnings = error.
            inherited.close()

    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        """Skip test modules that hold none of this worker's jobs: no import, no collection."""
        return self.worklist.ignores(collection_path)

    def pytest_unconfigure(self) -> None:
        stacks = os.environ.get("DEVPOOL_STACKS_FILE")
        self.outbox.file.close(remove=True)  # it ends normally: everything held was sent
        if stacks:  # a worker that ends normally leaves no empty output files behind
            capture.remove_empty(Path(stacks))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(
        self, session: pytest.Session, exitstatus: int
    ) -> Generator[None, None, None]:
        """After every plugin's pytest_sessionfinish: what they published, to the controller."""
        self.exitstatus = int(exitstatus)
        try:
            return (yield)
        finally:
            if self.template is None and self.outbox.fd_out >= 0:
                self.worker.publish()

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self.worklist.collected.append(item)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A template forks only what a fresh worker would have collected the same way."""
        if self.template is not None:
            self.template.check(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if self.template is not None:
            fork = self.template.serve(
                lambda env: self.worklist.select(session, env.get(worklist.NODEIDS_ENV))
            )
            if fork is None:
                self._no_summary()
                return True  # the template's work is done
            self._become(session, fork)
            if os.environ.get(ONCE_ENV):  # a once-fixture's own process (run/once_process.py)
                return OnceProcessPlugin.forked(self.config).pytest_runtestloop(session)
        self.worker.run(session, self.fd_in)
        if self.forked:
            # Every test and fixture has ended. pytest collects the cycles five times at exit
            # (unraisableexception); over the template's whole heap each pass would write
            # every page it shares with the template. Tests can no longer see the difference.
            gc.freeze()
        self._no_summary()
        return True

    def _become(self, session: pytest.Session, fork: forkserver.Fork) -> None:
        """In a child the template forked: a worker of its own, on the pipes it was sent."""
        _die_with_parent(b"devpool-worker")
        if os.getppid() != fork.template_pid:  # the template died before prctl took effect
            os._exit(3)
        forkserver.become_worker(self.config, fork, self._log)
        # The template froze what it collected (its pages stay shared while it forks); a
        # test must find every object in the collector's sight, as in plain pytest.
        gc.unfreeze()
        self.forked = True
        self._exit_last()
        self.template = None
        self.fd_in, self.outbox.fd_out = fork.commands, fork.events
        self._open_stacks(holds=True)
        self.worklist.select(session, os.environ.get(worklist.NODEIDS_ENV))

    def _no_summary(self) -> None:
        """The controller writes the summary; a worker's would cost its devices' next user
        time: plugins' pytest_terminal_summary may import whole packages at exit
        (hypothesis does, assertion-rewritten: seconds of CPU without a bytecode cache)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            self.config.pluginmanager.unregister(reporter)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The controller's selection is final: keep exactly its node ids.

        After every pytest_collection_modifyitems: a conftest that deselects by position
        (items[K::N]) sees fewer items here than in the controller and would pick others."""
        self.worklist.keep_selected(session)

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self.worker.started(nodeid, location)

    def pytest_warning_recorded(
        self,
        warning_message: Any,
        when: str,
        nodeid: str,
        location: tuple[str, int, str] | None,
    ) -> None:
        """Warnings of the tests go to the controller's summary; those of collection and
        configuration it saw itself."""
        if when != "runtest":
            return
        self.worker.warned_in_test(warning_message, nodeid, location)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.worker.reported(report)

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self.worker.finished(nodeid, location)
