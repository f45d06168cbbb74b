"""The fork server's template side: a worker that has collected, then forks workers on demand.

A template is a `python -m pytest ... --devpool-worker template,SOCK,PARENT` process. It
runs pytest's collection (imports the test modules, their conftests and whatever heavy
packages they import) like any worker, but runs no test and holds no device. It then
serves the controller over a Unix socket (SOCK_SEQPACKET, one message per packet):
worker/protocol.py's ForkWorker (its fds ride along) and Stop come in; TemplateReady or
Unsafe, then Forked (or ForkFailed) and Exited go out.

On a Ray node the template also listens on a Unix socket path (the spec's fourth part):
each rank actor of the node connects there and sends its own fork request; "forked" and
"exit" for that child go back on its connection alone.

Each fork returns in the child as a `Fork`: the child then becomes an ordinary worker on
those pipes (session.py), without starting Python, pytest, its plugins or the imports again.
Forking is only sound when the template holds nothing a child cannot share: a device
runtime (a CUDA context does not survive fork) or a second thread (it may hold a lock
the child would wait on forever). The template checks both before it says "ready" and
says it is unsafe (and why) instead; the controller then starts fresh interpreters.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import selectors
import socket
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devpool.worker import huge_pages, protocol
from devpool.worker.native_threads import thread_count, unsafe_native_threads

MAX_FDS = 64  # commands, events, log, and the lease fds of one worker
PACKET = 1 << 20  # one fork request: its environment is the largest part
# Forks after which a template's memory goes into huge pages (worker/huge_pages.py): 0.1-0.2 s
# of CPU once, repaid within some 30 forks. A warm-worker run forks about one worker per
# slot and never pays it; --devpool-isolation=job forks one per test.
HUGE_PAGES_AFTER = 16


def initialised_runtime(config: pytest.Config) -> str | None:
    """Which device runtime this process has initialised, if any (None: safe to fork)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        for name in ("cuda", "npu", "xpu", "mlu"):
            runtime = getattr(torch, name, None)
            check: Callable[[], bool] | None = getattr(runtime, "is_initialized", None)
            if check is not None and _true(check):
                return f"torch.{name}"
    if _cuda_driver_initialised():  # torch.cuda.is_available() does it, outside torch's view
        return "the CUDA driver (cuInit)"
    xla_bridge = sys.modules.get("jax._src.xla_bridge")  # jax initialises on first use
    if xla_bridge is not None and getattr(xla_bridge, "_backends", None):
        return "jax"
    answer: str | None = config.hook.pytest_devpool_device_initialised(config=config)
    return answer


def _cuda_driver_initialised() -> bool:
    """Whether cuInit ran in this process: a child could not use CUDA after it.

    Asked of libcuda itself, and only when it is loaded already: before cuInit, its
    cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED and initialises nothing."""
    if not hasattr(os, "RTLD_NOLOAD"):
        return False
    try:
        # RTLD_NOLOAD: the copy already loaded, else an error, with no /proc/self/maps read
        # (a template asks before every fork)
        libcuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        count = ctypes.c_int(0)
        return int(libcuda.cuDeviceGetCount(ctypes.byref(count))) == 0  # CUDA_SUCCESS
    except (OSError, AttributeError):
        return False


