"""The fork server on every node of a Ray cluster, the controller's side (backends.Forks).

The run keeps one NodeTemplates actor per node (node_templates.py). For each kind of worker
the plan needs, every node that can run it starts a template, which collects once; a job's
rank actors then fork their workers from their node's template instead of starting
`python -m pytest` again. RayBackend is a NodeForks: the pool and the scheduler use it as
they use the local backend's fork server (run/warm.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpool.backends.ray.actor import FORK_WAIT, STOP_WAIT, RankSpec
from devpool.backends.ray.cluster import NodeShape, import_ray
from devpool.backends.ray.handle import RayWorker
from devpool.backends.ray.names import templates_name
from devpool.backends.ray.node_templates import NodeTemplates
from devpool.config import Settings
from devpool.devices.leases import Lease
from devpool.plan.markers import Request
from devpool.report.record import host_name


@dataclass
class RayKind:
    """The templates of one kind of worker, one on each node that can run it."""

    started: float  # time.monotonic() they were asked for
    modules: frozenset[str] | None  # the only test modules they import (None: all)
    waits: dict[str, Any] = field(default_factory=dict)  # node id → its wait() call
    states: dict[str, tuple[str, str]] = field(default_factory=dict)  # node id → what it said


class NodeForks:
    """Templates on every node, and the workers forked from them (RayBackend's part)."""

    settings: Settings
    nodes: list[NodeShape]
    # What RayBackend gives: a worker's start, a node actor's spec, a line in a worker's log.
    start: Callable[..., RayWorker]
    _spec: Callable[[Mapping[str, str], int, int], RankSpec]
    _note: Callable[[RayWorker, str], None]

    def __init__(self) -> None:
        self.kinds: dict[str, RayKind] = {}  # the fork server's templates, by kind
        self.node_templates: dict[str, Any] = {}  # node id → its NodeTemplates actor
        self.templates_lock = threading.Lock()
        self._notes: list[str] = []
        self._noted: set[tuple[str, str]] = set()  # (kind, node id) said off

    def fork(
        self,
        kind: str,
        template_env: Mapping[str, str],
        devices: tuple[int, ...],
        lease: Lease | None,
        env: Mapping[str, str],
        start: bool = True,
        request: Request | None = None,
    ) -> RayWorker | None:
        """A worker whose ranks fork from their nodes' templates of a kind (started now on
        every node if they were not and start says so); None when no node's can fork."""
        if kind not in self.kinds:
            if not start:
                return None
            self.prepare(kind, template_env)
        if self.template_state(kind) == "off":
            return None
        return self.start(devices, lease, env, request, kind=kind)

    def prepare(self, kind: str, template_env: Mapping[str, str]) -> None:
        """Start the templates of a kind on every node that can run its workers."""
        if kind in self.kinds:
            return
        size = len(_ids(template_env))
        only = template_env.get("DEVPOOL_COLLECT_ONLY")
        modules = frozenset(Path(only).read_text(encoding="utf-8").split()) if only else None
        entry = RayKind(time.monotonic(), modules)
        self.kinds[kind] = entry
        limit = self.settings.worker_start_timeout
        for node in self.nodes:
            if size and not node.count:
                continue
            # A kind is the devices a job holds in all (size): a nodes(n) job's ranks hold a
            # share each, so a node's template sees at most the node's devices.
            count = min(size, node.count)
            actor = self._templates_on(node.node_id, template_env.get("DEVPOOL_RUN_ID", ""))
            actor.prepare.remote(kind, self._spec(template_env, count, node.count), limit)
            entry.waits[node.node_id] = actor.wait.remote(kind, limit + STOP_WAIT)

    def _templates_on(self, node_id: str, run_id: str) -> Any:
        """This run's NodeTemplates actor on a node (created at its first use)."""
        with self.templates_lock:
            actor = self.node_templates.get(node_id)
            if actor is None:
                ray = import_ray()
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                index = len(self.node_templates)
                name = templates_name(host_name(), run_id or "unknown", index)
                actor = (
                    ray.remote(NodeTemplates)
                    .options(
                        name=name,
                        num_cpus=0,
                        max_concurrency=64,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    )
                    .remote()
                )
                self.node_templates[node_id] = actor
            return actor

    def template_state(self, kind: str) -> str | None:
        """ready from the start, off once every node's template of the kind is off.

        On a cluster a worker's actor takes its devices from Ray before its process starts:
        asked at once, that start overlaps the template's collection, and its rank waits on
        its node for the template (_template_path) instead of waiting for it here."""
        entry = self.kinds.get(kind)
        if entry is None:
            return None
        pending = {ref: node for node, ref in entry.waits.items() if node not in entry.states}
        if pending:
            ray = import_ray()
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in done:
                entry.states[pending[ref]] = self._said(kind, pending[ref], ref)
        states = [state for state, _ in entry.states.values()]
        if len(states) == len(entry.waits) and all(state == "off" for state in states):
            return "off"
        return "ready"

    def _said(self, kind: str, node_id: str, ref: Any) -> tuple[str, str]:
        ray = import_ray()
        try:
            state, said = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - its node went away: nothing forks there
            state, said = "off", f"its node's actor failed: {type(exc).__name__}"
        if state != "ready":
            state = "off"
            self._off(kind, node_id, said)
        return state, said

    def _off(self, kind: str, node_id: str, why: str) -> None:
        """Say once per kind and node why its template does not fork."""
        if (kind, node_id) not in self._noted:
            self._noted.add((kind, node_id))
            self._notes.append(f"fork server for {kind} workers off on node {node_id[:12]}: {why}")

    def template_started(self, kind: str) -> float | None:
        entry = self.kinds.get(kind)
        return None if entry is None else entry.started

    def covers(self, kind: str, modules: frozenset[str]) -> bool:
        entry = self.kinds.get(kind)
        return entry is not None and (entry.modules is None or modules <= entry.modules)

    def discard(self, kind: str) -> None:
        if self.kinds.pop(kind, None) is None:
            return
        for actor in self.node_templates.values():
            with contextlib.suppress(Exception):
                actor.discard.remote(kind)

    def check(self, now: float) -> None:
        """Each node's actor ends a template that has not collected in time."""

    def due(self) -> list[float]:
        return []

    def notes(self) -> list[str]:
        """Why a node's template could not fork, taken once."""
        taken, self._notes = self._notes, []
        return taken

    def culprit(self, kind: str) -> tuple[str, str] | None:
        """None: a node's template that may not fork is off for the run (said in notes)."""
        return None

    def _template_path(self, worker: RayWorker, node_id: str) -> str:
        """The socket path of the node's template of the worker's kind ("": start fresh)."""
        entry = self.kinds.get(worker.kind)
        actor = self.node_templates.get(node_id)
        if not worker.kind or entry is None or actor is None or node_id not in entry.waits:
            return ""
        ray = import_ray()
        try:
            state, said = ray.get(actor.wait.remote(worker.kind, FORK_WAIT))
        except Exception as exc:  # noqa: BLE001 - its node went away: the rank fails there
            state, said = "off", f"{type(exc).__name__}: {exc}"
        if state == "ready":
            return str(said)
        if state == "starting":  # still collecting: this rank does not wait for it longer
            said = f"it has not finished collecting within {FORK_WAIT:g} s"
        else:
            self._off(worker.kind, node_id, said)
        self._note(worker, f"devpool: this node's {worker.kind} template cannot fork: {said}")
        return ""

    def stop_templates(self) -> None:
        """End every node's templates and their actors (at the end of the run)."""
        ray = import_ray()
        stops = []
        for actor in self.node_templates.values():
            with contextlib.suppress(Exception):
                stops.append(actor.stop.remote())
        with contextlib.suppress(Exception):
            ray.wait(stops, num_returns=len(stops), timeout=STOP_WAIT)
        for actor in self.node_templates.values():
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.node_templates.clear()


def _ids(env: Mapping[str, str]) -> list[str]:
    return [part for part in env.get("DEVPOOL_DEVICES", "").split(",") if part]
