"""The rank actor: on its node, one rank's worker process (and maybe a peer service).

The actor starts the same worker as the local backend and buffers its event lines until the
controller pulls them with events(). The worker is a fork of the node's template of its kind
(NodeTemplates, one actor per run and node: worker/template.py's fork server, listening on
a Unix socket path of the node) where that template is ready, else a fresh
`python -m pytest ... --devpool-worker` process.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool.backends.ray import ports as ray_ports
from devpool.backends.ray.cluster import import_ray
from devpool.backends.ray.threads import node_budget
from devpool.backends.spawn import pytest_process
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir
from devpool.worker import protocol
from devpool.worker.held import held_file, read_held
from devpool.worker.stacks import stacks_file

STOP_WAIT = 5.0  # seconds a peer service gets between SIGTERM and SIGKILL
FORK_WAIT = 30.0  # seconds a rank waits for its template's fork before starting fresh


@dataclass(frozen=True)
class RankSpec:
    """Everything an actor needs to start one rank's worker process on its node."""

    args: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    log: str  # where the worker's output goes on the node ("" = a node-local temp file)
    platform: str
    resource: str
    count: int
    lock_dir: str
    ship_code: bool
    node_total: int
    peer_service: str | None = None
    # --devpool-ray-ship-code: the controller's lists the worker reads (env var → lines),
    # written on the node; module paths relative to the shipped folder.
    lists: dict[str, list[str]] = field(default_factory=dict)
    template: str = ""  # the node template's socket path to fork from ("": start fresh)
    # A rank of a ranks(n) test: the devices it sees (its node's ranks', in rank order)
    # besides its own (claim()); empty: it sees its own.
    visible: tuple[int, ...] = ()
    # Its thread budget on its node (threads.py): a cpus(n) test's n (0: its share of the
    # node's cores), and the run's CPU slots, which a CPU-only rank's share counts.
    cpus: int = 0
    cpu_slots: int = 1


# The file of modules to collect (paths) the controller names in a worker's environment.
MODULES_ENV = "DEVPOOL_COLLECT_ONLY"


def shipped_lists(env: Mapping[str, str], cwd: Path) -> dict[str, list[str]]:
    """The selection and module lists a worker reads, for a node that cannot see the
    controller's files: modules relative to cwd (the folder shipped as working_dir)."""
    from devpool.worker.worklist import NODEIDS_ENV  # the controller's side: pytest is here

    lists: dict[str, list[str]] = {}
    for name in (NODEIDS_ENV, MODULES_ENV):
        path = env.get(name)
        if not path:
            continue
        try:
            lines = [line for line in Path(path).read_text(encoding="utf-8").split("\n") if line]
        except OSError:
            continue  # the worker says so in its log
        if name == MODULES_ENV:
            lines = [os.path.relpath(line, cwd) for line in lines]
        lists[name] = lines
    return lists


