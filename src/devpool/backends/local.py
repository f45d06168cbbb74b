"""Local backend: workers are child `python -m pytest` processes, one process group each.

A worker that must be a fresh process (isolation, the isolate marker, a retry) may instead
be forked from a template of its kind that has collected already (templates.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from devpool.backends import Backend, Forks, WorkerHandle
from devpool.backends.pipes import EventPipes
from devpool.backends.rank_groups import RankGroups
from devpool.backends.spawn import pytest_process
from devpool.backends.templates import ForkedProcess, ForkRequest, Template
from devpool.backends.zygote import Unset, Zygote, ZygoteChild, ZygoteGone
from devpool.devices.leases import Lease
from devpool.plan.markers import Request
from devpool.worker import protocol, wire
from devpool.worker.held import HeldReader, held_file
from devpool.worker.stacks import stacks_file

if TYPE_CHECKING:
    from devpool.backends.ranks import RankGroup

TEMPLATE_SHARE = 0.9  # of the worker start timeout, for a template to collect


@dataclass(eq=False)
class Worker(WorkerHandle):
    """One child pytest process bound for life to one lease (or to no device, for CPU tests)."""

    key: int
    devices: tuple[int, ...]
    lease: Lease | None
    process: subprocess.Popen[bytes] | ForkedProcess | ZygoteChild  # forked: from a template
    log: Path
    fd_in: int  # controller writes commands here
    fd_out: int  # controller reads events here
    reader: wire.Reader = field(default_factory=wire.Reader)
    started: float = field(default_factory=time.monotonic)
    exited: bool = False
    fresh_since: float | None = None  # a fork that became a fresh interpreter, from then

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stacks(self) -> Path:
        return stacks_file(self.log)

    def poll(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end (subprocess.TimeoutExpired after timeout)."""
        return self.process.wait(timeout=timeout)

    def send(self, message: protocol.Message) -> bool:
        """Send a command; False when the worker is already gone."""
        try:
            wire.write(self.fd_in, message)
        except (BrokenPipeError, OSError):
            return False
        return True

    def signal_group(self, signum: int) -> None:
        """Signal the worker's whole process group (the test's own children included)."""
        if isinstance(self.process, ForkedProcess):
            self.process.signal_group(signum)  # it may not be forked yet
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def close(self) -> None:
        for fd in (self.fd_in, self.fd_out):
            with contextlib.suppress(OSError):
                os.close(fd)


