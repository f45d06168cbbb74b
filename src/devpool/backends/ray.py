"""Ray backend: workers are Ray actors on cluster nodes, each running the local worker process.

A worker handle here is one job's ranks: a single actor for an ordinary test, n actors in a
STRICT_SPREAD placement group for `@pytest.mark.nodes(n)`. On its node every actor starts the
same `python -m pytest ... --devpool-worker` process as the local backend. A thread per handle
pulls the ranks' event lines from their actors, merges the ranks into one stream (one start,
report and finish per test) and writes it into a local pipe, so the controller's event loop
reads Ray workers exactly as it reads local ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool.backends import WorkerHandle, ray_ports
from devpool.backends.pipes import EventPipes
from devpool.config import Settings
from devpool.devices.inventory import Inventory, Platform
from devpool.devices.leases import Holder, Lease
from devpool.devices.lockdir import LockDir
from devpool.errors import DevpoolError
from devpool.plan.markers import Request
from devpool.report.terminal import read_log
from devpool.select.baseline import union_deps
from devpool.select.record import DEPS_ATTR
from devpool.select.tables import expand
from devpool.worker import protocol, worklist
from devpool.worker.session import stacks_file

EVENTS_WAIT = 0.5  # seconds an actor holds an events() call open waiting for output
LOST_EXIT = -int(signal.SIGKILL)  # the exit status reported for a worker whose node went away
STOP_WAIT = 5.0  # seconds a peer service gets between SIGTERM and SIGKILL
CPU_BUNDLE = 0.01  # a multi-node CPU-only test still needs one bundle per node
SHIP_EXCLUDES = [
    ".git",
    ".devpool",
    "node_modules",
    "*.sqlite",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
]


def _ray() -> Any:
    """The ray module; a clear error when the optional extra is not installed."""
    try:
        import ray
    except ImportError:
        raise DevpoolError("--devpool-backend ray needs Ray: pip install 'devpool[ray]'") from None
    return ray


def _connect(address: str | None, runtime_env: Mapping[str, Any] | None = None) -> str:
    """Join the cluster (quietly); the address it was reached at."""
    ray = _ray()
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    if ray.is_initialized():
        return target
    try:
        ray.init(
            address=target,
            namespace="devpool",
            logging_level=logging.ERROR,
            log_to_driver=False,
            runtime_env=dict(runtime_env) if runtime_env else None,
        )
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DevpoolError(
            f"cannot reach the Ray cluster at {target} (--devpool-ray-address or RAY_ADDRESS): "
            f"{first}"
        ) from None
    return target


@dataclass(frozen=True)
class NodeShape:
    """One alive Ray node: its id, address and how many of the platform's resource it has."""

    node_id: str
    address: str
    count: int


def _nodes(resource: str) -> list[NodeShape]:
    ray = _ray()
    shapes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        count = int(node.get("Resources", {}).get(resource, 0))
        shapes.append(NodeShape(node["NodeID"], node["NodeManagerAddress"], count))
    return shapes


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def describe_cluster(nodes: Sequence[NodeShape], resource: str) -> str:
    """'2 nodes with 4 NPU' or '1 node with 4 NPU, 1 node with 2 NPU'."""
    if not nodes:
        return "no alive nodes"
    counts: dict[int, int] = {}
    for node in nodes:
        counts[node.count] = counts.get(node.count, 0) + 1
    return ", ".join(
        f"{_plural(n, 'node')} with {count} {resource}"
        for count, n in sorted(counts.items(), reverse=True)
    )


def cluster_inventory(
    spec: str | None, platforms: Mapping[str, Platform], address: str | None
) -> Inventory:
    """--devices PLATFORM on a Ray cluster: one virtual slot per device the cluster has."""
    if spec is None or ":" in spec or spec not in platforms:
        if spec is not None and ":" in spec:
            raise DevpoolError(
                "with --devpool-backend ray, --devices names only the platform, e.g. "
                "--devices sim; the cluster decides the devices"
            )
        known = ", ".join(sorted(platforms))
        raise DevpoolError(
            f"with --devpool-backend ray, --devices names a platform ({known}), "
            f"not {spec!r}; the cluster decides the devices"
        )
    platform = platforms[spec]
    where = _connect(address)
    nodes = _nodes(platform.ray_resource)
    total = sum(node.count for node in nodes)
    if total == 0:
        raise DevpoolError(
            f"the Ray cluster at {where} has no {platform.ray_resource} resource for platform "
            f"{platform.name} ({describe_cluster(nodes, platform.ray_resource)}); set "
            f"ray-resource under [tool.devpool.platforms] {platform.name}"
        )
    source = (
        f"ray cluster at {where}: {_plural(len(nodes), 'node')}, {total} {platform.ray_resource}"
    )
    return Inventory(platform, tuple(range(total)), source)


