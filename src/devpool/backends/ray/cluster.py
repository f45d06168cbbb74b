"""The Ray cluster seen from the controller: joining it, its nodes, and --devices on it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devpool.backends.ray.names import NAMESPACE
from devpool.devices.inventory import Inventory, Platform
from devpool.errors import DevpoolError


def import_ray() -> Any:
    """The ray module; a clear error when the optional extra is not installed."""
    try:
        import ray
    except ImportError:
        raise DevpoolError(
            "--devpool-backend ray needs Ray: pip install '/path/to/devpool[ray]'"
        ) from None
    return ray


def cluster_address(address: str | None) -> str:
    """The address a run joins: --devpool-ray-address, else $RAY_ADDRESS, else "auto" (the
    cluster started on this host)."""
    return address or os.environ.get("RAY_ADDRESS") or "auto"


def connect(address: str | None, runtime_env: Mapping[str, Any] | None = None) -> str:
    """Join the cluster (quietly); the address it was reached at."""
    ray = import_ray()
    target = cluster_address(address)
    if ray.is_initialized():
        return target
    try:
        ray.init(
            address=target,
            namespace=NAMESPACE,
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
    # Every resource the node declares (ray start --resources), named resources included.
    resources: dict[str, float] = field(default_factory=dict)


def alive_nodes(resource: str) -> list[NodeShape]:
    ray = import_ray()
    shapes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        declared = {str(k): float(v) for k, v in node.get("Resources", {}).items()}
        count = int(declared.get(resource, 0))
        shapes.append(NodeShape(node["NodeID"], node["NodeManagerAddress"], count, declared))
    return shapes


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def describe_cluster(nodes: Sequence[NodeShape], resource: str) -> str:
    """'2 nodes with 4 NPU' or '1 node with 4 NPU, 1 node with 2 NPU'."""
    if not nodes:
        return "no alive nodes"
    counts: dict[int, int] = {}
    for node in nodes:
        counts[node.count] = counts.get(node.count, 0) + 1
    return ", ".join(
        f"{plural(n, 'node')} with {count} {resource}"
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
    where = connect(address)
    nodes = alive_nodes(platform.ray_resource)
    total = sum(node.count for node in nodes)
    if total == 0:
        raise DevpoolError(
            f"the Ray cluster at {where} has no {platform.ray_resource} resource for platform "
            f"{platform.name} ({describe_cluster(nodes, platform.ray_resource)}); set "
            f"ray-resource under [tool.devpool.platforms] {platform.name}"
        )
    source = (
        f"ray cluster at {where}: {plural(len(nodes), 'node')}, {total} {platform.ray_resource}"
    )
    return Inventory(platform, tuple(range(total)), source)
