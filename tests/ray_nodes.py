"""A two-node Ray cluster on loopback, shared by the Ray end-to-end tests (tests/e2e) and
the host page's Ray view (tests/serve). Importing it skips the importing module without
Ray, except under CI=true, where [ray] must be installed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest

from devpool.devices import leftovers

# Ray reads it when imported: every Ray process of these tests binds to 127.0.0.1 only.
# Set for this process and so for every child session (and their Ray workers) too.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

try:
    import ray  # noqa: F401
    from ray.cluster_utils import Cluster
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("Ray is not installed (pip install -e '.[ray]')", allow_module_level=True)

NODE_NPU = 4
# A named resource every node declares (ray start --resources='{"hccl": 1}'): Ray holds it
# across every run on the cluster, as devpool's resources(hccl=1) asks.
NODE_RESOURCES = {"NPU": NODE_NPU, "hccl": 1}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def two_node_cluster(
    dashboard: bool = False, second_env: Mapping[str, str] | None = None
) -> Iterator[Cluster]:
    """Two Ray nodes on 127.0.0.1, 4 NPU each; stopped through its own API. With
    ``dashboard`` the head serves Ray's dashboard, and so its state API, on a free
    loopback port. ``second_env``: variables of the second node's processes alone (its
    raylet's, so its actors' too), e.g. a cgroup root that gives it fewer cores."""
    head: dict[str, object] = {"num_cpus": 1, "resources": dict(NODE_RESOURCES)}
    head["include_dashboard"] = dashboard  # Ray's default starts it whenever it can
    if dashboard:
        head.update(dashboard_host="127.0.0.1", dashboard_port=_free_port())
    before = {proc.pid for proc in leftovers.descendants(os.getpid())}
    started = Cluster(initialize_head=True, head_node_args=head)
    try:
        extra = {"env_vars": dict(second_env)} if second_env else {}
        started.add_node(num_cpus=1, resources=dict(NODE_RESOURCES), **extra)
        started.wait_for_nodes()
        yield started
    finally:
        started.shutdown()
        _outlived(before)


def _outlived(before: set[int], bound: float = 15.0) -> None:
    """Wait for the cluster's processes to end after its shutdown: the dashboard's module
    processes exit on their own about a second after their head (they are ours to wait for
    where this process reaps orphans, as a devpool worker does; elsewhere init has them)."""
    left = [p for p in leftovers.descendants(os.getpid()) if p.pid not in before]
    leftovers.settled(left, within=bound)