# ---- on the node ---------------------------------------------------------------------------


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


# Files the controller names in a worker's environment and the worker reads at its start:
# the selected node ids (rootdir-relative) and the modules to collect (paths).
SELECTION_ENV, MODULES_ENV = worklist.NODEIDS_ENV, "DEVPOOL_COLLECT_ONLY"


def shipped_lists(env: Mapping[str, str], cwd: Path) -> dict[str, list[str]]:
    """The selection and module lists a worker reads, for a node that cannot see the
    controller's files: modules relative to cwd (the folder shipped as working_dir)."""
    lists: dict[str, list[str]] = {}
    for name in (SELECTION_ENV, MODULES_ENV):
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
        self.process: subprocess.Popen[bytes] | None = None
        self.service: subprocess.Popen[bytes] | None = None
        self.fd_in = -1
        self.buffer = bytearray()
        self.eof = False
        self.cond = threading.Condition()
        self.leases: list[Lease] = []
        self.log = ""
        self.written: list[str] = []  # the shipped lists' files on this node

    def place(self) -> dict[str, Any]:
        """Where Ray put this actor and what it assigned."""
        ray = _ray()
        context = ray.get_runtime_context()
        ids = context.get_accelerator_ids()
        return {
            "node_id": context.get_node_id(),
            "address": ray.util.get_node_ip_address(),
            "accelerators": {key: list(value) for key, value in ids.items()},
        }

    def lease_ports(self, lock_dir: str, count: int, ports: tuple[int, int]) -> list[int]:
        """Ports leased on this node for the ranks to meet on (ray_ports.py), held to stop()."""
        lease, leased = ray_ports.lease_on_node(lock_dir, count, ports)
        self.leases.append(lease)
        return leased

    def _devices(self, spec: RankSpec, node_id: str) -> list[int]:
        """Ray's ids for known accelerators; node-local flocks for custom resources (sim)."""
        ray = _ray()

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

    def start(self, spec: RankSpec) -> dict[str, Any]:
        """Start the worker process; its events are buffered for events()."""
        ray = _ray()

        node_id = ray.get_runtime_context().get_node_id()
        devices = self._devices(spec, node_id)
        env = dict(spec.env)
        ids = ",".join(str(d) for d in devices)
        env["DEVPOOL_DEVICES"] = ids
        env["DEVPOOL_RAY_NODE_ID"] = node_id
        visible = env.get("DEVPOOL_VISIBLE_ENV", "")
        env.pop("DEVPOOL_VISIBLE_ENV", None)
        if visible:
            env[visible] = ids
        cwd = os.getcwd() if spec.ship_code else spec.cwd
        if spec.log:
            Path(spec.log).parent.mkdir(parents=True, exist_ok=True)
            self.log = spec.log
        else:
            fd, self.log = tempfile.mkstemp(prefix="devpool-worker-", suffix=".log")
            os.close(fd)
        env["DEVPOOL_STACKS_FILE"] = str(stacks_file(Path(self.log)))
        for name, lines in spec.lists.items():
            if name == MODULES_ENV:  # where this node unpacked the shipped folder
                lines = [os.path.join(cwd, line) for line in lines]
            fd, path = tempfile.mkstemp(prefix="devpool-list-", suffix=".txt")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write("".join(f"{line}\n" for line in lines))
            self.written.append(path)
            env[name] = path
        if spec.peer_service:
            self._start_service(spec.peer_service, cwd, env)
        cmd_read, cmd_write = os.pipe()
        ev_read, ev_write = os.pipe()
        argv = [
            sys.executable,
            "-m",
            "pytest",
            *spec.args,
            "--devpool-worker",
            f"{cmd_read},{ev_write},{os.getpid()}",
        ]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(cmd_read, ev_write),
                start_new_session=True,
            )
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
                else:
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