class RankProcess:
    """The actor body: one worker process (and maybe a peer service) on this node."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | ForkedRank | None = None
        self.service: subprocess.Popen[bytes] | None = None
        self.fd_in = -1
        self.buffer = bytearray()
        self.eof = False
        self.cond = threading.Condition()
        self.leases: list[Lease] = []
        self.log = ""
        self.written: list[str] = []  # the shipped lists' files on this node
        self.claimed: list[int] | None = None  # devices claim() took, for start()

    def place(self) -> dict[str, Any]:
        """Where Ray put this actor and what it assigned."""
        ray = import_ray()
        context = ray.get_runtime_context()
        ids = context.get_accelerator_ids()
        return {
            "node_id": context.get_node_id(),
            "address": ray.util.get_node_ip_address(),
            "accelerators": {key: list(value) for key, value in ids.items()},
        }

    def lease_ports(self, lock_dir: str, count: int, ports: tuple[int, int]) -> list[int]:
        """Ports leased on this node for the ranks to meet on (ports.py), held to stop()."""
        lease, leased = ray_ports.lease_on_node(lock_dir, count, ports)
        self.leases.append(lease)
        return leased

    def _devices(self, spec: RankSpec, node_id: str) -> list[int]:
        """Ray's ids for known accelerators; node-local flocks for custom resources (sim)."""
        ray = import_ray()

        if spec.count == 0:
            return []
        assigned = ray.get_runtime_context().get_accelerator_ids().get(spec.resource) or []
        if len(assigned) >= spec.count:
            return sorted(int(i) for i in assigned)[: spec.count]
        # Several Ray nodes may share one host (and its lock folder): lock per Ray node.
        locks = LockDir(Path(spec.lock_dir))
        name = f"{spec.platform}.ray-{node_id[:12]}"
        holder = Holder.for_this_process(f"ray-{node_id[:12]}", "")
        got: list[int] = []
        for device in range(max(spec.node_total, spec.count)):
            lease = locks.try_acquire(name, [device], holder)
            if isinstance(lease, Lease):
                self.leases.append(lease)
                got.append(device)
                if len(got) == spec.count:
                    return got
        raise RuntimeError(f"no free {spec.platform} id on node {node_id[:12]}: {got}")

    def claim(self, spec: RankSpec) -> list[int]:
        """Take this rank's devices before start(), so that the controller can show every
        rank of a node its node's devices (a ranks(n) test)."""
        ray = import_ray()

        self.claimed = self._devices(spec, ray.get_runtime_context().get_node_id())
        return self.claimed

    def start(self, spec: RankSpec) -> dict[str, Any]:
        """Start the worker process; its events are buffered for events()."""
        ray = import_ray()

        node_id = ray.get_runtime_context().get_node_id()
        devices = self.claimed if self.claimed is not None else self._devices(spec, node_id)
        cwd = os.getcwd() if spec.ship_code else spec.cwd
        if spec.log:
            Path(spec.log).parent.mkdir(parents=True, exist_ok=True)
            self.log = spec.log
        else:
            fd, self.log = tempfile.mkstemp(prefix="devpool-worker-", suffix=".log")
            os.close(fd)
        env = node_env(spec, devices, node_id)
        env["DEVPOOL_STACKS_FILE"] = str(stacks_file(Path(self.log)))
        self.written += write_lists(spec, cwd, env)
        if spec.peer_service:
            self._start_service(spec.peer_service, cwd, env)
        cmd_read, cmd_write = os.pipe()
        ev_read, ev_write = os.pipe()
        why = ""
        if spec.template:
            self.process, why = fork_from(spec.template, env, (cmd_read, ev_write), self.log)
        if self.process is None:
            if why:
                with open(self.log, "a", encoding="utf-8") as out:
                    out.write(f"devpool: not forked from this node's template: {why}\n")
            worker = f"{cmd_read},{ev_write},{os.getpid()}"
            pipes = (cmd_read, ev_write)
            self.process = pytest_process(spec.args, worker, cwd, env, self.log, pipes, append=True)
        os.close(cmd_read)
        os.close(ev_write)
        self.fd_in = cmd_write
        threading.Thread(target=self._read, args=(ev_read,), daemon=True).start()
        return {"pid": self.process.pid, "devices": devices, "log": self.log}

    def _start_service(self, command: str, cwd: str, env: Mapping[str, str]) -> None:
        with open(self.log, "ab") as out:
            out.write(f"devpool: starting peer service: {command}\n".encode())
            out.flush()
            self.service = subprocess.Popen(
                shlex.split(command),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _read(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            with self.cond:
                if data:
                    self.buffer += data
                else:  # what the worker held back and never sent (worker/held.py)
                    self.buffer += read_held(held_file(stacks_file(Path(self.log))))
                    self.eof = True
                self.cond.notify_all()
            if not data:
                os.close(fd)
                return

    def events(self, timeout: float) -> tuple[bytes, int | None]:
        """Output so far (waiting up to timeout for some), and the exit status once it ended."""
        with self.cond:
            if not self.buffer and not self.eof:
                self.cond.wait(timeout)
            data = bytes(self.buffer)
            self.buffer.clear()
            eof = self.eof
        code = None
        if eof and self.process is not None:
            try:
                code = self.process.wait(timeout=0 if data else timeout)
            except subprocess.TimeoutExpired:
                code = None
        return data, code

    def send(self, data: bytes) -> bool:
        try:
            while data:
                written = os.write(self.fd_in, data)
                data = data[written:]
        except OSError:
            return False
        return True

    def signal(self, signum: int, group: bool) -> None:
        """Signal the worker process (group: with everything the test started)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.process.pid, signum)
            else:
                os.kill(self.process.pid, signum)

    def log_text(self) -> tuple[str, str]:
        """The worker's log and stacks file, for a controller without this node's filesystem."""
        texts = []
        for path in (Path(self.log), stacks_file(Path(self.log))):
            try:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                texts.append("")
        return texts[0], texts[1]

    def stop(self) -> None:
        """End the peer service and anything left of the worker; free the node-local ids."""
        if self.service is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.service.pid, signal.SIGTERM)
            try:
                self.service.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.service.pid, signal.SIGKILL)
                self.service.wait()
            self.service = None
        self.signal(signal.SIGKILL, True)
        if self.fd_in >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd_in)
            self.fd_in = -1
        for lease in self.leases:
            lease.release()
        self.leases = []
        for path in self.written:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.written = []


def node_env(spec: RankSpec, devices: list[int], node_id: str) -> dict[str, str]:
    """A worker's (or template's) environment on this node: its devices' ids bound, its
    threads its share of this node's cores (threads.py)."""
    env = dict(spec.env)
    env.update(node_budget(env, spec.count, spec.node_total, spec.cpus, spec.cpu_slots))
    ids = ",".join(str(d) for d in (spec.visible or devices))
    env["DEVPOOL_DEVICES"] = ids
    env["DEVPOOL_RAY_NODE_ID"] = node_id
    visible = env.pop("DEVPOOL_VISIBLE_ENV", "")
    if visible:
        env[visible] = ids
    return env


def write_lists(spec: RankSpec, cwd: str, env: dict[str, str]) -> list[str]:
    """--devpool-ray-ship-code: the shipped lists as files of this node, named in env."""
    written = []
    for name, lines in spec.lists.items():
        if name == MODULES_ENV:  # where this node unpacked the shipped folder
            lines = [os.path.join(cwd, line) for line in lines]
        fd, path = tempfile.mkstemp(prefix="devpool-list-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("".join(f"{line}\n" for line in lines))
        written.append(path)
        env[name] = path
    return written


class ForkedRank:
    """A rank's worker forked by the node's template: the template is its parent and says
    when it exits, on the connection that asked for it."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.code: int | None = None
        self.cond = threading.Condition()
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                data = self.conn.recv(1 << 16)
            except OSError:
                data = b""
            # No data: the template is gone, and its children too.
            message = (
                protocol.TEMPLATE_EVENTS.decode(data)
                if data
                else protocol.Exited(pid=self.pid, code=-signal.SIGKILL)
            )
            if isinstance(message, protocol.Exited):
                with self.cond:
                    self.code = message.code
                    self.cond.notify_all()
                self.conn.close()
                return

    def wait(self, timeout: float | None = None) -> int:
        with self.cond:
            self.cond.wait_for(lambda: self.code is not None, timeout)
            if self.code is None:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
            return self.code


def fork_from(
    path: str, env: dict[str, str], pipes: tuple[int, int], log: str
) -> tuple[ForkedRank | None, str]:
    """Ask the node's template at path for a fork on these pipes; (None, why) when it did not."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        conn.settimeout(FORK_WAIT)
        conn.connect(path)
        message = protocol.packet(protocol.ForkWorker(key=0, env=env))
        socket.send_fds(conn, [message], [*pipes, log_fd])
        data = conn.recv(1 << 16)
        reply: protocol.Message = (
            protocol.TEMPLATE_EVENTS.decode(data)
            if data
            else protocol.ForkFailed(key=0, why="the template ended")
        )
    except (OSError, ValueError, protocol.ProtocolError) as exc:
        conn.close()
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        os.close(log_fd)
    if not isinstance(reply, protocol.Forked):
        conn.close()
        if isinstance(reply, (protocol.ForkFailed, protocol.Unsafe)):
            return None, reply.why
        return None, str(reply)
    conn.settimeout(None)
    return ForkedRank(conn, reply.pid), ""
