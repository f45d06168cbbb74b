"""Ray backend: workers are Ray actors on cluster nodes, each running the local worker process.

A worker handle here is one job's ranks: a single actor for an ordinary test, n actors in a
STRICT_SPREAD placement group for `@pytest.mark.nodes(n)` (placer.py). On its node every actor
starts the same worker process as the local backend: a fork of that node's template of its
kind (one NodeTemplates actor per run and node keeps them, actor.py) once it has collected,
else a fresh `python -m pytest ... --devpool-worker` process. A thread per handle
pulls the ranks' event lines from their actors, merges the ranks into one stream (one start,
report and finish per test) and writes it into a local pipe (bridge.py), so the controller's
event loop reads Ray workers exactly as it reads local ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from devpool.backends import Backend, Forks, WorkerHandle
from devpool.backends.layout import Layout
from devpool.backends.pipes import EventPipes
from devpool.backends.ray import ports as ray_ports
from devpool.backends.ray.actor import STOP_WAIT, RankSpec, shipped_lists
from devpool.backends.ray.bridge import LOST_EXIT, EventBridge
from devpool.backends.ray.cluster import alive_nodes, connect, describe_cluster, import_ray, plural
from devpool.backends.ray.ending import end_ranks, gather_logs, remove_ray_objects
from devpool.backends.ray.forks import NodeForks
from devpool.backends.ray.handle import RayWorker
from devpool.backends.ray.placer import Placer
from devpool.backends.ray.waiting import ClusterWaitingRoom
from devpool.config import Settings
from devpool.devices.inventory import Inventory
from devpool.devices.leases import Lease
from devpool.plan.markers import Request
from devpool.worker import protocol

PLACE_GRACE = 2.0  # seconds a placement takes on a cluster with room (actor start included)
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


class RayBackend(NodeForks, Backend):
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
        # code a worker that cannot read it says so in its log (see worker/worklist.py).
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
            ray = import_ray()
            if ray.is_initialized():
                ray.shutdown()  # the job-wide runtime_env is set when joining the cluster
        self.address = connect(settings.ray_address, self.runtime_env)
        self.nodes = alive_nodes(self.resource)
        self.peer_service = settings.peer_service
        self.placer = Placer(settings, self.resource)  # placer.py: a job's actors on the cluster
        self.bridge = EventBridge(settings)  # bridge.py: their events into the controller's pipe
        NodeForks.__init__(self)

    # ---- what the cluster can hold --------------------------------------------------------

    def unsatisfiable(self, request: Request) -> str | None:
        """Why the cluster can never place this request (so it fails now instead of hanging)."""
        k, n = request.device_count, request.nodes
        for name, units in request.resources:
            # Ray holds named resources across every run on the cluster: each node declares
            # its units as a custom resource, and Ray places a test only where they are free.
            if not any(node.resources.get(name, 0) >= units for node in self.nodes):
                return (
                    f"resources({name}={units}) on the Ray backend needs the custom resource "
                    f"{name!r} on the cluster's nodes, which Ray holds across every run: start "
                    f"each node with it, e.g. ray start --resources='{{\"{name}\": {units}}}'"
                )
        if k == 0 and n == 1 and not request.resources:
            return None
        fitting = [
            node
            for node in self.nodes
            if node.count >= k
            and all(node.resources.get(name, 0) >= units for name, units in request.resources)
        ]
        if len(fitting) >= n:
            return None
        need = f"{plural(n, 'node')} × {k} {self.resource}" if n > 1 else f"{k} {self.resource}"
        if k == 0:
            need = plural(n, "node")
        return f"needs {need}; cluster has {describe_cluster(self.nodes, self.resource)}"

    # ---- sharing the cluster with other runs ------------------------------------------------

    def forks(self) -> Forks:
        return self

    def waiting_room(self, session: str) -> ClusterWaitingRoom:
        """Where runs on this cluster say they wait for a fair share (ray/waiting.py)."""
        return ClusterWaitingRoom(session)

    def unplaced(self, now: float) -> dict[int, float]:
        """Sizes (devices per rank) whose workers Ray has not placed for PLACE_GRACE seconds,
        and since when (monotonic): other runs' actors hold what they need."""
        since: dict[int, float] = {}
        for worker in self.workers.values():
            if worker.placed or worker.finished.is_set() or now - worker.asked < PLACE_GRACE:
                continue
            size = len(worker.devices)
            since[size] = min(since.get(size, worker.asked), worker.asked)
        return since

    # ---- workers --------------------------------------------------------------------------

    def start(
        self,
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        request: Request | None = None,
        kind: str = "",
    ) -> RayWorker:
        """Ask Ray for the job's placement and start its ranks, in a thread of their own
        (forked from their nodes' templates of a kind, when kind is given)."""
        request = request or Request(device_count=len(devices))
        self._next_key += 1
        key = self._next_key
        read_end, write_end = os.pipe()
        flags = fcntl.fcntl(read_end, fcntl.F_GETFL)
        fcntl.fcntl(read_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"worker-{key}.log"
        log.write_text(f"devpool: waiting for a Ray placement of {request.describe()}\n")
        worker = RayWorker(key, devices, Layout.of(request).world, log, read_end, lease)
        worker.asked = time.monotonic()
        worker.kind = kind
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

    # ---- what a node's actor needs ------------------------------------------------------
    def _spec(self, env: Mapping[str, str], count: int, node_total: int) -> RankSpec:
        """What an actor on a node needs to start a worker or a template of `count` devices
        (a worker's log, peer service and template are its own: see _launch)."""
        env = dict(env)
        env["DEVPOOL_VISIBLE_ENV"] = self.platform.visible_env or ""
        env.pop("DEVPOOL_STACKS_FILE", None)
        ship = self.settings.ray_ship_code
        return RankSpec(
            args=tuple(self.args),
            cwd=str(self.cwd),
            env=env,
            log="",
            platform=self.platform.name,
            resource=self.resource,
            count=count,
            lock_dir=str(self.settings.lock_dir),
            ship_code=ship,
            node_total=node_total,
            lists=shipped_lists(env, self.cwd) if ship else {},
            cpu_slots=self.settings.cpu_slots,
        )

    # ---- one worker's life ------------------------------------------------------------------

    def _lifecycle(
        self, worker: RayWorker, request: Request, env: dict[str, str], write_end: int
    ) -> None:
        code = LOST_EXIT
        try:
            placed = self.placer.place(worker, request, env.get("DEVPOOL_RUN_ID", ""))
            if placed and self._launch(worker, request, env):
                code = self.bridge.pump(worker, write_end)
        except Exception as exc:  # noqa: BLE001 - any Ray failure ends this worker, not the run
            worker.lost = worker.lost or f"Ray worker failed: {type(exc).__name__}: {exc}"
        finally:
            if worker.lost:
                self._note(worker, f"devpool: {worker.lost}")
            end_ranks(worker, fetch=self.settings.ray_ship_code)
            gather_logs(worker, fetch=False)
            worker.code = code
            with contextlib.suppress(OSError):
                os.close(write_end)
            worker.finished.set()

    def _launch(self, worker: RayWorker, request: Request, env: dict[str, str]) -> bool:
        """Start every rank's worker process (rank 0 picks the port the ranks meet on)."""
        ray = import_ray()
        n = worker.world
        ports = ray_ports.lease(worker.ranks[0].actor, self.settings, request)  # rank 0's node
        port = ports[0] if ports else 0
        master = worker.ranks[0].address if n > 1 else "127.0.0.1"
        totals = {node.node_id: node.count for node in self.nodes}
        if any(rank.node_id not in totals for rank in worker.ranks):  # a node joined since
            self.nodes = alive_nodes(self.resource)
            totals = {node.node_id: node.count for node in self.nodes}
        ship = self.settings.ray_ship_code
        layout = Layout.of(request)
        specs = []
        for rank in worker.ranks:
            rank_env = dict(
                env, **ray_ports.rank_env(ports, master, self.settings.keep_master_port)
            )
            if n > 1 and not layout.torchrun:
                rank_env.update(
                    DEVPOOL_NODE_RANK=str(rank.rank),
                    DEVPOOL_NODE_WORLD_SIZE=str(n),
                    DEVPOOL_NODE_MASTER_ADDR=worker.ranks[0].address,
                    DEVPOOL_NODE_MASTER_PORT=str(port),
                    DEVPOOL_NODE_PEERS=",".join(r.address for r in worker.ranks),
                )
            rank.log = worker.log if n == 1 else worker.log.with_suffix(f".rank{rank.rank}.log")
            count = layout.per_rank
            specs.append(
                replace(
                    self._spec(rank_env, count, totals.get(rank.node_id, count)),
                    log="" if ship else str(rank.log),
                    peer_service=(request.peer_service or self.peer_service)
                    if rank.rank > 0
                    else None,
                    template=self._template_path(worker, rank.node_id),
                    cpus=request.cpus,
                )
            )
        if layout.torchrun:
            # Each rank takes its devices first: every rank then sees its node's, in order.
            claimed = ray.get(
                [r.actor.claim.remote(s) for r, s in zip(worker.ranks, specs, strict=True)]
            )
            for rank, spec in zip(worker.ranks, specs, strict=True):
                own = claimed[rank.rank]
                visible = layout.visible(rank.rank, claimed)
                spec.env.update(layout.env(rank.rank, master, own))
                specs[rank.rank] = replace(spec, visible=visible)
        refs = [
            rank.actor.start.remote(spec) for rank, spec in zip(worker.ranks, specs, strict=True)
        ]
        started = ray.get(refs)
        with worker.lock:
            for rank, info in zip(worker.ranks, started, strict=True):
                rank.pid = int(info["pid"])
                rank.devices = [int(d) for d in info["devices"]]
            worker.running = True
            for message in worker.waiting_commands:
                data = protocol.encode(message)
                for rank in worker.ranks:
                    rank.actor.send.remote(data)
            worker.waiting_commands = []
        return True

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
        ray = import_ray()
        for worker in list(self.workers.values()):
            remove_ray_objects(worker)
        self.workers.clear()
        self.stop_templates()
        self.pipes.close()
        with contextlib.suppress(Exception):
            ray.shutdown()