class LocalBackend(Backend):
    """Starts workers and multiplexes their event pipes."""

    local_leases = True
    groups_ranks = True  # a ranks(n) test's ranks are local workers, grouped here

    def __init__(
        self,
        args: Sequence[str],
        cwd: Path,
        log_dir: Path,
        worker_env: Mapping[str, str] | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        self.args = list(args)  # a worker's pytest arguments: see worklist.worker_args
        self.cwd = cwd
        self.log_dir = log_dir
        self.worker_env = dict(worker_env or {})  # the same for every worker of the run
        self.pipes = EventPipes()
        self._next_key = 0
        self.templates: dict[str, Template] = {}  # kind → its template
        self._templates_started = 0
        self.zygote: Zygote | None = None  # forks templates; None: they start afresh
        self.start_timeout = start_timeout  # seconds a worker may take to start (and collect)
        self.closed = False
        self.rank_groups = RankGroups(self.pipes)  # ranks(n) tests' workers (rank_groups.py)

    def start(
        self,
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        request: Request | None = None,
    ) -> Worker:
        """Spawn a worker for these devices; the lease fds are inherited so it outlives neither."""
        worker, child_env, (cmd_read, ev_write) = self._prepare(devices, lease, env)
        worker.process = self._popen(child_env, worker.log, cmd_read, ev_write, lease)
        return worker

    def fork(
        self,
        kind: str,
        template_env: Mapping[str, str],
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        start: bool = True,
        request: Request | None = None,
    ) -> Worker | None:
        """A worker forked from the template of its kind (started now if there is none and
        start says so); None when no template can fork it (the caller starts a fresh
        interpreter). A local worker needs no more of its request than its devices."""
        template = self.templates.get(kind)
        if template is None and not start:
            return None
        if template is None:
            template = self._start_template(kind, template_env)
        template.pump(0.0)
        if template.state == "off":
            return None
        worker, child_env, (cmd_read, ev_write) = self._prepare(devices, lease, env)
        log = os.open(worker.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

        def start_fresh(request: ForkRequest) -> None:
            # The template cannot fork it after all: the same worker, as a fresh process.
            os.close(request.log)
            worker.fresh_since = time.monotonic()  # it starts (collects) from now
            worker.process = self._popen(
                request.env, worker.log, request.commands, request.events, request.lease
            )

        fork = ForkRequest(worker.key, child_env, cmd_read, ev_write, log, lease, start_fresh)
        worker.process = template.fork(fork)
        return worker

    def forks(self) -> Forks:
        return self

    def group(self, workers: list[WorkerHandle], shape: int, straggle: float) -> RankGroup:
        """One ranks(n) test's workers, one per rank (rank order), as one worker
        (backends/ranks.py): their events meet in the merge before the loop reads them."""
        self._next_key += 1
        return self.rank_groups.group(self._next_key, workers, shape, straggle)

    def prepare(self, kind: str, template_env: Mapping[str, str]) -> None:
        """Start the template of a kind ahead of its first worker (it collects meanwhile)."""
        if kind not in self.templates:
            self._start_template(kind, template_env)

    def start_zygote(self, unset: Unset | None = None) -> None:
        """Fork the zygote that forks every later template (backends/zygote.py): this
        process is about to collect, and is safe to fork."""
        try:
            self.zygote = Zygote(self.log_dir / "zygote.log", unset)
        except OSError:
            self.zygote = None  # no process to spare: templates start afresh

    def covers(self, kind: str, modules: frozenset[str]) -> bool:
        """Whether the template of a kind imported every one of these test modules."""
        template = self.templates.get(kind)
        return template is not None and (template.modules is None or modules <= template.modules)

    def discard(self, kind: str) -> None:
        """End the template of a kind (a guess that did not fit): a later prepare or fork
        starts a new one."""
        template = self.templates.pop(kind, None)
        if template is None:
            return
        # Its socket may still be watched though it ended (heard of through template_state,
        # not the callback): its fd number is free for the next socket once closed.
        self.pipes.uncall(template.sock.fileno())
        template.close(grace=0.5)

    def template_started(self, kind: str) -> float | None:
        """When the template of a kind was started (monotonic); None if it was not."""
        template = self.templates.get(kind)
        return None if template is None else template.started

    def template_state(self, kind: str) -> str | None:
        """starting, ready, closing or off; None when no template of that kind was started."""
        template = self.templates.get(kind)
        if template is None:
            return None
        template.pump(0.0)
        return template.state

    def notes(self) -> list[str]:
        """What the templates said once (why one could not fork), taken once."""
        taken = []
        for kind, template in self.templates.items():
            taken += [f"fork server for {kind} workers off: {note}" for note in template.notes]
            template.notes.clear()
        return taken

    def culprit(self, kind: str) -> tuple[str, str] | None:
        """(test module, why) when one module's import made the kind's template unsafe."""
        template = self.templates.get(kind)
        if template is None or template.state != "off" or template.culprit is None:
            return None
        return template.culprit, template.why

    def _prepare(
        self, devices: tuple[int, ...], lease: Lease | None, env: Mapping[str, str]
    ) -> tuple[Worker, dict[str, str], tuple[int, int]]:
        """A worker's pipes, log and environment, before its process exists."""
        self._next_key += 1
        key = self._next_key
        cmd_read, cmd_write = os.pipe()
        ev_read, ev_write = os.pipe()
        log = self.log_dir / f"worker-{key}.log"
        child_env = {**env, **self.worker_env}
        child_env["DEVPOOL_STACKS_FILE"] = str(stacks_file(log))
        flags = fcntl.fcntl(ev_read, fcntl.F_GETFL)
        fcntl.fcntl(ev_read, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        placeholder: Any = None  # set by the caller at once
        held = HeldReader(held_file(stacks_file(log)))
        worker = Worker(key, devices, lease, placeholder, log, cmd_write, ev_read, held)
        self.pipes.watch(worker)
        return worker, child_env, (cmd_read, ev_write)

    def _popen(
        self,
        env: Mapping[str, str],
        log: Path,
        cmd_read: int,
        ev_write: int,
        lease: Lease | None,
    ) -> subprocess.Popen[bytes] | ZygoteChild:
        lease_fds = lease.fds() if lease is not None else []
        # Not from a template (none of its kind may fork): from the zygote it skips the
        # interpreter's, pytest's and the plugins' start and collects for itself.
        spec = f"{cmd_read},{ev_write},{os.getpid()}"
        process = self._start(spec, env, log, (cmd_read, ev_write, *lease_fds))
        os.close(cmd_read)
        os.close(ev_write)
        return process

    def _start(
        self, spec: str, env: Mapping[str, str], log: Path, fds: tuple[int, ...]
    ) -> subprocess.Popen[bytes] | ZygoteChild:
        """A pytest process of its own session (spec: `--devpool-worker`'s value, a template's
        or a worker's), forked from the zygote while there is one, else a fresh interpreter."""
        if self.zygote is not None and not self.zygote.gone:
            template = spec.startswith("template,")
            with contextlib.suppress(ZygoteGone):  # the zygote writes the spec for its fds
                return self.zygote.spawn(self.args, env, self.cwd, log, fds, template=template)
        return self._spawn(spec, env, log, fds)

    def _spawn(
        self, spec: str, env: Mapping[str, str], log: Path, fds: tuple[int, ...]
    ) -> subprocess.Popen[bytes]:
        return pytest_process(self.args, spec, self.cwd, env, log, fds)

    def _start_template(self, kind: str, env: Mapping[str, str]) -> Template:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._templates_started += 1  # a kind's template started again gets a log of its own
        log = self.log_dir / f"template-{self._templates_started}.log"
        child_env = {**env, **self.worker_env, "DEVPOOL_STACKS_FILE": str(stacks_file(log))}
        spec = f"template,{theirs.fileno()},{os.getpid()}"
        process = self._start(spec, child_env, log, (theirs.fileno(),))
        theirs.close()
        # It gives up a little before the workers waiting for it would be ended as stuck:
        # they then start fresh, with a full start timeout of their own.
        limit = self.start_timeout * TEMPLATE_SHARE
        template = Template(kind, process, ours, str(log), time.monotonic() + limit, limit)
        only = child_env.get("DEVPOOL_COLLECT_ONLY")
        if only:
            template.modules = frozenset(Path(only).read_text(encoding="utf-8").split())
        self.templates[kind] = template
        fd = ours.fileno()

        def said() -> None:
            template.pump(0.0)
            if template.ended:
                self.pipes.uncall(fd)

        self.pipes.call(fd, said)
        return template

    def poll(self, timeout: float) -> list[tuple[WorkerHandle, list[protocol.Message], bool]]:
        """Events that arrived within timeout: (worker, messages, reached_eof)."""
        self.check(time.monotonic())
        return self.pipes.poll(timeout)

    def check(self, now: float) -> None:
        """End templates that have not collected in time (their workers start fresh)."""
        for template in self.templates.values():
            template.check(now)
        self.rank_groups.check(now)

    def due(self) -> list[float]:
        """When check() next has something to do."""
        times = [t.ready_by for t in self.templates.values() if t.state == "starting"]
        return times + self.rank_groups.due()

    def drain(self, worker: WorkerHandle) -> list[protocol.Message]:
        """Whatever an exited worker still had in its pipe; stops watching that pipe."""
        if not isinstance(worker, Worker):  # a ranks(n) group (backends/ranks.py)
            self.rank_groups.drain(cast("RankGroup", worker))
        return self.pipes.drain(worker)

    def reap(self, worker: WorkerHandle, wait: float = 5.0) -> int | None:
        """The worker's exit status once its event pipe closed (negative: killed by a signal).

        wait=0 for a worker that ended as asked: a fork whose template has not told its
        status yet is left to the template, which reaps its children (None here); waiting
        for that word held the loop for every test of --devpool-isolation=job."""
        if not isinstance(worker, Worker):  # a ranks(n) group
            return self.rank_groups.reap(cast("RankGroup", worker), wait)
        process = worker.process
        code: int | None
        if wait <= 0 and isinstance(process, ForkedProcess) and process.poll() is None:
            code = None
        else:
            code = worker.wait_or_kill(wait)
        worker.exited = True
        self.pipes.forget(worker)
        worker.close()
        return code

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for template in self.templates.values():
            template.stop()  # all at once: they end side by side
        for template in self.templates.values():
            if not template.ended:
                self.pipes.uncall(template.sock.fileno())
            template.close()
        if self.zygote is not None:
            self.zygote.close()
        self.pipes.close()
