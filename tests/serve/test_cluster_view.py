"""The Ray view's logic without a cluster: which clusters are shown and why, how actors join
runs and tests, placement-group resource names, and a watch that never waits for Ray.
(tests/serve/test_ray_view.py runs it on a real cluster in a browser.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from serving import free_port

from devpool.backends.ray.names import ActorName
from devpool.errors import DevpoolError
from devpool.serve import cluster
from devpool.serve.cluster import Answer, RayWatch


def test_actor_names_round_trip_and_other_names_are_not_devpools() -> None:
    name = ActorName("host-a", "20261201-101010-42", "worker-3", 1)
    assert str(name) == "devpool:host-a:20261201-101010-42:worker-3:1"
    assert ActorName.parse(str(name)) == name
    for other in (None, "", "devpool", "devpool:a:b:c:x", "mine:a:b:c:1", "devpool:a:b:c:1:2"):
        assert ActorName.parse(other) is None, other


def test_clusters_are_shown_once_with_every_reason() -> None:
    live = [
        {"run": "r1", "ray_address": "10.0.0.1:6379"},
        {"run": "r2", "ray_address": None},
        {"run": "r3", "ray_address": "auto"},
    ]
    found = cluster.wanted(["10.0.0.1:6379"], [("proj", "auto")], live)
    assert found == [
        ("10.0.0.1:6379", ["--ray-address", "live run r1"]),
        ("auto", ["project proj: backend = ray", "live run r3"]),
    ]
    assert cluster.wanted([], [], [{"run": "r2", "ray_address": None}]) == []


def test_a_project_on_ray_names_its_cluster_and_others_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "pyproject.toml").write_text('[tool.devpool]\nbackend = "ray"\n')
    assert cluster.configured_address(tmp_path) == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "10.1.1.1:6379")
    assert cluster.configured_address(tmp_path) == "10.1.1.1:6379"
    (tmp_path / "pyproject.toml").write_text('[tool.devpool]\nray-address = "h:1"\n')
    assert cluster.configured_address(tmp_path) is None  # backend local: no cluster
    (tmp_path / "pyproject.toml").write_text('[tool.devpool]\nbackend = "moon"\n')
    assert cluster.configured_address(tmp_path) is None  # the tests view says what's wrong


def _node(node_id: str, head: bool = False, state: str = "ALIVE") -> dict[str, Any]:
    return {
        "node_id": node_id,
        "node_ip": "127.0.0.1",
        "node_name": "127.0.0.1",
        "is_head_node": head,
        "state": state,
        "resources_total": {
            "CPU": 8.0,
            "NPU": 4.0,
            "memory": 2.0**34,
            "node:127.0.0.1": 1.0,
            "NPU_group_abc": 3.0,
            "bundle_group_abc": 1000.0,
        },
    }


def _actor(name: str, node: str, state: str = "ALIVE", **resources: float) -> dict[str, Any]:
    return {
        "actor_id": f"id-{name}",
        "class_name": "RankProcess",
        "name": name,
        "state": state,
        "node_id": node,
        "pid": 77,
        "required_resources": resources,
    }


def test_actors_join_their_runs_tests_and_nodes() -> None:
    run = {
        "run": "R1",
        "page": "/runs/proj/R1",
        "running_tests": [
            {"test": "t.py::test_a", "worker": "worker-1"},
            {"test": "t.py::test_pair", "worker": "worker-2"},
        ],
    }
    group = {"NPU_group_0_abc": 3.0, "NPU_group_abc": 3.0, "bundle_group_0_abc": 0.001}
    actors = [
        _actor("devpool:h:R1:worker-1:0", "n2", NPU=1.0),
        _actor("devpool:h:R1:worker-2:0", "n1", **group),
        _actor("devpool:h:R1:worker-2:1", "", state="PENDING_CREATION", **group),
        _actor("devpool:h:GONE:worker-9:0", "n1", NPU=1.0),  # a run this page does not know
        {**_actor("not-ours", "n1"), "class_name": "Other"},
    ]
    answer = Answer(0.0, 123.0, [_node("n2"), _node("n3", state="DEAD"), _node("n1", True)], actors)
    view = cluster.ray_view([("a:1", ["--ray-address"])], {"a:1": answer}, [run])
    shown = view["clusters"][0]
    assert [n["node_id"] for n in shown["nodes"]] == ["n1", "n2", "n3"]  # head, alive, dead
    n1, n2, n3 = shown["nodes"]
    assert set(n1["resources"]) == {"CPU", "NPU"}  # no Ray markers, sizes or group names
    assert n1["resources"]["NPU"] == {"total": 4.0, "devpool": 4.0}  # 3 (group, once) + 1
    assert [(a["test"], a["rank"]) for a in n1["actors"]] == [
        ("t.py::test_pair", 0),
        (None, 0),  # its run is unknown here: no test, no link
    ]
    assert n1["actors"][1]["page"] is None and n1["actors"][1]["run"] == "GONE"
    assert [a["test"] for a in n2["actors"]] == ["t.py::test_a"]
    assert n2["actors"][0]["page"] == "/runs/proj/R1"
    assert n3["actors"] == [] and n3["state"] == "DEAD"
    assert [(a["rank"], a["state"], a["resources"]) for a in shown["pending"]] == [
        (1, "PENDING_CREATION", {"NPU": 3.0})
    ]
    assert shown["answered"] == 123.0 and shown["problem"] is None


def test_a_cluster_not_answered_yet_or_failing_says_so() -> None:
    failed = Answer(0.0, 5.0, [], [], "Ray's state API at a:1 did not answer: no")
    view = cluster.ray_view([("a:1", ["x"]), ("b:2", ["y"])], {"a:1": failed, "b:2": None}, [])
    first, second = view["clusters"]
    assert (first["problem"], first["nodes"]) == ("Ray's state API at a:1 did not answer: no", [])
    assert (second["answered"], second["problem"]) == (None, None)


def test_the_watch_never_waits_for_ray_and_backs_off_after_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster, "ASK_SECONDS", 0.2)
    monkeypatch.setattr(cluster, "RETRY_SECONDS", 60.0)
    asked: list[str] = []
    gate = threading.Event()

    def ask(address: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        asked.append(address)
        if address == "slow:1":
            gate.wait(10)
            return [_node("n1", True)], []
        raise ConnectionError("refused\nmore lines")

    watch = RayWatch(ask, waiting=lambda address: [])
    began = time.monotonic()
    assert watch.answers(["slow:1", "bad:2"]) == {"slow:1": None, "bad:2": None}
    assert time.monotonic() - began < 0.5  # a slow cluster holds a thread, not the page
    deadline = time.monotonic() + 5
    while (watch.answers(["bad:2"])["bad:2"] is None) and time.monotonic() < deadline:
        time.sleep(0.02)
    bad = watch.answers(["bad:2"])["bad:2"]
    assert bad is not None and bad.problem == "Ray's state API at bad:2 did not answer: refused"
    for _ in range(5):
        watch.answers(["slow:1", "bad:2"])  # asking again and again while one is out
        time.sleep(0.05)
    assert asked.count("slow:1") == 1 and asked.count("bad:2") == 1  # no retry before 60 s
    before = watch.signature(["slow:1"])
    gate.set()
    deadline = time.monotonic() + 5
    while watch.signature(["slow:1"]) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    answer = watch.answers(["slow:1"])["slow:1"]
    assert answer is not None and [n["node_id"] for n in answer.nodes] == ["n1"]


def test_nothing_listening_is_said_at_once_not_after_rays_timeout() -> None:
    pytest.importorskip("ray")
    nobody = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    with pytest.raises(DevpoolError, match="nothing listens there"):
        cluster.ask_state_api(nobody)
    assert time.monotonic() - began < cluster.CONNECT_TIMEOUT + 1
