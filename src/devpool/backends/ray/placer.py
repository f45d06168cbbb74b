"""A Ray job's placement: its rank actors on the cluster, each named for Ray's state API.

One actor for an ordinary test; for `nodes(n)` or `ranks(n)`, a placement group with one
bundle per node (STRICT_SPREAD across nodes, STRICT_PACK on one) and an actor per rank in
its node's bundle. Every wait is bounded by --devpool-lease-timeout and by a stop asked.
"""

from __future__ import annotations

import time
from typing import Any

from devpool.backends.layout import Layout
from devpool.backends.ray.actor import RankProcess
from devpool.backends.ray.cluster import import_ray
from devpool.backends.ray.handle import RankActor, RayWorker
from devpool.backends.ray.names import ActorName
from devpool.config import Settings
from devpool.plan.markers import Request
from devpool.report.record import host_name

CPU_BUNDLE = 0.01  # a multi-node CPU-only test still needs one bundle per node


class Placer:
    """Places one worker's ranks as Ray actors (RayBackend's part, run in its worker's thread)."""

    def __init__(self, settings: Settings, resource: str) -> None:
        self.settings = settings
        self.resource = resource  # the platform's Ray resource ("GPU", or a custom one)

    def _actor_class(self) -> Any:
        ray = import_ray()
        return ray.remote(RankProcess)

    def place(self, worker: RayWorker, request: Request, run_id: str) -> bool:
        """Placement group and actors, bounded by --devpool-lease-timeout; False when not placed.
        Each actor is named for its run, worker and rank (names.py), for Ray's state API."""
        ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        layout = Layout.of(request)
        k, n = layout.per_rank, layout.world
        actor_class = self._actor_class()
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 8}
        named = {name: float(units) for name, units in request.resources}
        if k:
            if self.resource == "GPU":
                options["num_gpus"] = k
            else:
                options["resources"] = {self.resource: k}
        if named:  # held by Ray with the devices, all or nothing, on every node of the test
            options["resources"] = {**options.get("resources", {}), **named}
        deadline = time.monotonic() + self.settings.lease_timeout
        if n > 1:
            # One bundle per node, its ranks' devices together (a ranks(n) test on one node
            # is one bundle: its ranks meet on one host, as torchrun's do).
            per_node = k * layout.per_node
            bundle: dict[str, float] = {self.resource: per_node} if k else {"CPU": CPU_BUNDLE}
            bundle.update(named)
            if not k:
                options["num_cpus"] = CPU_BUNDLE / layout.per_node
            strategy = "STRICT_SPREAD" if layout.nodes > 1 else "STRICT_PACK"
            worker.placement_group = placement_group([bundle] * layout.nodes, strategy=strategy)
            if not self._ready([worker.placement_group.ready()], worker, deadline):
                return False
            for index in range(n):
                strategy_of = PlacementGroupSchedulingStrategy(
                    worker.placement_group, placement_group_bundle_index=layout.node_of(index)
                )
                actor = actor_class.options(
                    name=self._actor_name(worker, run_id, index),
                    scheduling_strategy=strategy_of,
                    **options,
                ).remote()
                worker.ranks.append(RankActor(index, actor))
        else:
            name = self._actor_name(worker, run_id, 0)
            worker.ranks.append(RankActor(0, actor_class.options(name=name, **options).remote()))
        refs = [rank.actor.place.remote() for rank in worker.ranks]
        if not self._ready(refs, worker, deadline):
            return False
        for rank, where in zip(worker.ranks, ray.get(refs), strict=True):
            rank.node_id = where["node_id"]
            rank.address = where["address"]
        worker.placed = True
        return True

    def _actor_name(self, worker: RayWorker, run_id: str, rank: int) -> str:
        return str(ActorName(host_name(), run_id or "unknown", worker.log.stem, rank))

    def _ready(self, refs: list[Any], worker: RayWorker, deadline: float) -> bool:
        ray = import_ray()
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