# ---- merging ranks -------------------------------------------------------------------------


def _longrepr_text(data: Mapping[str, Any]) -> str:
    import pytest

    try:
        return str(pytest.TestReport._from_json(dict(data)).longreprtext)  # noqa: SLF001
    except Exception:  # noqa: BLE001 - an odd longrepr still gets shown as it is
        return json.dumps(data.get("longrepr"), default=str)


def _label(rank: int, text: str) -> str:
    return "\n".join(f"[rank {rank}] {line}" for line in (text.splitlines() or [""]))


def merge_phase(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """One phase of one test across ranks: failed if any rank failed, passed only if all did."""
    failed = [(r, d) for r, d in reports if d.get("outcome") == "failed"]
    skipped = [(r, d) for r, d in reports if d.get("outcome") == "skipped"]
    base = dict((failed or skipped or list(reports))[0][1])
    base["duration"] = max(float(d.get("duration", 0.0)) for _, d in reports)
    if all("start" in d for _, d in reports):
        base["start"] = min(float(d["start"]) for _, d in reports)
        base["stop"] = max(float(d.get("stop", d["start"])) for _, d in reports)
    base["sections"] = [
        [f"{title} [rank {rank}]", content]
        for rank, data in reports
        for title, content in data.get("sections", [])
    ]
    if failed:
        base["outcome"] = "failed"
        base["longrepr"] = "\n".join(_label(r, _longrepr_text(d)) for r, d in failed)
    deps = _union_of_ranks(reports)
    if deps is not None:
        base[DEPS_ATTR] = deps
    return base


def _union_of_ranks(reports: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """--devpool-select record: a test depends on what any of its ranks ran or read."""
    seen = [
        expand(deps) if isinstance(deps, Mapping) else deps
        for deps in (data.get(DEPS_ATTR) for _, data in reports)
    ]
    if not any(isinstance(deps, Mapping) for deps in seen):
        return None
    nodeid = reports[0][1].get("nodeid")
    lacking = {"nodeid": nodeid, "recorded": False, "why": "a rank sent no dependencies"}
    return union_deps([deps if isinstance(deps, Mapping) else lacking for deps in seen])


class Merge:
    """n ranks' event streams → one stream with one start, report and finish per test."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.reports: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.finished: dict[str, set[int]] = {}
        self.started: set[str] = set()
        self.missing: set[str] = set()
        self.done: dict[int, dict[int, list[str]]] = {}

    def feed(self, rank: int, message: protocol.Message) -> list[protocol.Message]:
        if self.world == 1:
            return [message]
        event = message.get("ev")
        if event in ("ready", "warning", "renamed"):  # said once, as by one process
            return [message] if rank == 0 else []
        if event == "start":
            nodeid = message["nodeid"]
            if nodeid in self.started:
                return []
            self.started.add(nodeid)
            return [message]
        if event == "report":
            data = message["data"]
            self.reports.setdefault(data["nodeid"], []).append((rank, data))
            return []
        if event == "finish":
            nodeid = message["nodeid"]
            ranks = self.finished.setdefault(nodeid, set())
            ranks.add(rank)
            if len(ranks) < self.world:
                return []
            return [*self._merged(nodeid), message]
        if event == "missing":
            if message["nodeid"] in self.missing:
                return []
            self.missing.add(message["nodeid"])
            return [message]
        if event == "done":
            job = int(message["job"])
            ranks_done = self.done.setdefault(job, {})
            ranks_done[rank] = list(message.get("skipped", ()))
            if len(ranks_done) < self.world:
                return []
            skipped = sorted({n for names in ranks_done.values() for n in names})
            del self.done[job]
            return [{"ev": "done", "job": job, "skipped": skipped}]
        return []

    def _merged(self, nodeid: str) -> list[protocol.Message]:
        reports = sorted(self.reports.pop(nodeid, []), key=lambda rd: rd[0])
        self.started.discard(nodeid)
        self.finished.pop(nodeid, None)
        out: list[protocol.Message] = []
        for when in ("setup", "call", "teardown"):
            phase = [(r, d) for r, d in reports if d.get("when") == when]
            if not phase:
                continue
            merged = merge_phase(phase)
            out.append({"ev": "report", "data": merged})
            if when == "setup" and merged.get("outcome") != "passed":
                # pytest runs no call after a failed or skipped setup: nor does the merge.
                reports = [(r, d) for r, d in reports if d.get("when") != "call"]
        return out


# ---- on the controller ---------------------------------------------------------------------


@dataclass
class Rank:
    """One rank of a worker: its actor and what it reported about itself."""

    rank: int
    actor: Any
    node_id: str = ""
    address: str = ""
    pid: int = 0
    devices: list[int] = field(default_factory=list)
    log: Path | None = None  # its log on the controller's side
    code: int | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.address,
            "node_id": self.node_id,
            "devices": self.devices,
            "pid": self.pid,
            "log": str(self.log) if self.log is not None else "",
        }


@dataclass(eq=False)
class RayWorker:
    """A job's ranks on the cluster, seen by the controller as one worker."""

    key: int
    devices: tuple[int, ...]
    world: int
    log: Path
    fd_out: int
    lease: Lease | None = None
    reader: protocol.Reader = field(default_factory=protocol.Reader)
    exited: bool = False
    lost: str | None = None
    ranks: list[Rank] = field(default_factory=list)
    placement_group: Any = None
    code: int | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    stop_asked: threading.Event = field(default_factory=threading.Event)
    running: bool = False  # the rank processes are started: send() goes straight to them
    outbox: list[protocol.Message] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pid(self) -> int:
        """Rank 0's worker pid on its node (0 until it started)."""
        return self.ranks[0].pid if self.ranks else 0

    @property
    def stacks(self) -> Path:
        return stacks_file(self.log)

    @property
    def rank_info(self) -> list[dict[str, Any]]:
        return [rank.describe() for rank in self.ranks if rank.node_id]

    def send(self, message: protocol.Message) -> bool:
        """Send a command to every rank; held back until the ranks have started."""
        if self.finished.is_set():
            return False
        with self.lock:
            if not self.running:
                self.outbox.append(message)
                if message.get("op") == "stop":
                    self.stop_asked.set()
                return True
            data = protocol.encode(message)
            for rank in self.ranks:
                rank.actor.send.remote(data)
        return True

    def signal_group(self, signum: int) -> None:
        """Signal every rank's process group; before the ranks started, a kill stops the start."""
        if signum in (signal.SIGTERM, signal.SIGKILL):
            self.stop_asked.set()
        if self.finished.is_set():
            return
        with self.lock:
            for rank in self.ranks:
                with contextlib.suppress(Exception):
                    rank.actor.signal.remote(signum, True)

    def dump_stacks(self) -> None:
        """Ask every rank's faulthandler for its stacks (SIGUSR1 to the worker process)."""
        with self.lock:
            for rank in self.ranks:
                with contextlib.suppress(Exception):
                    rank.actor.signal.remote(int(signal.SIGUSR1), False)

    def poll(self) -> int | None:
        return self.code if self.finished.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self.finished.wait(timeout):
            raise subprocess.TimeoutExpired(f"ray worker {self.key}", timeout or 0.0)
        assert self.code is not None
        return self.code

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd_out)


class RayBackend:
    """Starts workers as Ray actors and multiplexes their bridged event pipes."""

    local_leases = False

    def __init__(
        self,
        args: Sequence[str],
        cwd: Path,
        log_dir: Path,
        settings: Settings,
        inventory: Inventory,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        self.args = list(args)  # a worker's pytest arguments: see worklist.worker_args
        self.cwd = cwd
        # The same for every worker; a path in it is the controller's, so with shipped
        # code a worker that cannot read it says so in its log (see worker/session.py).
        self.worker_env = dict(worker_env or {})
        self.log_dir = log_dir
        self.settings = settings
        self.platform = inventory.platform
        self.resource = inventory.platform.ray_resource
        self.pipes = EventPipes()
        self.workers: dict[int, RayWorker] = {}
        self._next_key = 0
        self.runtime_env: dict[str, Any] | None = None
        if settings.ray_ship_code:
            self.runtime_env = {"working_dir": str(cwd), "excludes": SHIP_EXCLUDES}
            ray = _ray()
            if ray.is_initialized():
                ray.shutdown()  # the job-wide runtime_env is set when joining the cluster
        self.address = _connect(settings.ray_address, self.runtime_env)
        self.nodes = _nodes(self.resource)
        self.peer_service = settings.peer_service

    # ---- what the cluster can hold --------------------------------------------------------

    def unsatisfiable(self, request: Request) -> str | None:
        """Why the cluster can never place this request (so it fails now instead of hanging)."""
        k, n = request.device_count, request.nodes
        if k == 0 and n == 1:
            return None
        fitting = [node for node in self.nodes if node.count >= k]
        if len(fitting) >= n:
            return None
        need = f"{_plural(n, 'node')} × {k} {self.resource}" if n > 1 else f"{k} {self.resource}"
        if k == 0:
            need = _plural(n, "node")
        return f"needs {need}; cluster has {describe_cluster(self.nodes, self.resource)}"

    # ---- workers --------------------------------------------------------------------------

    def start(
        self,
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        request: Request | None = None,
    ) -> RayWorker:
        """Ask Ray for the job's placement and start its ranks, in a thread of their own."""
        request = request or Request(device_count=len(devices))
        self._next_key += 1
        key = self._next_key
        read_end, write_end = os.pipe()
        flags = fcntl.fcntl(read_end, fcntl.F_GETFL)
        fcntl.fcntl(read_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"worker-{key}.log"
        log.write_text(f"devpool: waiting for a Ray placement of {request.describe()}\n")
        worker = RayWorker(key, devices, max(1, request.nodes), log, read_end, lease)
        self.workers[key] = worker
        self.pipes.watch(worker)
        thread = threading.Thread(
            target=self._lifecycle,
            args=(worker, request, {**env, **self.worker_env}, write_end),
            name=f"devpool-ray-worker-{key}",
            daemon=True,
        )
        thread.start()
        return worker

    def _lifecycle(
        self, worker: RayWorker, request: Request, env: dict[str, str], write_end: int
    ) -> None:
        code = LOST_EXIT
        try:
            if self._place(worker, request) and self._launch(worker, request, env):
                code = self._pump(worker, write_end)
        except Exception as exc:  # noqa: BLE001 - any Ray failure ends this worker, not the run
            worker.lost = worker.lost or f"Ray worker failed: {type(exc).__name__}: {exc}"
        finally:
            if worker.lost:
                self._note(worker, f"devpool: {worker.lost}")
            self._cleanup(worker)
            self._gather_logs(worker, fetch=False)
            worker.code = code
            with contextlib.suppress(OSError):
                os.close(write_end)
            worker.finished.set()

    def _actor_class(self) -> Any:
        ray = _ray()
        return ray.remote(RankProcess)

    def _place(self, worker: RayWorker, request: Request) -> bool:
        """Placement group and actors, bounded by --devpool-lease-timeout; False when not placed."""
        ray = _ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        k, n = request.device_count, worker.world
        actor_class = self._actor_class()
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 8}
        if k:
            if self.resource == "GPU":
                options["num_gpus"] = k
            else:
                options["resources"] = {self.resource: k}
        deadline = time.monotonic() + self.settings.lease_timeout
        if n > 1:
            bundle = {self.resource: k} if k else {"CPU": CPU_BUNDLE}
            if not k:
                options["num_cpus"] = CPU_BUNDLE
            worker.placement_group = placement_group([bundle] * n, strategy="STRICT_SPREAD")
            if not self._ready([worker.placement_group.ready()], worker, deadline):
                return False
            for index in range(n):
                strategy = PlacementGroupSchedulingStrategy(
                    worker.placement_group, placement_group_bundle_index=index
                )
                actor = actor_class.options(scheduling_strategy=strategy, **options).remote()
                worker.ranks.append(Rank(index, actor))
        else:
            worker.ranks.append(Rank(0, actor_class.options(**options).remote()))
        refs = [rank.actor.place.remote() for rank in worker.ranks]
        if not self._ready(refs, worker, deadline):
            return False
        for rank, where in zip(worker.ranks, ray.get(refs), strict=True):
            rank.node_id = where["node_id"]
            rank.address = where["address"]
        return True

    def _ready(self, refs: list[Any], worker: RayWorker, deadline: float) -> bool:
        ray = _ray()
        pending = list(refs)
        while pending:
            if worker.stop_asked.is_set():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                worker.lost = (
                    f"no Ray placement within --devpool-lease-timeout "
                    f"{self.settings.lease_timeout:g} s"
                )
                return False
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(0.5, left))
        return True

    def _launch(self, worker: RayWorker, request: Request, env: dict[str, str]) -> bool:
        """Start every rank's worker process (rank 0 picks the port the ranks meet on)."""
        ray = _ray()
        n = worker.world
        env = dict(env)
        env["DEVPOOL_VISIBLE_ENV"] = self.platform.visible_env or ""
        env.pop("DEVPOOL_STACKS_FILE", None)
        ports = ray_ports.lease(worker.ranks[0].actor, self.settings, request)  # rank 0's node
        port, master = (ports[0] if ports else 0), worker.ranks[0].address if n > 1 else "127.0.0.1"
        totals = {node.node_id: node.count for node in self.nodes}
        ship = self.settings.ray_ship_code
        lists = shipped_lists(env, self.cwd) if ship else {}
        refs = []
        for rank in worker.ranks:
            rank_env = dict(env, **ray_ports.rank_env(ports, master))
            if n > 1:
                rank_env.update(
                    DEVPOOL_NODE_RANK=str(rank.rank),
                    DEVPOOL_NODE_WORLD_SIZE=str(n),
                    DEVPOOL_NODE_MASTER_ADDR=worker.ranks[0].address,
                    DEVPOOL_NODE_MASTER_PORT=str(port),
                    DEVPOOL_NODE_PEERS=",".join(r.address for r in worker.ranks),
                )
            rank.log = worker.log if n == 1 else worker.log.with_suffix(f".rank{rank.rank}.log")
            spec = RankSpec(
                args=tuple(self.args),
                cwd=str(self.cwd),
                env=rank_env,
                log="" if ship else str(rank.log),
                platform=self.platform.name,
                resource=self.resource,
                count=request.device_count,
                lock_dir=str(self.settings.lock_dir),
                ship_code=ship,
                node_total=totals.get(rank.node_id, request.device_count),
                peer_service=(request.peer_service or self.peer_service) if rank.rank > 0 else None,
                lists=lists,
            )
            refs.append(rank.actor.start.remote(spec))
        started = ray.get(refs)
        with worker.lock:
            for rank, info in zip(worker.ranks, started, strict=True):
                rank.pid = int(info["pid"])
                rank.devices = [int(d) for d in info["devices"]]
            worker.running = True
            for message in worker.outbox:
                data = protocol.encode(message)
                for rank in worker.ranks:
                    rank.actor.send.remote(data)
            worker.outbox = []
        return True

    def _pump(self, worker: RayWorker, write_end: int) -> int:
        """Bridge the ranks' events into the controller's pipe until every rank has exited."""
        ray = _ray()
        merge = Merge(worker.world)
        readers = [protocol.Reader() for _ in worker.ranks]
        calls = {rank.actor.events.remote(EVENTS_WAIT): rank for rank in worker.ranks}
        failed_code: int | None = None
        while calls:
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=EVENTS_WAIT * 4)
            for ref in ready:
                rank = calls.pop(ref)
                try:
                    data, code = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    worker.lost = f"node {rank.address or '?'} lost ({_why_lost(exc)})"
                    self._kill_ranks(worker)
                    return LOST_EXIT
                out: list[protocol.Message] = []
                for message in readers[rank.rank].feed(data):
                    out += merge.feed(rank.rank, message)
                if any(m.get("ev") == "finish" for m in out):
                    self._gather_logs(worker, fetch=self.settings.ray_ship_code)
                for message in out:
                    protocol.write(write_end, message)
                if code is None:
                    calls[rank.actor.events.remote(EVENTS_WAIT)] = rank
                    continue
                rank.code = code
                if code != 0 and failed_code is None:
                    # One rank gone wrong ends the test on every rank.
                    failed_code = code
                    self._kill_ranks(worker)
        codes = [rank.code or 0 for rank in worker.ranks]
        return failed_code if failed_code is not None else next((c for c in codes if c), 0)

    def _kill_ranks(self, worker: RayWorker) -> None:
        for rank in worker.ranks:
            with contextlib.suppress(Exception):
                rank.actor.signal.remote(int(signal.SIGKILL), True)

    def _cleanup(self, worker: RayWorker) -> None:
        """Stop the ranks' processes and services, then remove the actors and placement group."""
        ray = _ray()

        stops = []
        for rank in worker.ranks:
            with contextlib.suppress(Exception):
                stops.append(rank.actor.stop.remote())
        if stops and not worker.lost:
            with contextlib.suppress(Exception):
                ray.wait(stops, num_returns=len(stops), timeout=STOP_WAIT * 2)
        if self.settings.ray_ship_code and not worker.lost:
            self._fetch_logs(worker)
        _remove_ray_objects(worker)

    def _fetch_logs(self, worker: RayWorker) -> None:
        """--devpool-ray-ship-code: the nodes' logs come back as text, written here."""
        ray = _ray()
        for rank in worker.ranks:
            if rank.log is None or not rank.node_id:
                continue
            try:
                text, stacks = ray.get(rank.actor.log_text.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a log we cannot fetch stays as it was
                continue
            rank.log.write_text(text, encoding="utf-8")
            if stacks:
                stacks_file(rank.log).write_text(stacks, encoding="utf-8")

    def _gather_logs(self, worker: RayWorker, fetch: bool) -> None:
        """A multi-node worker's log: every rank's log, labelled, one after the other."""
        if fetch:
            self._fetch_logs(worker)
        if worker.world == 1:
            return
        parts, stacks = [], []
        for rank in worker.ranks:
            if rank.log is None:
                continue
            head = f"==== rank {rank.rank} on node {rank.address} ({rank.node_id[:12]}) ===="
            parts += [head, read_log(rank.log), f"(rank {rank.rank} log: {rank.log})"]
            rank_stacks = read_log(stacks_file(rank.log))
            if rank_stacks:
                stacks += [head, rank_stacks]
        if parts:
            with contextlib.suppress(OSError):
                worker.log.write_text("\n".join(parts) + "\n", encoding="utf-8")
        if stacks:
            with contextlib.suppress(OSError):
                worker.stacks.write_text("\n".join(stacks) + "\n", encoding="utf-8")

    def _note(self, worker: RayWorker, line: str) -> None:
        with contextlib.suppress(OSError), open(worker.log, "a", encoding="utf-8") as out:
            out.write(line + "\n")

    # ---- the controller's side of the pipes -----------------------------------------------

    def poll(self, timeout: float) -> list[tuple[WorkerHandle, list[protocol.Message], bool]]:
        """Events that arrived within timeout: (worker, messages, reached_eof)."""
        if self.pipes.empty():
            time.sleep(timeout)
            return []
        return self.pipes.poll(timeout)

    def drain(self, worker: WorkerHandle) -> list[protocol.Message]:
        """Whatever an exited worker still had in its pipe; stops watching that pipe."""
        assert isinstance(worker, RayWorker)
        return self.pipes.drain(worker)

    def reap(self, worker: WorkerHandle, wait: float = 5.0) -> int | None:
        """The exit status once the ranks ended; actors and placement group are gone by then."""
        assert isinstance(worker, RayWorker)
        if not worker.finished.wait(wait):
            worker.signal_group(signal.SIGKILL)
            worker.finished.wait(wait + STOP_WAIT * 2)
        worker.exited = True
        self.pipes.forget(worker)
        worker.close()
        self.workers.pop(worker.key, None)
        return worker.code if worker.finished.is_set() else LOST_EXIT

    def close(self) -> None:
        """Always (also on Ctrl-C): no actor nor placement group of this run outlives it."""
        for worker in list(self.workers.values()):
            worker.stop_asked.set()
            worker.signal_group(signal.SIGKILL)
        deadline = time.monotonic() + STOP_WAIT
        for worker in list(self.workers.values()):
            worker.finished.wait(max(0.0, deadline - time.monotonic()))
        ray = _ray()
        for worker in list(self.workers.values()):
            _remove_ray_objects(worker)
        self.workers.clear()
        self.pipes.close()
        with contextlib.suppress(Exception):
            ray.shutdown()


def _why_lost(exc: BaseException) -> str:
    text = str(exc)
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        return "node died"
    return "actor died"


def _remove_ray_objects(worker: RayWorker) -> None:
    """Kill a worker's actors and remove its placement group; quiet if they are gone already."""
    ray = _ray()
    from ray.util.placement_group import remove_placement_group

    for rank in worker.ranks:
        with contextlib.suppress(Exception):
            ray.kill(rank.actor)
    if worker.placement_group is not None:
        with contextlib.suppress(Exception):
            remove_placement_group(worker.placement_group)
        worker.placement_group = None