def _true(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:  # noqa: BLE001 - a broken runtime is not an initialised one
        return False


def other_threads() -> list[str]:
    """Threads besides the main one: a child would inherit their locks, not the threads."""
    main = threading.main_thread()
    return sorted(t.name for t in threading.enumerate() if t is not main and t.is_alive())


def unsafe_reason(config: pytest.Config) -> str:
    """Why this process must not be forked ("" when it may)."""
    if not hasattr(os, "pidfd_open"):  # how the template waits for its children
        return "this system has no pidfd_open (Linux 5.3 or later)"
    runtime = initialised_runtime(config)
    if runtime:
        return f"the device runtime {runtime} is initialised in it"
    from devpool.compat.coverage import measuring

    if measuring() is not None:  # its data file and tracer state would be every child's
        return "coverage measurement (pytest-cov or coverage run) is running in it"
    threads = other_threads()
    if threads:
        return f"it runs {len(threads)} thread(s) besides the main one: {', '.join(threads)}"
    return unsafe_native_threads()  # OpenMP and other C libraries' pools


@dataclass
class Preloaded:
    """What a template's preload did."""

    count: int = 0  # modules imported
    warned: list[str] = field(default_factory=list)  # their import raised a warning
    threaded: list[str] = field(default_factory=list)  # more threads ran after their import


def preload(names: Iterable[str]) -> Preloaded:
    """Import each module not imported yet, a failure skipped; warnings are recorded and
    dropped here (a test that expects one would not see it: such modules are not imported
    first again)."""
    done = Preloaded()
    tasks = thread_count()
    for name in names:
        if name in sys.modules:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with contextlib.suppress(Exception, SystemExit):
                importlib.import_module(name)
                done.count += 1
        if caught:
            done.warned.append(name)
        now = thread_count()
        if now > tasks:
            done.threaded.append(name)
        tasks = now
    return done


@dataclass
class Fork:
    """What a forked child needs to become a worker: its pipes, log and environment."""

    commands: int
    events: int
    log: int
    env: dict[str, str]
    template_pid: int


class ForkServer:
    """The serving loop of a template process (pytest_runtestloop calls serve())."""

    def __init__(self, sock_fd: int, listen: str | None = None) -> None:
        self.sock = socket.socket(fileno=sock_fd)
        self.tasks = 0  # the kernel's thread count when it was last found safe to fork
        self.prepare: Callable[[dict[str, str]], None] | None = None
        self.forks = 0
        self.children: dict[int, int] = {}  # pidfd → pid
        self.asked: dict[int, socket.socket] = {}  # pid → the connection that asked for it
        self.listener: socket.socket | None = None
        self.clients: list[socket.socket] = []
        if listen is not None:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.listener.bind(listen)
            self.listener.listen(64)

    def send(self, message: protocol.Message, to: socket.socket | None = None) -> None:
        with contextlib.suppress(OSError):  # the controller is gone: PDEATHSIG ends us too
            (to or self.sock).send(protocol.packet(message))

    def refuse(self, why: str, module: str | None = None) -> None:
        """Say why this template cannot serve; the controller starts fresh interpreters.

        module: the test module whose import made it unsafe, when one did: the controller
        may start a template of the kind without it (run/warm.py)."""
        self.send(protocol.Unsafe(why=why, module=module or None))

    def serve(
        self,
        config: pytest.Config,
        unsafe: Callable[[str], str] = str,
        culprit: str | None = None,
        prepare: Callable[[dict[str, str]], None] | None = None,
    ) -> Fork | None:
        """Fork a worker per request until told to stop: returns in each child, None here.

        unsafe: turns the reason this template may not fork into what it says (and may act
        on it); culprit: the test module after whose import threads ran, if one; prepare:
        what every child would do first with its environment, done here once instead."""
        why = unsafe_reason(config)
        if why:
            self.refuse(unsafe(why), culprit)
            return None
        self.tasks = thread_count()
        self.prepare = prepare
        self.send(protocol.TemplateReady(pid=os.getpid()))
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        if self.listener is not None:
            selector.register(self.listener, selectors.EVENT_READ)
        stopping = False
        while not stopping or self.children:
            for key, _ in selector.select():
                if key.fileobj is self.listener:
                    client, _ = self.listener.accept()
                    self.clients.append(client)
                    selector.register(client, selectors.EVENT_READ)
                    continue
                if isinstance(key.fileobj, socket.socket):
                    sock = key.fileobj
                    request, fds = self._receive(sock)
                    if not isinstance(request, protocol.ForkWorker):  # None: it hung up
                        selector.unregister(sock)
                        if sock is self.sock:
                            stopping = True
                            self._stop_listening(selector)
                        elif sock in self.clients:
                            self.clients.remove(sock)
                            sock.close()
                        continue
                    fork = self._fork(config, request, fds, selector, sock)
                    if fork is not None:
                        return fork  # in the child
                else:
                    self._reap(key.fd, selector)
        selector.close()
        return None

    def _stop_listening(self, selector: selectors.BaseSelector) -> None:
        """No more rank actors connect; those connected hear about their children's exits."""
        if self.listener is not None:
            selector.unregister(self.listener)
            self.listener.close()
            self.listener = None

    def _receive(self, sock: socket.socket) -> tuple[protocol.Message | None, list[int]]:
        try:
            data, fds, _, _ = socket.recv_fds(sock, PACKET, MAX_FDS)
        except OSError:
            return None, []
        if not data:
            return None, fds
        return protocol.FORK_COMMANDS.decode(data), fds

    def _fork(
        self,
        config: pytest.Config,
        request: protocol.ForkWorker,
        fds: list[int],
        selector: selectors.BaseSelector,
        asker: socket.socket,
    ) -> Fork | None:
        why = self._unsafe_now(config)
        if why:
            for fd in fds:
                os.close(fd)
            self.send(protocol.ForkFailed(key=request.key, why=why), asker)
            return None
        if self.prepare is not None:
            self.prepare(dict(request.env))
        sys.stdout.flush()
        sys.stderr.flush()
        template = os.getpid()
        pid = os.fork()
        if pid == 0:
            selector.close()
            for pidfd in self.children:
                os.close(pidfd)
            for sock in [self.sock, *self.clients, *([self.listener] if self.listener else [])]:
                sock.close()
            os.setpgid(0, 0)  # its own process group: killpg ends it and its children alone
            commands, events, log = fds[:3]
            return Fork(commands, events, log, dict(request.env), template)
        with contextlib.suppress(OSError):  # the child got there first, or has gone
            os.setpgid(pid, pid)  # also here, so a signal sent at once finds the group
        for fd in fds:
            os.close(fd)  # the lease fds live in the child alone now
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self.asked[pid] = asker
        selector.register(pidfd, selectors.EVENT_READ)
        self.send(protocol.Forked(key=request.key, pid=pid), asker)
        self.forks += 1
        if self.forks == HUGE_PAGES_AFTER:
            huge_pages.collapse()
        return None

    def _unsafe_now(self, config: pytest.Config) -> str:
        """Why this template may no longer fork ("" when it may), before each fork.

        Between forks it runs only this loop; a runtime or a pool that started anyway
        (a finalizer, a signal handler) started threads. The native threads' scan (their
        stacks, /proc/self/maps) is for a thread count that changed since it was last safe:
        every fork of --devpool-isolation=job waits on this check."""
        if thread_count() == self.tasks and not other_threads():
            runtime = initialised_runtime(config)
            return f"the device runtime {runtime} is initialised in it" if runtime else ""
        why = unsafe_reason(config)
        if not why:
            self.tasks = thread_count()
        return why

    def _reap(self, pidfd: int, selector: selectors.BaseSelector) -> None:
        pid = self.children.pop(pidfd)
        selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        self.send(protocol.Exited(pid=pid, code=code), self.asked.pop(pid, None))


def become_worker(config: pytest.Config, fork: Fork, template_log: Path | None) -> None:
    """In a forked child: its environment, and its output in its own log and capture files.

    The template's output went to the template's log, through pytest's fd capture (whose
    files the template and every child would share) and faulthandler's copy of stderr."""
    from devpool.worker import capture, threads

    template_sizes = threads.sized_as(os.environ)
    # Only what differs is set or unset (each is a putenv): a fork's environment is mostly
    # its template's.
    for name in [name for name in os.environ if name not in fork.env]:
        del os.environ[name]
    for name, value in fork.env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    if threads.sized_as(os.environ) != template_sizes:
        # Its template's pools were sized to another budget (a cpus(n) test). The same
        # budget needs nothing: the fork has its template's sizes, and a resize would cost
        # every fork threadpoolctl's scan and, in OpenBLAS, a new pool that spins (job
        # isolation: a third of its CPU, issue 45).
        threads.apply_budget()
    capman: Any = config.pluginmanager.getplugin("capturemanager")
    capturing = capman is not None and capman._global_capturing is not None  # noqa: SLF001
    state = capman._global_capturing._state if capturing else None  # noqa: SLF001
    if capturing:
        capman.stop_global_capturing()  # fds 1 and 2 are the template's log again
    template = _identity(template_log)
    for fd in _open_fds():
        if fd in (1, 2) or (template is not None and _identity_of(fd) == template):
            os.dup2(fork.log, fd)  # e.g. faulthandler's copy of stderr
    os.close(fork.log)
    if capturing:
        base = os.environ.get("DEVPOOL_STACKS_FILE")
        if base:
            with capture.named_capture_files(Path(base)):
                capman.start_global_capturing()
        else:
            capman.start_global_capturing()
        if state == "suspended":
            capman.suspend_global_capture(in_=False)


def _identity(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _identity_of(fd: int) -> tuple[int, int] | None:
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _open_fds() -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        return [1, 2]
