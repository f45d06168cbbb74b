"""The controller's side of the fork server: template processes and the workers they fork.

A template (worker/template.py) is started like a worker, collects, and then forks a worker
per request instead of running tests. A forked worker is the template's child, not this
process's: the template reaps it and reports its exit status over the template's socket.
Until a template is ready its requests wait; when it cannot serve (unsafe to fork, dead,
too slow to collect), every waiting request becomes a fresh interpreter after all, and
the reason is noted once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from devpool.backends.zygote import ZygoteChild
from devpool.devices.leases import Lease
from devpool.worker import protocol


@dataclass(eq=False)
class ForkRequest:
    """One worker to fork: its environment, and the child's ends of its pipes and its log."""

    key: int
    env: dict[str, str]
    commands: int  # the child reads commands here
    events: int  # the child writes events here
    log: int
    lease: Lease | None
    start_fresh: Callable[[ForkRequest], None]  # what it becomes when no fork comes
    process: ForkedProcess | None = None

    def fds(self) -> list[int]:
        lease_fds = self.lease.fds() if self.lease is not None else []
        return [self.commands, self.events, self.log, *lease_fds]

    def close(self) -> None:
        """Close this process's copies of the child's ends (the child holds its own)."""
        for fd in (self.commands, self.events, self.log):
            with contextlib.suppress(OSError):
                os.close(fd)


class ForkedProcess:
    """A worker forked by a template: its pid once forked, its exit status once reported."""

    def __init__(self, template: Template, request: ForkRequest) -> None:
        self.template = template
        self.request: ForkRequest | None = request  # until forked
        self.pid = 0
        self.code: int | None = None
        self.held: list[int] = []  # signals sent before the fork: delivered at once after it

    def poll(self) -> int | None:
        self.template.pump(0.0)
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.code is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
            self.template.pump(0.1 if left is None else min(left, 0.1))
        return self.code

    def signal_group(self, signum: int) -> None:
        if self.code is not None:
            return
        if self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)
        else:
            self.template.signal_unforked(self, signum)


