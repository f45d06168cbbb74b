"""The thread budget on a Ray node (backends/ray/threads.py), without a cluster: each rank's
share of its own node's cores, as the actor writes it into a worker's or template's
environment (actor.node_env). tests/e2e/test_ray_threads.py shows it on real nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from devpool.backends.ray import threads
from devpool.backends.ray.actor import RankSpec, node_env
from devpool.devices.cores import CGROUP_ROOT_ENV, Cores
from devpool.worker.threads import BUDGET_ENV, THREAD_VARIABLES


def spec(count: int, node_total: int, cpus: int = 0, **env: str) -> RankSpec:
    return RankSpec(
        args=(),
        cwd="/",
        env=dict(env),
        log="",
        platform="sim",
        resource="NPU",
        count=count,
        lock_dir="/nonexistent",
        ship_code=False,
        node_total=node_total,
        cpus=cpus,
        cpu_slots=2,
    )


def test_a_rank_gets_its_devices_share_of_its_nodes_cores() -> None:
    # the node's 8 device tests and 2 CPU slots run at once: 10 shares of its cores
    assert threads.node_share(128, 1, 8, 2) == 12
    assert threads.node_share(128, 4, 8, 2) == 51
    assert threads.node_share(128, 8, 8, 2) == 102
    assert threads.node_share(128, 1, 8, 0) == 16  # no CPU slots: the devices alone
    assert threads.node_share(6, 1, 4, 2) == 1  # 6 × 1 ÷ 6
    assert threads.node_share(2, 1, 8, 2) == 1  # never below one
    assert threads.node_share(16, 8, 4, 2) == 10  # never more devices than the node's


def test_a_cpu_rank_counts_as_one_of_the_devices_tests_and_cpu_slots() -> None:
    assert threads.node_share(128, 0, 8, 8) == 8  # 8 device tests and 8 CPU slots at once
    assert threads.node_share(16, 0, 0, 2) == 8  # a node without devices: the CPU slots
    assert threads.node_share(2, 0, 8, 2) == 1


def test_node_env_sizes_from_this_nodes_cores_not_the_controllers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: Cores(128, 128))
    # What the controller (2 cores) would have said is not there: it sets none on a cluster.
    env = node_env(spec(1, 8), [3], "node")
    assert {env[name] for name in (*THREAD_VARIABLES, BUDGET_ENV)} == {"12"}  # 128 ÷ (8 + 2)
    assert node_env(spec(2, 8), [0, 1], "node")["OMP_NUM_THREADS"] == "25"  # 128 × 2 ÷ 10
    assert node_env(spec(0, 8), [], "node")["OMP_NUM_THREADS"] == "12"  # a CPU test: one share


def test_a_cpus_test_gets_n_and_the_users_variables_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: Cores(128, 128))
    assert node_env(spec(0, 8, cpus=2), [], "node")["OMP_NUM_THREADS"] == "2"
    env = node_env(spec(1, 8, MKL_NUM_THREADS="3"), [0], "node")
    assert env["MKL_NUM_THREADS"] == "3"  # the user's, set on the controller
    assert env["OMP_NUM_THREADS"] == env[BUDGET_ENV] == "12"


def test_the_nodes_cores_are_its_own_affinity_and_cgroup_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one core
    monkeypatch.setenv(CGROUP_ROOT_ENV, str(tmp_path))
    assert node_env(spec(4, 4), [0, 1, 2, 3], "node")["OMP_NUM_THREADS"] == "1"
