"""Local backend: workers are child `python -m pytest` processes, one process group each."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devpool import protocol
from devpool.backends import WorkerHandle
from devpool.backends.pipes import EventPipes
from devpool.leases import Lease
from devpool.markers import Request
from devpool.worker import stacks_file


@dataclass(eq=False)
class Worker:
    """One child pytest process bound for life to one lease (or to no device, for CPU tests)."""

    key: int
    devices: tuple[int, ...]
    lease: Lease | None
    process: subprocess.Popen[bytes]
    log: Path
    fd_in: int  # controller writes commands here
    fd_out: int  # controller reads events here
    reader: protocol.Reader = field(default_factory=protocol.Reader)
    started: float = field(default_factory=time.monotonic)
    exited: bool = False

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
            protocol.write(self.fd_in, message)
        except (BrokenPipeError, OSError):
            return False
        return True

    def signal_group(self, signum: int) -> None:
        """Signal the worker's whole process group (the test's own children included)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def close(self) -> None:
        for fd in (self.fd_in, self.fd_out):
            with contextlib.suppress(OSError):
                os.close(fd)


class LocalBackend:
    """Starts workers and multiplexes their event pipes."""

    local_leases = True

    def __init__(
        self,
        args: Sequence[str],
        cwd: Path,
        log_dir: Path,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        self.args = list(args)  # a worker's pytest arguments: see worklist.worker_args
        self.cwd = cwd
        self.log_dir = log_dir
        self.worker_env = dict(worker_env or {})  # the same for every worker of the run
        self.pipes = EventPipes()
        self._next_key = 0

    def start(
        self,
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        request: Request | None = None,
    ) -> Worker:
        """Spawn a worker for these devices; the lease fds are inherited so it outlives neither."""
        self._next_key += 1
        key = self._next_key
        cmd_read, cmd_write = os.pipe()
        ev_read, ev_write = os.pipe()
        log = self.log_dir / f"worker-{key}.log"
        lease_fds = lease.fds() if lease is not None else []
        child_env = {**env, **self.worker_env}
        child_env["DEVPOOL_STACKS_FILE"] = str(stacks_file(log))
        spec = f"{cmd_read},{ev_write},{os.getpid()}"
        argv = [sys.executable, "-m", "pytest", *self.args, "--devpool-worker", spec]
        with open(log, "wb") as out:
            process = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(cmd_read, ev_write, *lease_fds),
                start_new_session=True,
            )
        os.close(cmd_read)
        os.close(ev_write)
        flags = fcntl.fcntl(ev_read, fcntl.F_GETFL)
        fcntl.fcntl(ev_read, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        worker = Worker(key, devices, lease, process, log, cmd_write, ev_read)
        self.pipes.watch(worker)
        return worker

    def poll(self, timeout: float) -> list[tuple[WorkerHandle, list[protocol.Message], bool]]:
        """Events that arrived within timeout: (worker, messages, reached_eof)."""
        return self.pipes.poll(timeout)

    def drain(self, worker: WorkerHandle) -> list[protocol.Message]:
        """Whatever an exited worker still had in its pipe; stops watching that pipe."""
        return self.pipes.drain(worker)

    def reap(self, worker: WorkerHandle, wait: float = 5.0) -> int | None:
        """The worker's exit status once its event pipe closed (negative: killed by a signal)."""
        assert isinstance(worker, Worker)
        try:
            code = worker.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            worker.signal_group(signal.SIGKILL)
            code = worker.process.wait()
        worker.exited = True
        self.pipes.forget(worker)
        worker.close()
        return code

    def close(self) -> None:
        self.pipes.close()