@dataclass(eq=False)
class Template:
    """One template process, on the controller's side of its socket."""

    kind: str
    process: subprocess.Popen[bytes] | ZygoteChild
    sock: socket.socket
    log: str
    ready_by: float
    limit: float  # seconds it had to collect
    state: str = "starting"  # starting → ready → closing, or off (it cannot fork)
    why: str = ""  # why it is off
    queued: list[ForkRequest] = field(default_factory=list)  # waiting for "ready"
    sent: dict[int, ForkRequest] = field(default_factory=dict)  # waiting for "forked"
    children: dict[int, ForkedProcess] = field(default_factory=dict)  # pid → process
    notes: list[str] = field(default_factory=list)  # said once, at the end of the run
    ended: bool = False  # its socket reached end of file
    started: float = field(default_factory=time.monotonic)
    modules: frozenset[str] | None = None  # the only test modules it imports (None: all)
    culprit: str | None = None  # the test module whose import made it unsafe, if one did

    def fork(self, request: ForkRequest) -> ForkedProcess:
        process = ForkedProcess(self, request)
        request.process = process
        if self.state == "ready":
            self._send(request)
        else:
            self.queued.append(request)
        return process

    def _send(self, request: ForkRequest) -> None:
        message = protocol.packet(protocol.ForkWorker(key=request.key, env=request.env))
        try:
            socket.send_fds(self.sock, [message], request.fds())
        except OSError as exc:
            self.sent[request.key] = request
            self.off(f"its socket failed: {exc}")
            return
        self.sent[request.key] = request

    def signal_unforked(self, process: ForkedProcess, signum: int) -> None:
        """A signal for a worker not forked yet: a waiting one never starts; a sent one gets
        it as soon as it exists."""
        request = process.request
        if request is not None and request in self.queued:
            self.queued.remove(request)
            request.close()  # its event pipe ends: the loop sees the worker gone
            process.request, process.code = None, -signum
        else:
            process.held.append(signum)

    # ---- what the template says ------------------------------------------------------------

    def pump(self, timeout: float) -> None:
        """Read whatever the template said (waiting up to timeout for the first message)."""
        if self.ended:
            return
        try:
            readable, _, _ = select.select([self.sock], [], [], timeout)
        except (OSError, ValueError):
            readable = [self.sock]
        if not readable:
            return
        while True:
            try:
                data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._gone()
                return
            self._handle(protocol.TEMPLATE_EVENTS.decode(data))

    def _handle(self, message: protocol.Message) -> None:
        if isinstance(message, protocol.TemplateReady):
            self.state = "ready"
            queued, self.queued = self.queued, []
            for request in queued:
                self._send(request)
        elif isinstance(
            message, (protocol.Unsafe, protocol.ForkFailed)
        ):  # before any fork, or at one
            module = message.module if isinstance(message, protocol.Unsafe) else None
            self.culprit = module
            # One module to blame: the run may leave it out of a new template and say so.
            self.off(f"not safe to fork: {message.why}", note=self.culprit is None)
        elif isinstance(message, protocol.Forked):
            self._forked(message.key, message.pid)
        elif isinstance(message, protocol.Exited):
            process = self.children.pop(message.pid, None)
            if process is not None:
                process.code = message.code

    def _forked(self, key: int, pid: int) -> None:
        request = self.sent.pop(key, None)
        if request is None or request.process is None:
            return
        process = request.process
        process.pid, process.request = pid, None
        self.children[pid] = process
        request.close()
        if request.lease is not None:
            with contextlib.suppress(RuntimeError):  # released meanwhile
                request.lease.set_job(request.lease.holder.job, pid)
        for signum in process.held:
            process.signal_group(signum)

    def _gone(self) -> None:
        """The template ended: its children were killed with it (PDEATHSIG)."""
        self.ended = True
        try:
            code = self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            code = self.process.wait()
        for process in self.children.values():
            process.code = -signal.SIGKILL
        self.children.clear()
        if self.state in ("starting", "ready"):
            self.off(f"the template (pid {self.process.pid}) ended with {code}; see {self.log}")

    def off(self, why: str, note: bool = True) -> None:
        """No more forks from this template: what waits for one starts fresh instead.
        note: say why at the end of the run (else the caller says it)."""
        if self.state != "off":
            self.state, self.why = "off", why
            if note:
                self.notes.append(why)
        waiting = [*self.queued, *self.sent.values()]
        self.queued, self.sent = [], {}
        for request in waiting:
            if request.process is not None:
                request.process.request = None
            request.start_fresh(request)

    def check(self, now: float) -> None:
        """A template that has not collected in time is ended, as a worker would be."""
        if self.state == "starting" and now >= self.ready_by:
            self.signal_group(signal.SIGKILL)
            self.off(f"did not finish collecting within {self.limit:g}s; see {self.log}")

    # ---- ending -------------------------------------------------------------------------------

    def signal_group(self, signum: int) -> None:
        if self.process.poll() is not None:
            return  # reaped: its pid may be another process's by now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def stop(self) -> None:
        """Ask the template to end once its children have (close() waits for it)."""
        if self.state != "off":
            self.state = "closing"  # its end is no news
        if not self.ended:
            with contextlib.suppress(OSError):
                self.sock.send(protocol.packet(protocol.Stop()))

    def close(self, grace: float = 2.0) -> None:
        """Stop the template once its children have ended; kill it if it will not go."""
        self.stop()
        deadline = time.monotonic() + grace
        while self.process.poll() is None and time.monotonic() < deadline:
            self.pump(0.05)
        if self.process.poll() is None:
            self.signal_group(signal.SIGKILL)
            self.process.wait()
        self.pump(0.0)
        for process in self.children.values():
            process.code = -signal.SIGKILL
        self.children.clear()
        self.ended = True
        self.sock.close()
