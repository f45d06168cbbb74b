"""Placer (backends/ray/placer.py): how a Ray job's ranks are asked of the cluster: one actor,
or a placement group with a bundle per node and an actor per rank in its node's bundle; each
wait bounded. Ray itself is a fake that records what it is asked: no cluster here."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from devpool.backends.ray import placer as placer_module
from devpool.backends.ray.names import ActorName
from devpool.backends.ray.placer import CPU_BUNDLE, Placer
from devpool.plan.markers import Request
from devpool.report.record import host_name


class Actor:
    def __init__(self, number: int) -> None:
        self.place = SimpleNamespace(remote=lambda: ("placed", number))


class Ray:
    """ray as Placer uses it; `ready` False: nothing is ever placed."""

    def __init__(self) -> None:
        self.ready = True
        self.actors: list[dict[str, Any]] = []  # each actor's options
        self.groups: list[tuple[list[dict[str, float]], str]] = []

    def remote(self, cls: type) -> Any:
        ray = self

        class ActorClass:
            @staticmethod
            def options(**options: Any) -> Any:
                def remote() -> Actor:
                    ray.actors.append(options)
                    return Actor(len(ray.actors) - 1)

                return SimpleNamespace(remote=remote)

        return ActorClass

    def wait(self, pending: list[Any], num_returns: int, timeout: float) -> tuple[list, list]:
        return (pending, []) if self.ready else ([], pending)

    def get(self, refs: list[Any]) -> list[dict[str, str]]:
        return [{"node_id": f"node-{n}", "address": f"10.0.0.{n}"} for _, n in refs]

    def placement_group(self, bundles: list[dict[str, float]], strategy: str) -> Any:
        self.groups.append((bundles, strategy))
        return SimpleNamespace(ready=lambda: ("placed", -1))


@pytest.fixture
def ray(monkeypatch: pytest.MonkeyPatch) -> Ray:
    ray = Ray()
    groups = ModuleType("ray.util.placement_group")
    groups.placement_group = ray.placement_group  # type: ignore[attr-defined]
    strategies = ModuleType("ray.util.scheduling_strategies")
    strategies.PlacementGroupSchedulingStrategy = (  # type: ignore[attr-defined]
        lambda group, placement_group_bundle_index: ("bundle", placement_group_bundle_index)
    )
    for name, module in (
        ("ray", ModuleType("ray")),
        ("ray.util", ModuleType("ray.util")),
        ("ray.util.placement_group", groups),
        ("ray.util.scheduling_strategies", strategies),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(placer_module, "import_ray", lambda: ray)
    return ray


def _worker() -> Any:
    return SimpleNamespace(
        ranks=[],
        log=Path("/logs/worker-3.log"),
        stop_asked=threading.Event(),
        placement_group=None,
        lost="",
        placed=False,
    )


def _placer(resource: str = "GPU", timeout: float = 60.0) -> Placer:
    return Placer(SimpleNamespace(lease_timeout=timeout), resource)  # type: ignore[arg-type]


def test_an_ordinary_test_is_one_named_actor_holding_its_devices(ray: Ray) -> None:
    worker = _worker()
    assert _placer().place(worker, Request(device_count=2), "run-1")
    assert ray.groups == []
    (options,) = ray.actors
    assert options == {
        "num_cpus": 0,
        "max_concurrency": 8,
        "num_gpus": 2,
        "name": str(ActorName(host_name(), "run-1", "worker-3", 0)),
    }
    assert worker.placed and [(r.rank, r.node_id, r.address) for r in worker.ranks] == [
        (0, "node-0", "10.0.0.0")
    ]


def test_a_custom_resource_and_named_host_resources_are_asked_together(ray: Ray) -> None:
    request = Request(device_count=1, resources=(("licence", 1),))
    assert _placer("NPU").place(_worker(), request, "")
    (options,) = ray.actors
    assert options["resources"] == {"NPU": 1, "licence": 1.0} and "num_gpus" not in options
    assert ":unknown:" in options["name"]  # no run id: still a name devpool can parse


def test_a_multi_node_test_spreads_one_bundle_per_node(ray: Ray) -> None:
    worker = _worker()
    assert _placer("NPU").place(worker, Request(device_count=2, nodes=3), "run-1")
    assert ray.groups == [([{"NPU": 2}] * 3, "STRICT_SPREAD")]
    assert [o["scheduling_strategy"] for o in ray.actors] == [("bundle", i) for i in range(3)]
    assert [o["resources"] for o in ray.actors] == [{"NPU": 2}] * 3
    assert [rank.rank for rank in worker.ranks] == [0, 1, 2]


def test_cpu_ranks_on_one_node_pack_into_one_small_bundle(ray: Ray) -> None:
    worker = _worker()
    request = Request(ranks=4, devices_per_rank=0)
    assert _placer().place(worker, request, "run-1")
    assert ray.groups == [([{"CPU": CPU_BUNDLE}], "STRICT_PACK")]
    assert [o["scheduling_strategy"] for o in ray.actors] == [("bundle", 0)] * 4
    assert {o["num_cpus"] for o in ray.actors} == {CPU_BUNDLE / 4}
    assert not any("num_gpus" in o for o in ray.actors)


def test_ranks_over_nodes_go_to_their_nodes_bundle(ray: Ray) -> None:
    request = Request(device_count=4, ranks=4, nodes=2, devices_per_rank=1)
    assert _placer().place(_worker(), request, "run-1")
    assert ray.groups == [([{"GPU": 2}] * 2, "STRICT_SPREAD")]
    assert [o["scheduling_strategy"][1] for o in ray.actors] == [0, 0, 1, 1]
    assert {o["num_gpus"] for o in ray.actors} == {1}


def test_a_placement_past_the_lease_timeout_is_lost_with_its_reason(ray: Ray) -> None:
    ray.ready = False
    worker = _worker()
    assert not _placer(timeout=0.0).place(worker, Request(device_count=1), "run-1")
    assert worker.lost == "no Ray placement within --devpool-lease-timeout 0 s"
    assert not worker.placed


def test_a_stop_asked_ends_the_wait_without_a_loss(ray: Ray) -> None:
    ray.ready = False
    worker = _worker()
    worker.stop_asked.set()
    assert not _placer().place(worker, Request(device_count=1, nodes=2), "run-1")
    assert worker.lost == "" and ray.actors == []  # the group never came: no actor asked
